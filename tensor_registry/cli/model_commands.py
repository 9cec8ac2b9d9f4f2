"""`tensor-registry models ls | show | create | edit | rm`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import (
    UsageError,
    command_group,
    confirm,
    connection_parser,
    json_flag,
    model_only,
    yes_flag,
)
from tensor_registry.cli.output import format_time, print_fields, print_json, print_table
from tensor_registry.cli.runner import with_registry
from tensor_registry.cli.version_commands import versions_table

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    common, as_json, yes = connection_parser(), json_flag(), yes_flag()
    models = command_group(sub, "models", "list, show, create, edit and delete models")
    ls = models.add_parser("ls", parents=[common, as_json], help="list models")
    ls.add_argument("--q", help="substring of the name or description")
    ls.add_argument("--tag")
    ls.add_argument("--limit", type=int, default=None, help="at most this many (default: all)")
    ls.set_defaults(func=with_registry(cmd_models_ls))

    show = models.add_parser(
        "show", parents=[common, as_json], help="a model with its versions and aliases"
    )
    show.add_argument("model", metavar="NS/NAME")
    show.set_defaults(func=with_registry(cmd_models_show))

    create = models.add_parser("create", parents=[common, as_json], help="create a model")
    create.add_argument("model", metavar="NS/NAME")
    create.add_argument("--description", default="")
    create.add_argument("--tag", action="append", default=[], help="repeat for several")
    create.set_defaults(func=with_registry(cmd_models_create))

    edit = models.add_parser(
        "edit", parents=[common, as_json], help="change a model's description or tags"
    )
    edit.add_argument("model", metavar="NS/NAME")
    edit.add_argument("--description")
    edit.add_argument(
        "--tag", action="append", default=None, help="the new tag set; repeat for several"
    )
    edit.add_argument("--clear-tags", action="store_true")
    edit.set_defaults(func=with_registry(cmd_models_edit))

    rm = models.add_parser("rm", parents=[common, yes], help="delete a model")
    rm.add_argument("model", metavar="NS/NAME")
    rm.set_defaults(func=with_registry(cmd_models_rm))


def cmd_models_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    items = client.list_models(q=args.q, tag=args.tag, limit=args.limit)
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["NAME", "TAGS", "UPDATED", "DESCRIPTION"],
        [
            [
                m["name"],
                ",".join(m["tags"]) or "-",
                format_time(m["updated_at"]),
                m["description"][:60],
            ]
            for m in items
        ],
    )
    return 0


def cmd_models_show(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.get_model(model_only(args.model))
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
            ("created", format_time(model["created_at"])),
            ("aliases", [f"{a['alias']} -> v{a['version']}" for a in aliases]),
        ]
    )
    print()
    versions_table(versions, aliases)
    return 0


def cmd_models_create(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.create_model(model_only(args.model), description=args.description, tags=args.tag)
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
    model = client.get_model(model_only(args.model))
    # If-Match: a concurrent edit makes this one fail (412) instead of silently losing it.
    updated = client.update_model(str(model["id"]), changes, etag=str(model["etag"]))
    if args.json:
        print_json(updated)
    else:
        print(f"updated {updated['name']}: {', '.join(sorted(changes))}")
    return 0


def cmd_models_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.get_model(model_only(args.model))
    confirm(args, f"model {model['name']} with all its versions and artifacts")
    client.delete_model(str(model["id"]))
    print(f"deleted {model['name']}")
    return 0
