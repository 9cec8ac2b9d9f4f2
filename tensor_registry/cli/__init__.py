"""The `tensor-registry` command: one module per command group (``*_commands.py``) and what
they share (flags, running a command, output)."""
