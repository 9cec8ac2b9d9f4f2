"""`tensor-registry events follow`: the registry's event stream (`GET /api/v1/events`, SSE) as
one line per event, or one JSON object per line with --json; resumable with --after ID."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import command_group, connection_parser, json_flag
from tensor_registry.cli.output import format_time, say
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    common, as_json = connection_parser(), json_flag()
    events = command_group(sub, "events", "follow the registry's events")
    follow = events.add_parser(
        "follow",
        parents=[common, as_json],
        help="print each event of the token's namespaces as it happens (Ctrl-C stops)",
    )
    follow.add_argument(
        "--after",
        metavar="EVENT_ID",
        help="replay every event after this id first (default: only new ones)",
    )
    follow.add_argument(
        "--type",
        action="append",
        default=[],
        metavar="TYPE",
        help="keep only this type (repeatable)",
    )
    follow.add_argument("--count", type=int, default=None, metavar="N", help="stop after N events")
    follow.set_defaults(func=with_registry(cmd_follow))


def describe(event: dict[str, Any]) -> str:
    """`alias.moved acme/llama alias=prod 1 -> 2`-like: the type, then the data's telling
    fields (whatever of them this type carries)."""
    data = event.get("data") or {}
    parts = [str(event.get("type")), str(data.get("model") or event.get("namespace") or "")]
    for key in ("alias", "version", "artifact_id", "job_id", "webhook_id"):
        if data.get(key) is not None:
            parts.append(f"{key}={data[key]}")
    if "to_version" in data:
        parts.append(f"{data.get('from_version') or '-'} -> {data['to_version']}")
    return " ".join(p for p in parts if p)


def cmd_follow(args: argparse.Namespace, client: RegistryClient) -> int:
    seen = 0
    for event in client.events(last_event_id=args.after, types=args.type):
        if "type" not in event:
            say(f"following events after id {event.get('id')} (Ctrl-C stops)")
            continue
        if args.json:
            print(json.dumps(event), flush=True)
        else:
            stamp = format_time(event.get("timestamp"))
            print(f"{event['id']}  {stamp}  {describe(event)}", flush=True)
        seen += 1
        if args.count is not None and seen >= args.count:
            break
    return 0
