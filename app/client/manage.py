"""Management commands of `tensor-registry`: login, models, versions, aliases, artifacts, jobs,
tokens, the node cache and shell completion.

Every command that prints data takes ``--json`` (the registry's own JSON, or for the node cache
the same fields as the table); tables go to stdout, notes to stderr. Deleting asks for
confirmation on a terminal and needs ``--yes`` elsewhere, so a script never deletes by accident.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.client.api import (
    AliasNotFound,
    PreconditionFailed,
    RegistryClient,
    RegistryError,
)
from app.client.cache import NodeCache
from app.client.commands import (
    UsageError,
    _guard,
    _model_ref,
    _one_line,
    _say,
    connection_parser,
    follow_job,
)
from app.client.config import config_path, forget_login, read_config, write_config
from app.client.output import format_size, parse_size, print_fields, print_json, print_table

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

# `alias set` re-reads and retries this often when another writer moved the alias in between.
ALIAS_SET_ATTEMPTS = 3


def _json_flag() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parent


def _yes_flag() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    return parent


def _group(sub: SubParsers, name: str, help: str) -> SubParsers:
    parser = sub.add_parser(name, help=help, description=help)
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def _model_only(text: str) -> str:
    name, _ = _model_ref(text)
    if ":" in text:
        raise UsageError(f"{text!r}: give NS/NAME without a :REF here")
    return name


def _confirm(args: argparse.Namespace, what: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"deleting {what} needs --yes when there is no terminal to ask")
    answer = input(f"Delete {what}? This cannot be undone. [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not deleted")


def _when(value: str | None) -> str:
    """'2026-12-01T18:20:01.123+00:00' -> '2026-12-01 18:20:01'."""
    if not value:
        return "-"
    return str(value).replace("T", " ")[:19]


def register(sub: SubParsers) -> None:
    common = connection_parser()
    as_json = _json_flag()
    yes = _yes_flag()
    _register_login(sub, common, as_json)
    _register_models(sub, common, as_json, yes)
    _register_versions(sub, common, as_json, yes)
    _register_aliases(sub, common, as_json)
    _register_artifacts(sub, common, as_json, yes)
    _register_jobs(sub, common, as_json)
    _register_tokens(sub, common, as_json)
    _register_cache(sub, as_json)
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script: `source <(tensor-registry completion bash)` "
        "in ~/.bashrc, or `source <(tensor-registry completion zsh)` in ~/.zshrc.",
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=cmd_completion)


# ---------------------------------------------------------------------------------------------
# login, logout, whoami


def _register_login(sub: SubParsers, common: argparse.ArgumentParser, as_json: Any) -> None:
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
    login.set_defaults(func=_guard(cmd_login))
    logout = sub.add_parser("logout", help="forget the stored token")
    logout.set_defaults(func=cmd_logout)
    whoami = sub.add_parser(
        "whoami", parents=[common, as_json], help="the token in use: name, scopes, expiry"
    )
    whoami.set_defaults(func=_guard(cmd_whoami))


def _read_token() -> str:
    if sys.stdin.isatty():
        return getpass.getpass("Token: ").strip()
    return sys.stdin.readline().strip()


def cmd_login(args: argparse.Namespace, client: RegistryClient) -> int:
    token = args.token or _read_token()
    if not token:
        raise UsageError("no token given")
    with RegistryClient(client.url, token) as checked:
        me = checked.token_self()
    path = write_config({**read_config(), "url": client.url, "token": token})
    _say(f"logged in to {client.url} as token '{me['name']}' ({', '.join(me['scopes'])})")
    _say(f"token stored in {path} (mode 0600)")
    if os.environ.get("TENSOR_REGISTRY_TOKEN"):
        _say("note: TENSOR_REGISTRY_TOKEN is set and wins over the stored token")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    if forget_login():
        _say(f"removed the stored token from {config_path()}")
    else:
        _say("no stored token")
    if os.environ.get("TENSOR_REGISTRY_TOKEN"):
        _say("note: TENSOR_REGISTRY_TOKEN is still set in this environment")
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
            ("expires", _when(me["expires_at"]) if me["expires_at"] else "never"),
            ("last used", _when(me.get("last_used_at"))),
        ]
    )
    return 0


# ---------------------------------------------------------------------------------------------
# models


def _register_models(sub: SubParsers, common: Any, as_json: Any, yes: Any) -> None:
    models = _group(sub, "models", "list, show, create, edit and delete models")
    ls = models.add_parser("ls", parents=[common, as_json], help="list models")
    ls.add_argument("--q", help="substring of the name or description")
    ls.add_argument("--tag")
    ls.add_argument("--limit", type=int, default=None, help="at most this many (default: all)")
    ls.set_defaults(func=_guard(cmd_models_ls))

    show = models.add_parser(
        "show", parents=[common, as_json], help="a model with its versions and aliases"
    )
    show.add_argument("model", metavar="NS/NAME")
    show.set_defaults(func=_guard(cmd_models_show))

    create = models.add_parser("create", parents=[common, as_json], help="create a model")
    create.add_argument("model", metavar="NS/NAME")
    create.add_argument("--description", default="")
    create.add_argument("--tag", action="append", default=[], help="repeat for several")
    create.set_defaults(func=_guard(cmd_models_create))

    edit = models.add_parser(
        "edit", parents=[common, as_json], help="change a model's description or tags"
    )
    edit.add_argument("model", metavar="NS/NAME")
    edit.add_argument("--description")
    edit.add_argument(
        "--tag", action="append", default=None, help="the new tag set; repeat for several"
    )
    edit.add_argument("--clear-tags", action="store_true")
    edit.set_defaults(func=_guard(cmd_models_edit))

    rm = models.add_parser("rm", parents=[common, yes], help="delete a model")
    rm.add_argument("model", metavar="NS/NAME")
    rm.set_defaults(func=_guard(cmd_models_rm))


def cmd_models_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    items = client.list_models(q=args.q, tag=args.tag, limit=args.limit)
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["NAME", "TAGS", "UPDATED", "DESCRIPTION"],
        [
            [m["name"], ",".join(m["tags"]) or "-", _when(m["updated_at"]), m["description"][:60]]
            for m in items
        ],
    )
    return 0


def cmd_models_show(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.get_model(_model_only(args.model))
    versions = client.list_versions(str(model["id"]))
    aliases = client.list_aliases(str(model["id"]))
    if args.json:
        print_json({**model, "versions": versions, "aliases": aliases})
        return 0
    print_fields(
        [
            ("name", model["name"]),
            ("id", model["id"]),
            ("description", model["description"] or "-"),
            ("tags", model["tags"]),
            ("created", _when(model["created_at"])),
            ("aliases", [f"{a['alias']} -> v{a['version']}" for a in aliases]),
        ]
    )
    print()
    _versions_table(versions, aliases)
    return 0


def cmd_models_create(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.create_model(
        _model_only(args.model), description=args.description, tags=args.tag
    )
    if args.json:
        print_json(model)
    else:
        print(f"created {model['name']} ({model['id']})")
    return 0


def cmd_models_edit(args: argparse.Namespace, client: RegistryClient) -> int:
    changes: dict[str, Any] = {}
    if args.description is not None:
        changes["description"] = args.description
    if args.clear_tags:
        changes["tags"] = []
    elif args.tag is not None:
        changes["tags"] = args.tag
    if not changes:
        raise UsageError("nothing to change: give --description, --tag or --clear-tags")
    model = client.get_model(_model_only(args.model))
    # If-Match: a concurrent edit makes this one fail (412) instead of silently losing it.
    updated = client.update_model(str(model["id"]), changes, etag=str(model["etag"]))
    if args.json:
        print_json(updated)
    else:
        print(f"updated {updated['name']}: {', '.join(sorted(changes))}")
    return 0


def cmd_models_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.get_model(_model_only(args.model))
    _confirm(args, f"model {model['name']} with all its versions and artifacts")
    client.delete_model(str(model["id"]))
    print(f"deleted {model['name']}")
    return 0


# ---------------------------------------------------------------------------------------------
# versions


def _versions_table(versions: list[dict[str, Any]], aliases: list[dict[str, Any]]) -> None:
    by_version: dict[int, list[str]] = {}
    for alias in aliases:
        by_version.setdefault(int(alias["version"]), []).append(alias["alias"])
    print_table(
        ["VERSION", "STATUS", "FILES", "SIZE", "ALIASES", "CREATED"],
        [
            [
                v["version"],
                v["status"],
                len(v.get("files") or []),
                format_size(v.get("size")),
                ",".join(sorted(by_version.get(int(v["version"]), []))) or "-",
                _when(v["created_at"]),
            ]
            for v in sorted(versions, key=lambda v: -int(v["version"]))
        ],
    )


def _register_versions(sub: SubParsers, common: Any, as_json: Any, yes: Any) -> None:
    versions = _group(sub, "versions", "list, show and delete the versions of a model")
    ls = versions.add_parser("ls", parents=[common, as_json], help="versions of a model")
    ls.add_argument("model", metavar="NS/NAME")
    ls.set_defaults(func=_guard(cmd_versions_ls))
    show = versions.add_parser(
        "show", parents=[common, as_json], help="one version with its files"
    )
    show.add_argument("model", metavar="NS/NAME[:REF]", help="REF: N, an alias or latest")
    show.set_defaults(func=_guard(cmd_versions_show))
    rm = versions.add_parser("rm", parents=[common, yes], help="delete a version")
    rm.add_argument("model", metavar="NS/NAME:N")
    rm.set_defaults(func=_guard(cmd_versions_rm))


def cmd_versions_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.get_model(_model_only(args.model))
    versions = client.list_versions(str(model["id"]))
    if args.json:
        print_json(versions)
        return 0
    _versions_table(versions, client.list_aliases(str(model["id"])))
    return 0


def cmd_versions_show(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    model = client.get_model(name)
    number = client.version_number(str(model["id"]), ref)
    version = client.get_version(str(model["id"]), number)
    if args.json:
        print_json(version)
        return 0
    print_fields(
        [
            ("model", name),
            ("version", version["version"]),
            ("status", version["status"]),
            ("size", format_size(version["size"])),
            ("source", version.get("source_uri")),
            ("created", _when(version["created_at"])),
            ("finalized", _when(version.get("finalized_at"))),
        ]
    )
    print()
    print_table(
        ["PATH", "SIZE", "SHA256"],
        [[f["path"], format_size(f["size"]), f["sha256"]] for f in version["files"]],
    )
    return 0


def cmd_versions_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    if not ref.isdigit():
        raise UsageError("name the version by number: NS/NAME:N")
    model = client.get_model(name)
    _confirm(args, f"{name} version {ref} and its artifacts")
    client.delete_version(str(model["id"]), int(ref))
    print(f"deleted {name} version {ref}")
    return 0


# ---------------------------------------------------------------------------------------------
# aliases


def _register_aliases(sub: SubParsers, common: Any, as_json: Any) -> None:
    alias = _group(sub, "alias", "move, list and delete aliases (prod, staging, ...)")
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
    set_.set_defaults(func=_guard(cmd_alias_set))
    ls = alias.add_parser("ls", parents=[common, as_json], help="aliases of a model")
    ls.add_argument("model", metavar="NS/NAME")
    ls.set_defaults(func=_guard(cmd_alias_ls))
    history = alias.add_parser(
        "history", parents=[common, as_json], help="every move of a model's aliases"
    )
    history.add_argument("model", metavar="NS/NAME")
    history.add_argument("alias", metavar="ALIAS", nargs="?", help="only this alias")
    history.set_defaults(func=_guard(cmd_alias_history))
    rm = alias.add_parser("rm", parents=[common], help="delete an alias")
    rm.add_argument("model", metavar="NS/NAME")
    rm.add_argument("alias", metavar="ALIAS")
    rm.set_defaults(func=_guard(cmd_alias_rm))


class AliasMoved(RegistryError):
    code = "alias_moved"


def cmd_alias_set(args: argparse.Namespace, client: RegistryClient) -> int:
    name = _model_only(args.model)
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
            _say(f"{name}:{args.alias} was moved by someone else meanwhile; reading it again")
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
        return 0
    raise AliasMoved(f"{name}:{args.alias} kept moving; not set")


def cmd_alias_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    model_id = str(client.get_model(_model_only(args.model))["id"])
    aliases = client.list_aliases(model_id)
    if args.json:
        print_json(aliases)
        return 0
    print_table(
        ["ALIAS", "VERSION", "UPDATED"],
        [[a["alias"], a["version"], _when(a["updated_at"])] for a in aliases],
    )
    return 0


def cmd_alias_history(args: argparse.Namespace, client: RegistryClient) -> int:
    model_id = str(client.get_model(_model_only(args.model))["id"])
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
            [_when(e["created_at"]), e["alias"], e["from_version"], e["to_version"], e["actor"]]
            for e in events
        ],
    )
    return 0


def cmd_alias_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    name = _model_only(args.model)
    client.delete_alias(str(client.get_model(name)["id"]), args.alias)
    print(f"deleted alias {name}:{args.alias}")
    return 0


# ---------------------------------------------------------------------------------------------
# artifacts


def _register_artifacts(sub: SubParsers, common: Any, as_json: Any, yes: Any) -> None:
    artifacts = _group(sub, "artifacts", "list and delete tensorized variants")
    ls = artifacts.add_parser("ls", parents=[common, as_json], help="artifacts of a model")
    ls.add_argument("model", metavar="NS/NAME[:REF]", help="with :REF only that version's")
    ls.add_argument("--status", choices=["pending", "running", "ready", "failed"])
    ls.set_defaults(func=_guard(cmd_artifacts_ls))
    rm = artifacts.add_parser("rm", parents=[common, yes], help="delete an artifact")
    rm.add_argument("artifact_id", metavar="ARTIFACT_ID")
    rm.set_defaults(func=_guard(cmd_artifacts_rm))


def _variant(a: dict[str, Any]) -> str:
    enc = "/encrypted" if a["encryption"]["enabled"] else ""
    return f"{a['dtype']}/{a['format']}/tp{a['tensor_parallel_size']}{enc}"


def cmd_artifacts_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    model_id = str(client.get_model(name)["id"])
    version = client.version_number(model_id, ref) if ":" in args.model else None
    items = client.list_artifacts(model_id, version=version, status=args.status)
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "VERSION", "VARIANT", "STATUS", "SIZE", "CREATED"],
        [
            [a["id"], a["version"], _variant(a), a["status"], format_size(a.get("size")),
             _when(a["created_at"])]
            for a in items
        ],
    )
    return 0


def cmd_artifacts_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    artifact = client.get_artifact(args.artifact_id)
    _confirm(args, f"artifact {artifact['id']} (v{artifact['version']} {_variant(artifact)})")
    client.delete_artifact(args.artifact_id)
    print(f"deleted artifact {artifact['id']}")
    return 0


# ---------------------------------------------------------------------------------------------
# jobs


def _register_jobs(sub: SubParsers, common: Any, as_json: Any) -> None:
    jobs = _group(sub, "jobs", "list, show, follow and cancel jobs")
    ls = jobs.add_parser("ls", parents=[common, as_json], help="recent jobs, newest first")
    ls.add_argument("--model", metavar="NS/NAME")
    ls.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    ls.add_argument("--kind", choices=["tensorize", "import", "verify"])
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(func=_guard(cmd_jobs_ls))
    show = jobs.add_parser("show", parents=[common, as_json], help="one job")
    show.add_argument("job_id", metavar="JOB_ID")
    show.set_defaults(func=_guard(cmd_jobs_show))
    follow = jobs.add_parser(
        "follow",
        parents=[common, as_json],
        help="follow a job to its end (Ctrl-C leaves it running)",
    )
    follow.add_argument("job_id", metavar="JOB_ID")
    follow.set_defaults(func=_guard(cmd_jobs_follow))
    cancel = jobs.add_parser("cancel", parents=[common, as_json], help="cancel a job")
    cancel.add_argument("job_id", metavar="JOB_ID")
    cancel.set_defaults(func=_guard(cmd_jobs_cancel))


def _progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    done, total = progress.get("bytes_done"), progress.get("bytes_total")
    text = str(progress.get("stage") or "-")
    if total:
        text += f" {format_size(done or 0)}/{format_size(total)}"
    return text


def cmd_jobs_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    model_id = str(client.get_model(_model_only(args.model))["id"]) if args.model else None
    items = client.list_jobs(
        model_id=model_id, status=args.status, kind=args.kind, limit=args.limit
    )
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "KIND", "STATUS", "PROGRESS", "CREATED"],
        [[j["id"], j["kind"], j["status"], _progress(j), _when(j["created_at"])] for j in items],
    )
    return 0


def cmd_jobs_show(args: argparse.Namespace, client: RegistryClient) -> int:
    job = client.get_job(args.job_id)
    if args.json:
        print_json(job)
        return 0
    error = job.get("error") or {}
    print_fields(
        [
            ("id", job["id"]),
            ("kind", job["kind"]),
            ("status", job["status"] + (" (cancel asked)" if job.get("cancel_requested") else "")),
            ("progress", _progress(job)),
            ("attempts", job["attempts"]),
            ("artifact", job.get("artifact_id")),
            ("worker", job.get("worker")),
            ("created", _when(job["created_at"])),
            ("started", _when(job.get("started_at"))),
            ("finished", _when(job.get("finished_at"))),
            ("error", f"{error.get('detail')} ({error.get('code')})" if error else None),
        ]
    )
    return 0


def cmd_jobs_follow(args: argparse.Namespace, client: RegistryClient) -> int:
    job = client.get_job(args.job_id)  # a wrong id fails here, before any stream opens
    _say(f"job {job['id']} ({job['kind']}) {job['status']}")
    return follow_job(client, str(job["id"]), as_json=args.json)


def cmd_jobs_cancel(args: argparse.Namespace, client: RegistryClient) -> int:
    job = client.cancel_job(args.job_id)
    if args.json:
        print_json(job)
    else:
        print(f"job {job['id']} {job['status']}")
    return 0


# ---------------------------------------------------------------------------------------------
# tokens


def _register_tokens(sub: SubParsers, common: Any, as_json: Any) -> None:
    tokens = _group(sub, "tokens", "create, list and revoke API tokens")
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
    create.set_defaults(func=_guard(cmd_tokens_create))
    ls = tokens.add_parser("ls", parents=[common, as_json], help="tokens you can see")
    ls.set_defaults(func=_guard(cmd_tokens_ls))
    revoke = tokens.add_parser("revoke", parents=[common], help="revoke a token")
    revoke.add_argument("token_id", metavar="TOKEN_ID")
    revoke.set_defaults(func=_guard(cmd_tokens_revoke))


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
    _say(
        f"token '{created['name']}' ({created['id']}), scopes {', '.join(created['scopes'])}, "
        f"expires {_when(created['expires_at']) if created['expires_at'] else 'never'}; "
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
                _when(t["expires_at"]) if t["expires_at"] else "never",
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


# ---------------------------------------------------------------------------------------------
# node cache (local: no registry call)


def _register_cache(sub: SubParsers, as_json: Any) -> None:
    cache = _group(sub, "cache", "this node's download cache (objects kept by sha256)")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--cache-dir",
        type=Path,
        help="default: $TENSOR_REGISTRY_CACHE_DIR, else ~/.cache/tensor-registry",
    )
    ls = cache.add_parser("ls", parents=[where, as_json], help="cached objects, newest use first")
    ls.set_defaults(func=_local(cmd_cache_ls))
    prune = cache.add_parser(
        "prune",
        parents=[where, as_json],
        help="remove least recently used objects down to a size",
    )
    prune.add_argument(
        "--max-size", required=True, metavar="SIZE", help="e.g. 50GB, 500MB, 1.5GiB, 0"
    )
    prune.set_defaults(func=_local(cmd_cache_prune))
    rm = cache.add_parser("rm", parents=[where], help="remove objects by sha256 (or prefix)")
    rm.add_argument("sha256", nargs="+", metavar="SHA256")
    rm.set_defaults(func=_local(cmd_cache_rm))


def _local(command: Callable[[argparse.Namespace, NodeCache], int]) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args, NodeCache(args.cache_dir))
        except ValueError as exc:
            print(f"usage error: {_one_line(str(exc))}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
            return 1

    return run


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
            [e.sha256, format_size(e.size), _when(row["last_used"]), e.links]
            for e, row in zip(entries, _cache_rows(entries), strict=True)
        ],
    )
    _say(f"{len(entries)} object(s), {format_size(sum(e.size for e in entries))} in {cache.root}")
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
    _say(
        f"removed {len(removed)} object(s), {format_size(sum(e.size for e in removed))}; "
        f"{format_size(sum(e.size for e in left))} left (limit {format_size(limit)})"
    )
    return 0


def cmd_cache_rm(args: argparse.Namespace, cache: NodeCache) -> int:
    for digest in args.sha256:
        entry = cache.remove(digest)
        print(f"removed {entry.sha256} ({format_size(entry.size)})")
    return 0


# ---------------------------------------------------------------------------------------------
# completion


def cmd_completion(args: argparse.Namespace) -> int:
    from app.client.cli import build_parser
    from app.client.completion import script

    sys.stdout.write(script(build_parser(), args.shell))
    return 0

