"""Binaries speaking strict-gate/engine@1 (docs/engine-protocol.md): the engine, the child process, replies, stream events."""
