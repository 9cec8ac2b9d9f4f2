"""`tensor-registry warm`, `warm-restore`, `warm-report`: vLLM's compile caches as registry
artifacts (docs/warm-state.md).

- ``warm NS/NAME[:REF] --dtype … --serve-arg …``: a warm job on a vLLM worker for that variant;
- ``warm-restore NS/NAME[:REF] --model PATH …`` (before `vllm serve`): resolve, pick the bundle
  whose key is this node's, check its signature, restore it under VLLM_CACHE_ROOT; prints what
  it expects (hit, or miss and the key parts that differ);
- ``warm-report [--log FILE]`` (after vLLM started): hit or miss from what vLLM logged or made,
  checked in to the registry; prints it as JSON. A miss always names what differed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry import checkins
from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import (
    add_variant_flags,
    allow_unsigned_flag,
    connection_parser,
    model_ref,
    variant_filters,
)
from tensor_registry.cli.job_commands import follow_job
from tensor_registry.cli.output import print_json, say
from tensor_registry.cli.runner import with_registry
from tensor_registry.formats.warm_bundle import WarmBundleError
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import TrustError, trusted_keys
from tensor_registry.warm.node import (
    checkin_entry,
    default_cache_root,
    node_key,
    report,
    restore_for,
)

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

MAX_LOG_BYTES = 64 << 20


def register(sub: SubParsers) -> None:
    warm = sub.add_parser(
        "warm",
        parents=[connection_parser()],
        help="make a warm bundle (vLLM's compile caches) for a variant, as a job on a vLLM worker",
    )
    warm.add_argument("model", metavar="NS/NAME[:REF]")
    add_variant_flags(warm)
    _serve_args(warm)
    warm.add_argument("--wait", action="store_true", help="follow the job to its end")
    warm.add_argument("--json", action="store_true", help="print the job's (or bundle's) JSON")
    warm.set_defaults(func=with_registry(cmd_warm))

    restore = sub.add_parser(
        "warm-restore",
        parents=[connection_parser()],
        help="restore the matching warm bundle under VLLM_CACHE_ROOT before `vllm serve`",
    )
    restore.add_argument("model", metavar="NS/NAME[:REF]")
    add_variant_flags(restore)
    restore.add_argument(
        "--model-path",
        required=True,
        help="the model argument `vllm serve` will get (vLLM hashes it: use the bundle's)",
    )
    _serve_args(restore)
    restore.add_argument("--cache-root", type=Path, help="VLLM_CACHE_ROOT (default: vLLM's)")
    restore.add_argument("--gpu", help="compute capability to match (default: this node's)")
    restore.add_argument(
        "--trusted-key", action="append", help="trust only this key (base64 or keys document)"
    )
    allow_unsigned_flag(restore)
    restore.set_defaults(func=with_registry(cmd_warm_restore))

    rep = sub.add_parser(
        "warm-report",
        parents=[connection_parser()],
        help="after vLLM started: did it use the restored bundle (hit or miss); checks it in",
    )
    rep.add_argument("--cache-root", type=Path, help="VLLM_CACHE_ROOT (default: vLLM's)")
    rep.add_argument("--log", type=Path, help="vLLM's log (its 'Using cache directory' line)")
    rep.add_argument("--model", metavar="NS/NAME", help="the model, for the check-in")
    rep.add_argument("--cache-dir", type=Path, help="node cache (holds the node id)")
    rep.set_defaults(func=with_registry(cmd_warm_report))


def _serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="--FLAG=VALUE",
        help="a `vllm serve` argument that enters vLLM's cache key (repeat)",
    )


def cmd_warm(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    model = client.get_model(name)
    body: dict[str, Any] = {
        "dtype": args.dtype or "bfloat16",
        "format": args.format or "vllm",
        "tensor_parallel_size": args.tp or 1,
        "encrypted": bool(args.encrypted),
        "serve_args": list(args.serve_arg),
    }
    version = client.version_for_ref(str(model["id"]), ref)
    if version is not None:
        body["version"] = version
    response = client.request("POST", f"/api/v1/models/{model['id']}/warm", json=body)
    payload = dict(response.json())
    if "kind" not in payload:  # the bundle itself: already ready
        say(f"already warm: bundle {payload['id']} is {payload['status']}")
        print_json(payload) if args.json else print(payload["id"])
        return 0
    job_id = str(payload["id"])
    say(f"job {job_id} {payload['status']}")
    if not args.wait:
        print_json(payload) if args.json else print(job_id)
        return 0
    return follow_job(client, job_id, as_json=args.json)


def cmd_warm_restore(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    answer = client.resolve(name, ref, **variant_filters(args))
    cache_root = (args.cache_root or default_cache_root()).expanduser()
    mine = node_key(
        model=args.model_path,
        dtype=str(answer.artifact["dtype"]),
        tensor_parallel_size=int(answer.artifact["tensor_parallel_size"]),
        serve_args=args.serve_arg,
        gpu=args.gpu,
    )
    try:
        keys = trusted_keys(client, trusted=args.trusted_key)
    except TrustError as exc:
        if not args.allow_unsigned:
            say(f"error: {exc}")
            return 1
        keys = {}
    try:
        restored = restore_for(
            answer.data, mine, cache_root, keys=keys, allow_unsigned=args.allow_unsigned
        )
    except WarmBundleError as exc:
        say(f"error: warm bundle refused: {exc}")
        return 1
    out = restored.as_dict()
    if out["expect"] == "miss":
        say("warm bundle not restored: " + "; ".join(restored.differed))
    else:
        say(f"restored warm bundle {restored.bundle_id}: {', '.join(restored.dirs)}")
    print_json(out)
    return 0


def cmd_warm_report(args: argparse.Namespace, client: RegistryClient) -> int:
    cache_root = (args.cache_root or default_cache_root()).expanduser()
    log_text = None
    if args.log is not None:
        with args.log.open("rb") as fh:
            log_text = fh.read(MAX_LOG_BYTES).decode("utf-8", "replace")
    try:
        state, outcome = report(cache_root, log_text=log_text)
    except WarmBundleError as exc:
        say(f"error: {exc}")
        return 1
    entry = checkins.load_entry(
        by="vllm",
        model=args.model or "",  # None below: the registry then checks no namespace
        ref=None,
        artifact_id=state.get("artifact_id"),
        path="warm",
        seconds=0.0,
        verified=bool(state.get("bundle_dirs")),
        warm=checkin_entry(state, outcome),
    )
    if not args.model:
        entry["model"] = None
    checkins.report(client, NodeCache(args.cache_dir).root, entry)
    print(json.dumps({**outcome.as_dict(), "bundle_id": state.get("bundle_id")}), flush=True)
    if outcome.result == "miss":
        print("warm bundle MISS: " + "; ".join(outcome.differed), file=sys.stderr)
    return 0
