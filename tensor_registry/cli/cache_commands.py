"""`tensor-registry cache ls | prune | rm`: this node's download cache, local (no registry call).

`--json` prints the same fields as the table.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry.cli.flags import command_group, json_flag
from tensor_registry.cli.output import (
    format_size,
    format_time,
    parse_size,
    print_json,
    print_table,
    say,
)
from tensor_registry.cli.runner import with_node_cache
from tensor_registry.node_cache import NodeCache

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    as_json = json_flag()
    cache = command_group(sub, "cache", "this node's download cache (objects kept by sha256)")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--cache-dir",
        type=Path,
        help="default: $TENSOR_REGISTRY_CACHE_DIR, else ~/.cache/tensor-registry",
    )
    ls = cache.add_parser("ls", parents=[where, as_json], help="cached objects, newest use first")
    ls.set_defaults(func=with_node_cache(cmd_cache_ls))
    prune = cache.add_parser(
        "prune",
        parents=[where, as_json],
        help="remove least recently used objects down to a size",
    )
    prune.add_argument(
        "--max-size", required=True, metavar="SIZE", help="e.g. 50GB, 500MB, 1.5GiB, 0"
    )
    prune.set_defaults(func=with_node_cache(cmd_cache_prune))
    rm = cache.add_parser("rm", parents=[where], help="remove objects by sha256 (or prefix)")
    rm.add_argument("sha256", nargs="+", metavar="SHA256")
    rm.set_defaults(func=with_node_cache(cmd_cache_rm))


def _cache_rows(entries: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "sha256": e.sha256,
            "size": e.size,
            "last_used": datetime.fromtimestamp(e.last_used, UTC).isoformat(),
            "links": e.links,
        }
        for e in entries
    ]


def cmd_cache_ls(args: argparse.Namespace, cache: NodeCache) -> int:
    entries = cache.entries()
    if args.json:
        print_json({"root": str(cache.root), "objects": _cache_rows(entries)})
        return 0
    print_table(
        ["SHA256", "SIZE", "LAST USED", "LINKS"],
        [
            [e.sha256, format_size(e.size), format_time(row["last_used"]), e.links]
            for e, row in zip(entries, _cache_rows(entries), strict=True)
        ],
    )
    say(f"{len(entries)} object(s), {format_size(sum(e.size for e in entries))} in {cache.root}")
    return 0


def cmd_cache_prune(args: argparse.Namespace, cache: NodeCache) -> int:
    limit = parse_size(args.max_size)
    removed = cache.prune(limit)
    left = cache.entries()
    if args.json:
        print_json({"removed": _cache_rows(removed), "size": sum(e.size for e in left)})
        return 0
    for entry in removed:
        print(f"removed {entry.sha256} ({format_size(entry.size)})")
    say(
        f"removed {len(removed)} object(s), {format_size(sum(e.size for e in removed))}; "
        f"{format_size(sum(e.size for e in left))} left (limit {format_size(limit)})"
    )
    return 0


def cmd_cache_rm(args: argparse.Namespace, cache: NodeCache) -> int:
    for digest in args.sha256:
        entry = cache.remove(digest)
        print(f"removed {entry.sha256} ({format_size(entry.size)})")
    return 0
