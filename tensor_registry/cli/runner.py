"""How a `tensor-registry` command runs: connected to the registry (or on the node cache), its
errors turned into exit codes and one line on stderr.

Exit codes: 0 success, 1 an error (one line on stderr: what happened and the registry's stable
``code``; a refused finalize adds one line per problem), 2 a usage error (argparse), 130
interrupted, 141 stdout closed by its reader (`| head`; nothing printed about it). Progress
bars go to stderr and only on a terminal; stdout carries results (JSON, the `vllm serve`
command) so that they can be piped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from tensor_registry.api.client import RegistryClient, RegistryError
from tensor_registry.cli.flags import UsageError
from tensor_registry.cli.output import one_line
from tensor_registry.config import connection
from tensor_registry.formats.paths import UnsafePath
from tensor_registry.node_cache import NodeCache

Command = Callable[[argparse.Namespace, RegistryClient], int]


def _print_problems(exc: RegistryError) -> None:
    """The per-file findings of a refused finalize/import (`problems` of the problem body)."""
    for problem in exc.problem.get("problems") or []:
        if isinstance(problem, dict):
            where = problem.get("path") or "(version)"
            print(
                f"  {where}: {one_line(str(problem.get('message') or ''))} "
                f"({problem.get('code') or 'problem'})",
                file=sys.stderr,
            )


def with_registry(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run ``command`` with a client for --url/--token (else the environment, else `login`)."""

    def run(args: argparse.Namespace) -> int:
        try:
            conn = connection(getattr(args, "url", None), getattr(args, "token", None))
            args.token_source = conn.token_source
            with RegistryClient(conn.url, conn.token or "") as client:
                return command(args, client)
        except UsageError as exc:
            print(f"usage error: {one_line(str(exc))}", file=sys.stderr)
            return 2
        except RegistryError as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            _print_problems(exc)
            return 1
        except UnsafePath as exc:
            # A path from the registry that would leave the destination: refused, nothing written.
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            raise  # the reader of stdout left: main() ends quietly
        except OSError as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return run


def with_node_cache(command: Callable[[argparse.Namespace, NodeCache], int]) -> Any:
    """Run ``command`` on this node's cache (--cache-dir): local, no registry call."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args, NodeCache(args.cache_dir))
        except ValueError as exc:
            print(f"usage error: {one_line(str(exc))}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            return 1

    return run
