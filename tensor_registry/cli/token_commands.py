"""`tensor-registry tokens create | ls | revoke`: API tokens."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import command_group, connection_parser, json_flag
from tensor_registry.cli.output import format_time, print_json, print_table, say
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    common, as_json = connection_parser(), json_flag()
    tokens = command_group(sub, "tokens", "create, list and revoke API tokens")
    create = tokens.add_parser(
        "create",
        parents=[common, as_json],
        help="mint a token (prints the secret once, on stdout)",
    )
    create.add_argument("--name", required=True)
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        help="models:read, models:write, tensorize, resolve, keys:read, tokens:write, admin; "
        "repeat for several",
    )
    create.add_argument("--namespace", action="append", help="limit to it; repeat for several")
    create.add_argument("--ttl", type=int, metavar="SECONDS", help="expire after this long")
    create.set_defaults(func=with_registry(cmd_tokens_create))
    ls = tokens.add_parser("ls", parents=[common, as_json], help="tokens you can see")
    ls.set_defaults(func=with_registry(cmd_tokens_ls))
    revoke = tokens.add_parser("revoke", parents=[common], help="revoke a token")
    revoke.add_argument("token_id", metavar="TOKEN_ID")
    revoke.set_defaults(func=with_registry(cmd_tokens_revoke))


def cmd_tokens_create(args: argparse.Namespace, client: RegistryClient) -> int:
    body: dict[str, Any] = {"name": args.name, "scopes": args.scope}
    if args.namespace:
        body["namespaces"] = args.namespace
    if args.ttl is not None:
        body["ttl_seconds"] = args.ttl
    created = client.create_token(body)
    if args.json:
        print_json(created)
        return 0
    say(
        f"token '{created['name']}' ({created['id']}), scopes {', '.join(created['scopes'])}, "
        f"expires {format_time(created['expires_at']) if created['expires_at'] else 'never'}; "
        "the secret below is shown only now"
    )
    print(created["token"])
    return 0


def cmd_tokens_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    items = client.list_tokens()
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "NAME", "PREFIX", "SCOPES", "NAMESPACES", "EXPIRES", "STATE"],
        [
            [
                t["id"],
                t["name"],
                t["prefix"],
                ",".join(t["scopes"]),
                ",".join(t["namespaces"] or []) or "all",
                format_time(t["expires_at"]) if t["expires_at"] else "never",
                "revoked" if t.get("revoked_at") else "active",
            ]
            for t in items
        ],
    )
    return 0


def cmd_tokens_revoke(args: argparse.Namespace, client: RegistryClient) -> int:
    client.revoke_token(args.token_id)
    print(f"revoked token {args.token_id}")
    return 0
