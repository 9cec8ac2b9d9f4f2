"""`tensor-registry nodes ls | show`: the serving nodes that checked in (`GET /api/v1/nodes`):
what each watches, has cached, and its recent loads and pulls."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.api.errors import NotFound
from tensor_registry.cli.flags import command_group, connection_parser, json_flag
from tensor_registry.cli.output import (
    format_time,
    one_line,
    print_fields,
    print_json,
    print_table,
)
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

BASE = "/api/v1/nodes"


def register(sub: SubParsers) -> None:
    common, as_json = connection_parser(), json_flag()
    nodes = command_group(sub, "nodes", "the serving nodes that checked in")
    ls = nodes.add_parser("ls", parents=[common, as_json], help="nodes, live first")
    ls.add_argument(
        "--all", action="store_true", help="also nodes that stopped checking in (stale)"
    )
    ls.set_defaults(func=with_registry(cmd_ls))
    show = nodes.add_parser(
        "show", parents=[common, as_json], help="one node: watches, cache, recent loads"
    )
    show.add_argument("node_id", metavar="NODE_ID")
    show.set_defaults(func=with_registry(cmd_show))


def role(node: dict[str, Any]) -> str:
    """What the node runs: an agent watches; a node that only loaded or pulled does not."""
    if node.get("watches"):
        return "agent"
    kinds = sorted(
        {str(entry.get("by") or entry.get("path")) for entry in node.get("loaded") or []}
    )
    return ",".join(kinds) if kinds else "-"


def _gpus(node: dict[str, Any]) -> str:
    gpus = node.get("gpus") or []
    if not gpus:
        return "-"
    names = sorted({str(g.get("name")) for g in gpus})
    return f"{len(gpus)}x {'/'.join(names)}"


def cmd_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    items = client.paged(BASE, {"include_stale": "true" if args.all else None})
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "HOSTNAME", "STATUS", "RUNS", "WATCHES", "CACHED", "LOADS", "GPUS", "LAST SEEN"],
        [
            [
                n["id"],
                n["hostname"],
                n["status"],
                role(n),
                len(n.get("watches") or []),
                len(n.get("cached") or []),
                len(n.get("loaded") or []),
                _gpus(n),
                format_time(n["last_seen_at"]),
            ]
            for n in items
        ],
    )
    return 0


def _load_row(entry: dict[str, Any]) -> list[Any]:
    gbps = entry.get("gbps")
    what = f"{entry.get('model') or '-'}:{entry.get('ref') or entry.get('version') or '-'}"
    outcome = (
        one_line(entry["error"])
        if entry.get("error")
        else ("verified" if entry.get("verified") else "not verified")
    )
    return [
        entry.get("by") or "-",
        what,
        entry.get("path"),
        f"{entry.get('seconds', 0):.2f}",
        "-" if gbps is None else f"{gbps:.2f}",
        outcome,
    ]


def cmd_show(args: argparse.Namespace, client: RegistryClient) -> int:
    found = [n for n in client.paged(BASE, {"include_stale": "true"}) if n["id"] == args.node_id]
    if not found:
        raise NotFound(f"no node {args.node_id!r} that this token may see")
    node = found[0]
    if args.json:
        print_json(node)
        return 0
    print_fields(
        [
            ("id", node["id"]),
            ("hostname", node["hostname"]),
            ("status", node["status"]),
            ("runs", role(node)),
            ("agent version", node.get("agent_version") or None),
            ("gpus", _gpus(node)),
            ("cached", f"{len(node.get('cached') or [])} artifacts"),
            ("first seen", format_time(node["first_seen_at"])),
            ("last seen", format_time(node["last_seen_at"])),
        ]
    )
    watches = node.get("watches") or []
    if watches:
        print()
        print_table(
            ["WATCHES", "STATE", "VERSION", "ARTIFACT", "ERROR"],
            [
                [
                    f"{w.get('model')}:{w.get('ref')}",
                    w.get("state"),
                    w.get("version"),
                    w.get("artifact_id"),
                    one_line(w["error"]) if w.get("error") else None,
                ]
                for w in watches
            ],
        )
    loaded = node.get("loaded") or []
    if loaded:
        print()
        print_table(
            ["BY", "WHAT", "PATH", "SECONDS", "GB/S", "OUTCOME"], [_load_row(e) for e in loaded]
        )
    return 0
