"""`tensor-registry`: one entry point for client commands and (when installed) server commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensor-registry",
        description="Model registry for tensorizer-serialized LLM weights.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from app.client.commands import register as register_client_commands

    register_client_commands(sub)
    from app.client.load_commands import register as register_load_commands

    register_load_commands(sub)
    from app.client.trust_commands import register as register_trust_commands

    register_trust_commands(sub)
    try:
        from app import server_cli
    except ImportError:
        # A serving node with only the client installed has no server commands.
        return parser
    server_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
