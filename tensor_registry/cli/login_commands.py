"""`tensor-registry login | logout | whoami`: the token (and URL) later commands use."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import TYPE_CHECKING

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import UsageError, connection_parser, json_flag
from tensor_registry.cli.output import format_time, print_fields, print_json, say
from tensor_registry.cli.runner import with_registry
from tensor_registry.cli.sso_login import sso_login
from tensor_registry.config import config_path, forget_login, read_config, write_config

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    common, as_json = connection_parser(), json_flag()
    login = sub.add_parser(
        "login",
        parents=[common],
        help="check a token and store it (and the URL) for later commands",
        description="Verifies the token with the registry, then stores it with the URL in "
        f"{config_path()} (mode 0600). The token is read from a prompt, or from stdin when "
        "stdin is not a terminal (`echo $T | tensor-registry login`); --token works too but "
        "leaves the secret in your shell history. --token and TENSOR_REGISTRY_TOKEN still win "
        "over the stored token.",
    )
    login.add_argument(
        "--sso",
        action="store_true",
        help="sign in with your organisation's identity provider in a browser (a loopback "
        "listener on 127.0.0.1 takes the answer); stores the session token it gives",
    )
    login.add_argument(
        "--no-browser",
        action="store_true",
        help="with --sso: print the sign-in address instead of opening a browser",
    )
    login.set_defaults(func=with_registry(cmd_login))
    logout = sub.add_parser("logout", help="forget the stored token")
    logout.set_defaults(func=cmd_logout)
    whoami = sub.add_parser(
        "whoami", parents=[common, as_json], help="the token in use: name, scopes, expiry"
    )
    whoami.set_defaults(func=with_registry(cmd_whoami))


def _read_token() -> str:
    if sys.stdin.isatty():
        return getpass.getpass("Token: ").strip()
    return sys.stdin.readline().strip()


def cmd_login(args: argparse.Namespace, client: RegistryClient) -> int:
    if args.sso:
        token = sso_login(client, open_browser=not args.no_browser)
    else:
        token = args.token or _read_token()
    if not token:
        raise UsageError("no token given")
    with RegistryClient(client.url, token) as checked:
        me = checked.token_self()
    path = write_config({**read_config(), "url": client.url, "token": token})
    say(f"logged in to {client.url} as token '{me['name']}' ({', '.join(me['scopes'])})")
    say(f"token stored in {path} (mode 0600)")
    if os.environ.get("TENSOR_REGISTRY_TOKEN"):
        say("note: TENSOR_REGISTRY_TOKEN is set and wins over the stored token")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    if forget_login():
        say(f"removed the stored token from {config_path()}")
    else:
        say("no stored token")
    if os.environ.get("TENSOR_REGISTRY_TOKEN"):
        say("note: TENSOR_REGISTRY_TOKEN is still set in this environment")
    return 0


def cmd_whoami(args: argparse.Namespace, client: RegistryClient) -> int:
    me = client.token_self()
    if args.json:
        print_json({**me, "url": client.url, "token_source": args.token_source})
        return 0
    print_fields(
        [
            ("url", client.url),
            ("token", f"{me['name']} ({me['prefix']}…, id {me['id']})"),
            ("from", args.token_source),
            ("scopes", me["scopes"]),
            ("namespaces", me["namespaces"] or "all"),
            ("expires", format_time(me["expires_at"]) if me["expires_at"] else "never"),
            ("last used", format_time(me.get("last_used_at"))),
        ]
    )
    return 0
