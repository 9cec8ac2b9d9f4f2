"""`tensor-registry agent --watch NS/NAME:REF …`: keep this node's cache warm for those refs.

Runs until stopped (SIGTERM/SIGINT, exit 0); one line on stderr per thing it does. The loop
and its choices: tensor_registry/agent/agent.py; deploy/tensor-registry-agent.service is a
systemd unit for it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tensor_registry.agent.agent import Agent, Stopped, Watch, install_signal_handlers
from tensor_registry.api.client import RegistryClient
from tensor_registry.api.download import DEFAULT_READERS
from tensor_registry.cli.flags import (
    UsageError,
    add_variant_flags,
    connection_parser,
    model_ref,
    variant_filters,
)
from tensor_registry.cli.output import parse_size
from tensor_registry.cli.runner import with_registry
from tensor_registry.node_cache import NodeCache

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    agent = sub.add_parser(
        "agent",
        parents=[connection_parser()],
        help="follow the registry's events and pre-pull watched refs into the node cache",
        description="Follows GET /api/v1/events (polling with backoff while the stream is "
        "down); when a watched ref moves, pre-pulls the variant the flags select into the "
        "node cache (signed manifest and sha256 verified, one download per artifact per node, "
        "within --max-cache-size). Resumes from the last event it handled after a restart.",
    )
    agent.add_argument(
        "--watch",
        action="append",
        required=True,
        metavar="NS/NAME:REF",
        help="a ref to keep warm (repeatable); REF defaults to latest",
    )
    add_variant_flags(agent)
    agent.add_argument("--cache-dir", type=Path, help="node cache (default: ~/.cache/...)")
    agent.add_argument(
        "--state-dir",
        type=Path,
        help="where the last event id and warm state are kept (default: CACHE/agent)",
    )
    agent.add_argument(
        "--max-cache-size",
        metavar="SIZE",
        help="disk budget of the cache, e.g. 500GB (default: none)",
    )
    agent.add_argument(
        "--readers", type=int, default=DEFAULT_READERS, help="parallel range readers per file"
    )
    agent.add_argument(
        "--max-backoff",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait between polls while the event stream is down (default 60)",
    )
    agent.add_argument(
        "--node-id",
        help="this node's id in check-ins (default: $TENSOR_REGISTRY_NODE_ID, else made once and "
        "kept in the cache dir as node-id, the id load, pull and the vLLM plugin report too); "
        "TENSOR_REGISTRY_NO_CHECKIN=1 stops check-ins",
    )
    agent.set_defaults(func=with_registry(cmd_agent))


def _report(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} agent: {line}", file=sys.stderr, flush=True)


def cmd_agent(args: argparse.Namespace, client: RegistryClient) -> int:
    filters = {k: v for k, v in variant_filters(args).items() if v is not None}
    watches = []
    for text in args.watch:
        name, ref = model_ref(text)
        watches.append(Watch(name, ref, filters))
    try:
        budget = parse_size(args.max_cache_size) if args.max_cache_size else None
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    cache = NodeCache(args.cache_dir)
    stop = threading.Event()
    install_signal_handlers(stop)
    agent = Agent(
        client,
        cache,
        watches,
        state_dir=args.state_dir or cache.root / "agent",
        max_cache_bytes=budget,
        readers=args.readers,
        max_backoff=args.max_backoff,
        node_id=args.node_id,
        stop=stop,
        report=_report,
    )
    _report(f"watching {', '.join(w.label for w in watches)} on {client.url}")
    with contextlib.suppress(Stopped):
        agent.run()
    _report("stopped")
    return 0
