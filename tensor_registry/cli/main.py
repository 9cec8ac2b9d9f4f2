"""`tensor-registry`: one entry point for client commands and (when installed) server commands.

`--help` and every client command must start fast on a serving node: nothing imported here (or
by the client command modules at import time) may pull in FastAPI, SQLAlchemy, Celery or torch.
The library never imports the server: the server's distribution (tensor-registry-server)
adds its commands through the ``tensor_registry.commands`` entry point group (each entry a
``register(subparsers)``), so a node's install offers client commands only, and an unrelated
package named ``app`` on a node is never imported (tests/client/test_light_install.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from tensor_registry.version import __version__

# Client command modules, each with `register(subparsers)`, in the order `--help` lists their
# commands. A new module registers here.
CLIENT_COMMAND_MODULES = (
    "tensor_registry.cli.publish_commands",
    "tensor_registry.cli.tensorize_commands",
    "tensor_registry.cli.resolve_commands",
    "tensor_registry.cli.pull_commands",
    "tensor_registry.cli.login_commands",
    "tensor_registry.cli.model_commands",
    "tensor_registry.cli.version_commands",
    "tensor_registry.cli.alias_commands",
    "tensor_registry.cli.artifact_commands",
    "tensor_registry.cli.job_commands",
    "tensor_registry.cli.token_commands",
    "tensor_registry.cli.cache_commands",
    "tensor_registry.cli.completion",
    "tensor_registry.cli.load_commands",
    "tensor_registry.cli.trust_commands",
    "tensor_registry.cli.agent_commands",
    "tensor_registry.cli.webhook_commands",
    "tensor_registry.cli.event_commands",
    "tensor_registry.cli.node_commands",
)
# Other distributions add commands here (the server: serve, worker, migrate, ...).
COMMANDS_ENTRY_POINTS = "tensor_registry.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensor-registry",
        description="Model registry for tensorizer-serialized LLM weights.",
    )
    parser.add_argument("--version", action="version", version=f"tensor-registry {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in CLIENT_COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for point in entry_points(group=COMMANDS_ENTRY_POINTS):
        point.load()(sub)
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
