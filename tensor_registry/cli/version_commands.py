"""`tensor-registry versions ls | show | rm`, and the versions table `models show` prints too."""

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
    model_ref,
    yes_flag,
)
from tensor_registry.cli.output import (
    format_size,
    format_time,
    print_fields,
    print_json,
    print_table,
)
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def versions_table(versions: list[dict[str, Any]], aliases: list[dict[str, Any]]) -> None:
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
                format_time(v["created_at"]),
            ]
            for v in sorted(versions, key=lambda v: -int(v["version"]))
        ],
    )


def register(sub: SubParsers) -> None:
    common, as_json, yes = connection_parser(), json_flag(), yes_flag()
    versions = command_group(sub, "versions", "list, show and delete the versions of a model")
    ls = versions.add_parser("ls", parents=[common, as_json], help="versions of a model")
    ls.add_argument("model", metavar="NS/NAME")
    ls.set_defaults(func=with_registry(cmd_versions_ls))
    show = versions.add_parser("show", parents=[common, as_json], help="one version with its files")
    show.add_argument("model", metavar="NS/NAME[:REF]", help="REF: N, an alias or latest")
    show.set_defaults(func=with_registry(cmd_versions_show))
    rm = versions.add_parser("rm", parents=[common, yes], help="delete a version")
    rm.add_argument("model", metavar="NS/NAME:N")
    rm.set_defaults(func=with_registry(cmd_versions_rm))


def cmd_versions_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    model = client.get_model(model_only(args.model))
    versions = client.list_versions(str(model["id"]))
    if args.json:
        print_json(versions)
        return 0
    versions_table(versions, client.list_aliases(str(model["id"])))
    return 0


def cmd_versions_show(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
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
            ("created", format_time(version["created_at"])),
            ("finalized", format_time(version.get("finalized_at"))),
        ]
    )
    print()
    print_table(
        ["PATH", "SIZE", "SHA256"],
        [[f["path"], format_size(f["size"]), f["sha256"]] for f in version["files"]],
    )
    return 0


def cmd_versions_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    if not ref.isdigit():
        raise UsageError("name the version by number: NS/NAME:N")
    model = client.get_model(name)
    confirm(args, f"{name} version {ref} and its artifacts")
    client.delete_version(str(model["id"]), int(ref))
    print(f"deleted {name} version {ref}")
    return 0
