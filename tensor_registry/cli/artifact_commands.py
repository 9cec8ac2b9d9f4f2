"""`tensor-registry artifacts ls | rm`: the tensorized variants of a model."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import (
    command_group,
    confirm,
    connection_parser,
    json_flag,
    model_ref,
    yes_flag,
)
from tensor_registry.cli.output import (
    format_size,
    format_time,
    print_json,
    print_table,
    variant_label,
)
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    common, as_json, yes = connection_parser(), json_flag(), yes_flag()
    artifacts = command_group(sub, "artifacts", "list and delete tensorized variants")
    ls = artifacts.add_parser("ls", parents=[common, as_json], help="artifacts of a model")
    ls.add_argument("model", metavar="NS/NAME[:REF]", help="with :REF only that version's")
    ls.add_argument("--status", choices=["pending", "running", "ready", "failed"])
    ls.set_defaults(func=with_registry(cmd_artifacts_ls))
    rm = artifacts.add_parser("rm", parents=[common, yes], help="delete an artifact")
    rm.add_argument("artifact_id", metavar="ARTIFACT_ID")
    rm.set_defaults(func=with_registry(cmd_artifacts_rm))


def _variant(a: dict[str, Any]) -> str:
    return variant_label(
        a["dtype"], a["format"], a["tensor_parallel_size"], a["encryption"]["enabled"]
    )


def cmd_artifacts_ls(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    model_id = str(client.get_model(name)["id"])
    version = client.version_number(model_id, ref) if ":" in args.model else None
    items = client.list_artifacts(model_id, version=version, status=args.status)
    if args.json:
        print_json(items)
        return 0
    print_table(
        ["ID", "VERSION", "VARIANT", "STATUS", "SIZE", "CREATED"],
        [
            [
                a["id"],
                a["version"],
                _variant(a),
                a["status"],
                format_size(a.get("size")),
                format_time(a["created_at"]),
            ]
            for a in items
        ],
    )
    return 0


def cmd_artifacts_rm(args: argparse.Namespace, client: RegistryClient) -> int:
    artifact = client.get_artifact(args.artifact_id)
    confirm(args, f"artifact {artifact['id']} (v{artifact['version']} {_variant(artifact)})")
    client.delete_artifact(args.artifact_id)
    print(f"deleted artifact {artifact['id']}")
    return 0
