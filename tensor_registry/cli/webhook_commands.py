"""`tensor-registry webhooks ls | create | show | enable | disable | rm | deliveries |
redeliver`: what `/api/v1/webhooks` offers, so nobody copies a delivery id by hand
(docs/events.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import command_group, confirm, connection_parser, json_flag, yes_flag
from tensor_registry.cli.output import (
    format_time,
    one_line,
    print_fields,
    print_json,
    print_table,
    say,
)
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

BASE = "/api/v1/webhooks"


def register(sub: SubParsers) -> None:
    common, as_json, yes = connection_parser(), json_flag(), yes_flag()
    hooks = command_group(sub, "webhooks", "list, create, show and delete webhooks; deliveries")
    ls = hooks.add_parser("ls", parents=[common, as_json], help="the webhooks the token sees")
    ls.set_defaults(func=with_registry(cmd_ls))
    create = hooks.add_parser(
        "create",
        parents=[common, as_json],
        help="a webhook of NAMESPACE posting to URL; prints its secret, shown only this once",
    )
    create.add_argument("namespace", metavar="NAMESPACE")
    # Not `url`: that is --url, the registry's.
    create.add_argument("receiver_url", metavar="URL")
    create.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="TYPE",
        help="an event type to receive (repeatable; none: every type)",
    )
    create.add_argument("--description", default="")
    create.set_defaults(func=with_registry(cmd_create))
    show = hooks.add_parser("show", parents=[common, as_json], help="one webhook")
    show.add_argument("webhook_id", metavar="WEBHOOK_ID")
    show.set_defaults(func=with_registry(cmd_show))
    for verb, help_text in (
        ("enable", "enable a webhook again (one disabled by hand or after failures)"),
        ("disable", "stop a webhook's deliveries, keeping it and its log"),
    ):
        toggle = hooks.add_parser(verb, parents=[common, as_json], help=help_text)
        toggle.add_argument("webhook_id", metavar="WEBHOOK_ID")
        toggle.set_defaults(func=with_registry(cmd_enable), enabled=verb == "enable")
    rm = hooks.add_parser("rm", parents=[common, yes], help="delete a webhook")
    rm.add_argument("webhook_id", metavar="WEBHOOK_ID")
    rm.set_defaults(func=with_registry(cmd_rm))
    deliveries = hooks.add_parser(
        "deliveries", parents=[common, as_json], help="a webhook's deliveries, newest first"
    )
    deliveries.add_argument("webhook_id", metavar="WEBHOOK_ID")
    deliveries.add_argument("--status", choices=["pending", "succeeded", "failed"])
    deliveries.add_argument("--limit", type=int, default=50)
    deliveries.set_defaults(func=with_registry(cmd_deliveries))
    again = hooks.add_parser(
        "redeliver",
        parents=[common, as_json],
        help="send a delivery again (the same webhook-id: receivers deduplicate on it)",
    )
    again.add_argument("webhook_id", metavar="WEBHOOK_ID")
    again.add_argument("delivery_id", metavar="DELIVERY_ID")
    again.set_defaults(func=with_registry(cmd_redeliver))


def _state(hook: dict[str, Any]) -> str:
    if hook["enabled"]:
        return "enabled"
    return f"disabled: {hook['disabled_reason']}" if hook.get("disabled_reason") else "disabled"


def _events(hook: dict[str, Any]) -> str:
    return ",".join(hook["events"]) or "all"


def cmd_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    items = client.paged(BASE)
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "NAMESPACE", "URL", "EVENTS", "STATE", "FAILURES"],
        [
            [h["id"], h["namespace"], h["url"], _events(h), _state(h), h["consecutive_failures"]]
            for h in items
        ],
    )
    return 0


def _print_hook(hook: dict[str, Any]) -> None:
    print_fields(
        [
            ("id", hook["id"]),
            ("namespace", hook["namespace"]),
            ("url", hook["url"]),
            ("events", _events(hook)),
            ("description", hook.get("description") or None),
            ("state", _state(hook)),
            ("failures", hook["consecutive_failures"]),
            ("created", format_time(hook["created_at"])),
            ("updated", format_time(hook["updated_at"])),
        ]
    )


def cmd_create(args: argparse.Namespace, client: RegistryClient) -> int:
    body = {
        "namespace": args.namespace,
        "url": args.receiver_url,
        "events": args.event,
        "description": args.description,
    }
    hook = client.json("POST", BASE, json=body)
    if args.json:
        print_json(hook)
        return 0
    _print_hook(hook)
    print(f"secret:      {hook['secret']}")
    say("the secret is shown only this once: give it to the receiver now")
    return 0


def cmd_show(args: argparse.Namespace, client: RegistryClient) -> int:
    hook = client.json("GET", f"{BASE}/{args.webhook_id}")
    if args.json:
        print_json(hook)
    else:
        _print_hook(hook)
    return 0


def cmd_enable(args: argparse.Namespace, client: RegistryClient) -> int:
    """Enabling starts the failure count again; what was recorded while it was off (pending
    deliveries) goes out then (docs/events.md)."""
    hook = client.json("PATCH", f"{BASE}/{args.webhook_id}", json={"enabled": args.enabled})
    if args.json:
        print_json(hook)
    else:
        print(f"webhook {hook['id']}: {_state(hook)}")
    return 0


def cmd_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    confirm(args, f"webhook {args.webhook_id}")
    client.request("DELETE", f"{BASE}/{args.webhook_id}")
    print(f"deleted webhook {args.webhook_id}")
    return 0


def _delivery_row(d: dict[str, Any]) -> list[Any]:
    outcome = d.get("last_status_code") or (
        one_line(d["last_error"]) if d.get("last_error") else None
    )
    return [
        d["id"],
        d["event_id"],
        d["event_type"],
        d["status"],
        d["attempts"],
        outcome,
        format_time(d.get("delivered_at") or d.get("next_attempt_at") or d["created_at"]),
    ]


DELIVERY_HEADERS = ["ID", "EVENT", "TYPE", "STATUS", "ATTEMPTS", "LAST", "AT"]


def cmd_deliveries(args: argparse.Namespace, client: RegistryClient) -> int:
    items = client.paged(
        f"{BASE}/{args.webhook_id}/deliveries", {"status": args.status}, limit=args.limit
    )
    if args.json:
        print_json(items)
        return 0
    print_table(DELIVERY_HEADERS, [_delivery_row(d) for d in items])
    return 0


def cmd_redeliver(args: argparse.Namespace, client: RegistryClient) -> int:
    path = f"{BASE}/{args.webhook_id}/deliveries/{args.delivery_id}/redeliver"
    delivery = client.json("POST", path)
    if args.json:
        print_json(delivery)
        return 0
    print_table(DELIVERY_HEADERS, [_delivery_row(delivery)])
    return 0
