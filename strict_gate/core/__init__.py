"""The foundations every wing stands on: atomic files, redaction, option types, engine logs, model files."""
