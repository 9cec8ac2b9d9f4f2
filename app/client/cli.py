"""`tensor-registry`: one entry point for client commands and (when installed) server commands.

`--help` and every client command must start fast on a serving node: nothing imported here (or
by the client command modules at import time) may pull in FastAPI, SQLAlchemy, Celery or torch.
Server commands are added only when the server's packages are installed, and `app.server_cli`
keeps its heavy imports inside the commands (tests/client/test_light_install.py checks both).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

from app import __version__

# Client command modules, each with `register(subparsers)`, in the order `--help` lists their
# commands. A new module registers here.
CLIENT_COMMAND_MODULES = (
    "app.client.publish_commands",
    "app.client.tensorize_commands",
    "app.client.resolve_commands",
    "app.client.pull_commands",
    "app.client.login_commands",
    "app.client.model_commands",
    "app.client.version_commands",
    "app.client.alias_commands",
    "app.client.artifact_commands",
    "app.client.job_commands",
    "app.client.token_commands",
    "app.client.cache_commands",
    "app.client.completion",
    "app.client.load_commands",
    "app.client.trust_commands",
)
# What a serving node lacks: with it missing, the server commands are not offered.
SERVER_PACKAGE = "uvicorn"


def _server_installed() -> bool:
    try:
        return importlib.util.find_spec(SERVER_PACKAGE) is not None
    except (ImportError, ValueError):
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensor-registry",
        description="Model registry for tensorizer-serialized LLM weights.",
    )
    parser.add_argument("--version", action="version", version=f"tensor-registry {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in CLIENT_COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    if _server_installed():
        from app import server_cli

        server_cli.register(sub)
    return parser


def _quiet_broken_pipe() -> int:
    """`tensor-registry resolve | head`: the reader left; stop without a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # what a shell reports for a writer ended by SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return _quiet_broken_pipe()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
