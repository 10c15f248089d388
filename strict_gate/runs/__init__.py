"""Runs on disk: prompt sets, the record format, its reader and its audit, staged run directories."""
