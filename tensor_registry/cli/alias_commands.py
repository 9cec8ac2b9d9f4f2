"""`tensor-registry alias set | ls | history | rm`: moving aliases (prod, staging, ...) safely.

`alias set` moves with If-Match on the alias's ETag and retries when another writer won the
race, unless --expect pins the version it must still point at.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import (
    AliasNotFound,
    PreconditionFailed,
    RegistryClient,
    RegistryError,
)
from tensor_registry.cli.flags import (
    UsageError,
    command_group,
    connection_parser,
    json_flag,
    model_only,
)
from tensor_registry.cli.output import format_time, print_json, print_table, progress_bar, say
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

# `alias set` re-reads and retries this often when another writer moved the alias in between.
ALIAS_SET_ATTEMPTS = 3


def register(sub: SubParsers) -> None:
    common, as_json = connection_parser(), json_flag()
    alias = command_group(sub, "alias", "move, list and delete aliases (prod, staging, ...)")
    set_ = alias.add_parser(
        "set",
        parents=[common, as_json],
        help="point an alias at a version",
        description="Reads the alias (its ETag), then moves it with If-Match. When another "
        "writer moved it in between (412), it reads again and retries; with --expect N it "
        "instead refuses unless the alias still points at version N.",
    )
    set_.add_argument("model", metavar="NS/NAME")
    set_.add_argument("alias", metavar="ALIAS")
    set_.add_argument("version", metavar="VERSION", type=int)
    set_.add_argument(
        "--expect",
        type=int,
        metavar="N",
        help="move only if the alias points at version N now (0: only if it does not exist)",
    )
    set_.add_argument(
        "--wait-warm",
        metavar="PCT",
        help="after the move, follow the rollout until this share of the nodes watching the "
        "alias is warm on the new version (e.g. 90%%); exit 1 on --wait-timeout, at once when "
        "no live node watches the alias or when nodes that no artifact of the new version "
        "matches put the share out of reach (they are named, with why)",
    )
    set_.add_argument(
        "--wait-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long --wait-warm waits (default 600)",
    )
    set_.set_defaults(func=with_registry(cmd_alias_set))
    ls = alias.add_parser("ls", parents=[common, as_json], help="aliases of a model")
    ls.add_argument("model", metavar="NS/NAME")
    ls.set_defaults(func=with_registry(cmd_alias_ls))
    history = alias.add_parser(
        "history", parents=[common, as_json], help="every move of a model's aliases"
    )
    history.add_argument("model", metavar="NS/NAME")
    history.add_argument("alias", metavar="ALIAS", nargs="?", help="only this alias")
    history.set_defaults(func=with_registry(cmd_alias_history))
    rm = alias.add_parser("rm", parents=[common], help="delete an alias")
    rm.add_argument("model", metavar="NS/NAME")
    rm.add_argument("alias", metavar="ALIAS")
    rm.set_defaults(func=with_registry(cmd_alias_rm))


class AliasMoved(RegistryError):
    code = "alias_moved"


class RolloutTimeout(RegistryError):
    code = "rollout_timeout"


class NobodyWatches(RegistryError):
    code = "no_watching_node"


class RolloutBlocked(RegistryError):
    code = "rollout_blocked"


def _unmatched(rollout: dict[str, Any]) -> str:
    return "; ".join(
        f"{n['id']} ({n['hostname']}): {n.get('error') or 'no matching artifact'}"
        for n in rollout.get("unmatched") or []
    )


def parse_share(text: str) -> float:
    """'90%', '90' or '0.9' → 0.9."""
    raw = text.strip().rstrip("%")
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"--wait-warm takes a share like 90%, not {text!r}") from None
    share = value / 100 if text.strip().endswith("%") or value > 1 else value
    if not 0 < share <= 1:
        raise UsageError(f"--wait-warm must be above 0% and at most 100%, not {text!r}")
    return share


def _wait_warm(client: RegistryClient, model_id: str, name: str, args: argparse.Namespace) -> int:
    """Follow GET …/rollout (every second) until ``--wait-warm`` of the watching nodes are warm
    on the alias's new target; a progress bar counts warm nodes."""
    share = parse_share(args.wait_warm)
    deadline = time.monotonic() + args.wait_timeout
    with progress_bar(None, f"{name}:{args.alias} warm") as bar:
        bar.unit, bar.unit_scale = "node", False
        while True:
            rollout = client.rollout(model_id, args.alias)
            warm, watching = len(rollout["warm"]), int(rollout["watching"])
            bar.total = watching
            bar.n = warm
            bar.refresh()
            if not watching:
                raise NobodyWatches(
                    f"no live node watches {name}:{args.alias}, so none can become warm: "
                    "not reporting success (start an agent with --watch "
                    f"{name}:{args.alias}, or leave out --wait-warm)"
                )
            if warm / watching >= share - 1e-9:
                break
            # Nodes whose watch no artifact of the new version matches never become warm:
            # when the share cannot be reached without them, say so now.
            stuck = len(rollout.get("unmatched") or [])
            if stuck and (watching - stuck) / watching < share - 1e-9:
                raise RolloutBlocked(
                    f"{stuck} of {watching} watching node(s) cannot become warm on version "
                    f"{rollout['version']}, so {share:.0%} is out of reach: "
                    f"{_unmatched(rollout)}"
                )
            if time.monotonic() >= deadline:
                failed = "; ".join(
                    f"{n['hostname']}: {n.get('error') or 'failed'}" for n in rollout["failed"]
                )
                unmatched = _unmatched(rollout)
                raise RolloutTimeout(
                    f"after {args.wait_timeout:.0f} s {warm} of {watching} watching node(s) are "
                    f"warm on version {rollout['version']} (wanted {share:.0%})"
                    + (f"; failed: {failed}" if failed else "")
                    + (f"; cannot become warm: {unmatched}" if unmatched else "")
                )
            time.sleep(1.0)
    say(
        f"{warm} of {watching} watching node(s) warm on version {rollout['version']} "
        f"({warm / watching:.0%})"
    )
    return 0


def cmd_alias_set(args: argparse.Namespace, client: RegistryClient) -> int:
    name = model_only(args.model)
    model_id = str(client.get_model(name)["id"])
    for attempt in range(1, ALIAS_SET_ATTEMPTS + 1):
        current = client.get_alias(model_id, args.alias)
        before = int(current["version"]) if current else None
        if args.expect is not None and (before or 0) != args.expect:
            raise AliasMoved(
                f"{name}:{args.alias} points at "
                f"{'version ' + str(before) if before else 'nothing'}, not {args.expect}; "
                "not moved"
            )
        try:
            moved = client.set_alias(
                model_id, args.alias, args.version, etag=current["etag"] if current else None
            )
        except PreconditionFailed:
            say(f"{name}:{args.alias} was moved by someone else meanwhile; reading it again")
            if attempt == ALIAS_SET_ATTEMPTS:
                raise
            continue
        except AliasNotFound:
            continue  # deleted between the read and the write: read again
        if args.json:
            print_json(moved)
        elif before == args.version:
            print(f"{name}:{args.alias} already points at version {args.version}")
        else:
            was = f"version {before}" if before else "new"
            print(f"{name}:{args.alias} -> version {args.version} (was {was})")
        if args.wait_warm is not None:
            return _wait_warm(client, model_id, name, args)
        return 0
    raise AliasMoved(f"{name}:{args.alias} kept moving; not set")


def cmd_alias_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    model_id = str(client.get_model(model_only(args.model))["id"])
    aliases = client.list_aliases(model_id)
    if args.json:
        print_json(aliases)
        return 0
    print_table(
        ["ALIAS", "VERSION", "UPDATED"],
        [[a["alias"], a["version"], format_time(a["updated_at"])] for a in aliases],
    )
    return 0


def cmd_alias_history(args: argparse.Namespace, client: RegistryClient) -> int:
    model_id = str(client.get_model(model_only(args.model))["id"])
    if args.alias:
        found = client.get_alias(model_id, args.alias)
        events = list(found["history"]) if found else []
        if found is None:
            # A deleted alias keeps its history in the list answer's other aliases only.
            raise AliasNotFound(f"No alias '{args.alias}'.", status=404)
    else:
        events = [e for a in client.list_aliases(model_id) for e in a.get("history") or []]
    events.sort(key=lambda e: str(e["created_at"]), reverse=True)
    if args.json:
        print_json(events)
        return 0
    print_table(
        ["WHEN", "ALIAS", "FROM", "TO", "BY"],
        [
            [
                format_time(e["created_at"]),
                e["alias"],
                e["from_version"],
                e["to_version"],
                e["actor"],
            ]
            for e in events
        ],
    )
    return 0


def cmd_alias_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    name = model_only(args.model)
    client.delete_alias(str(client.get_model(name)["id"]), args.alias)
    print(f"deleted alias {name}:{args.alias}")
    return 0
