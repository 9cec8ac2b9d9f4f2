"""`tensor-registry tensorize`: serialize a version with tensorizer, as a job on a worker."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import add_variant_flags, connection_parser, model_ref
from tensor_registry.cli.job_commands import follow_job
from tensor_registry.cli.output import print_json, say
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers


def register(sub: SubParsers) -> None:
    tensorize = sub.add_parser(
        "tensorize",
        parents=[connection_parser()],
        help="serialize a version with tensorizer (a job on a worker)",
    )
    tensorize.add_argument("model", metavar="NS/NAME[:REF]")
    # The variant to make, in the flags that choose one everywhere else (-tp: 1 when not
    # given; --encrypted: encrypt the weights).
    add_variant_flags(tensorize, make=True)
    tensorize.add_argument("--storage", help="storage backend (default: the registry's)")
    tensorize.add_argument("--wait", action="store_true", help="follow the job to its end")
    tensorize.add_argument(
        "--json", action="store_true", help="print the job's (or ready artifact's) JSON"
    )
    tensorize.set_defaults(func=with_registry(cmd_tensorize))


def cmd_tensorize(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    model = client.get_model(name)
    body: dict[str, Any] = {
        "dtype": args.dtype,
        "format": args.format,
        "tensor_parallel_size": args.tp if args.tp is not None else 1,
        "encrypt": bool(args.encrypted),
    }
    version = client.version_for_ref(str(model["id"]), ref)
    if version is not None:
        body["version"] = version
    if args.storage:
        body["storage"] = args.storage
    status, payload = client.tensorize(str(model["id"]), body)
    if status == 200:
        say(f"already tensorized: artifact {payload['id']} is {payload['status']}")
        if args.json:
            print_json(payload)
        else:
            print(payload["id"])
        return 0
    job_id = str(payload["id"])
    say(f"job {job_id} {payload['status']}")
    if not args.wait:
        if args.json:
            print_json(payload)
        else:
            print(job_id)
        return 0

    return follow_job(client, job_id, as_json=args.json)
