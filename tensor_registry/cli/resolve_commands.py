"""`tensor-registry resolve`: the signed URLs and loader settings of one artifact."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import (
    artifact_choice_parser,
    connection_parser,
    model_ref,
    resolve_filters,
)
from tensor_registry.cli.output import format_size
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    resolve = sub.add_parser(
        "resolve",
        parents=[connection_parser(), artifact_choice_parser()],
        help="signed URLs and loader settings",
    )
    resolve.add_argument("--json", action="store_true", help="print the registry's JSON")
    resolve.set_defaults(func=with_registry(cmd_resolve))


def cmd_resolve(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    resolution = client.resolve(name, ref, **resolve_filters(args))
    if args.json:
        print(json.dumps(resolution.data, indent=2))
        return 0
    artifact = resolution.artifact
    variant = (
        f"{artifact['dtype']}/{artifact['format']}/tp{artifact['tensor_parallel_size']}"
        f"{', encrypted' if resolution.encrypted else ''}"
    )
    print(f"{resolution.model}:{ref} -> version {resolution.version}, artifact {artifact['id']}")
    print(f"variant:         {variant}")
    print(f"expires_at:      {resolution.data['expires_at']}")
    print(f"tensorizer_uri:  {resolution.tensorizer_uri}")
    if resolution.encrypted:
        key = resolution.encryption_key_url or "(none: this token lacks keys:read)"
        print(f"key url:         {key}")
    advice = resolution.data["deserializer"]
    print(
        f"deserializer:    num_readers={advice['num_readers']} verify_hash={advice['verify_hash']}"
    )
    print("files:")
    for f in resolution.files:
        print(f"  {f.path:<40} {format_size(f.size):>10}  {f.sha256}")
    return 0
