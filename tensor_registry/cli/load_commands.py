"""`tensor-registry load` and `bench-load`: the load engine from the command line.

    tensor-registry load acme/llama:prod --device cuda          # one load: a table
    tensor-registry bench-load acme/llama:prod --runs 3         # GB/s per run, best, median

Both resolve, load rank ``--rank``'s file with tensor_registry.engine (the node cache's copy when it
has one, else the signed URL) and print what happened, a table (``--json``: one JSON line per
run, then the summary): which path loaded it (``engine`` or the ``tensorizer`` fallback, with
the reason), from where, bytes, seconds, GB/s, and the seconds of each step. The
tensors are dropped afterwards: these commands measure and check, `pull --weights` keeps bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from tensor_registry import checkins
from tensor_registry.api.client import RegistryClient, RegistryError
from tensor_registry.api.resolution import parse_model_ref
from tensor_registry.cli.flags import (
    add_checkin_flag,
    add_keyfile,
    add_variant_flags,
    allow_unsigned_flag,
    connection_parser,
    json_flag,
    require_flag,
)
from tensor_registry.cli.output import format_size, one_line, print_table
from tensor_registry.config import connection
from tensor_registry.formats.layout import LayoutError
from tensor_registry.node_cache import NodeCache

if TYPE_CHECKING:
    from tensor_registry.engine import LoadResult


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False, parents=[connection_parser(), json_flag()])
    common.add_argument("model", metavar="NS/NAME[:REF]", help="model, optionally :alias|:N")
    common.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    common.add_argument("--rank", type=int, default=0, help="tensor-parallel rank to load")
    add_variant_flags(common)
    add_keyfile(common)
    common.add_argument("--connections", type=int, help="parallel range connections/readers")
    common.add_argument(
        "--no-verify", action="store_true", help="skip the chunk digests (not advised)"
    )
    common.add_argument(
        "--register-fraction",
        type=float,
        help="cuda + node cache: share of the file pinned in place (default: the advice)",
    )
    allow_unsigned_flag(common)
    add_checkin_flag(common)
    load = sub.add_parser(
        "load", parents=[common], help="load an artifact with the engine and report GB/s"
    )
    load.set_defaults(func=lambda args: _run(args, runs=1))
    bench = sub.add_parser(
        "bench-load", parents=[common], help="load an artifact --runs times, report GB/s"
    )
    bench.add_argument("--runs", type=int, default=3)
    bench.set_defaults(func=lambda args: _run(args, runs=max(1, args.runs)))


def _run(args: argparse.Namespace, *, runs: int) -> int:
    from tensor_registry.engine import load_artifact, result_json
    from tensor_registry.engine.artifacts import phase_seconds

    filters: dict[str, Any] = {
        k: v
        for k, v in (
            ("dtype", args.dtype),
            ("format", args.format),
            ("tensor_parallel_size", args.tp),
            ("encrypted", args.encrypted),
        )
        if v is not None
    }
    rates: list[float] = []
    rows: list[list[Any]] = []
    try:
        conn = connection(args.url, args.token)
        # The node's own key: load_artifact then resolves with key_url=false.
        key = RegistryClient.read_key_file(args.keyfile) if args.keyfile else None
    except (RegistryError, OSError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    with RegistryClient(conn.url, conn.token or "") as client:
        for _ in range(runs):
            started = time.perf_counter()
            try:
                result = load_artifact(
                    args.model,
                    client=client,
                    rank=args.rank,
                    device=args.device,
                    verify=not args.no_verify,
                    connections=args.connections,
                    register_fraction=args.register_fraction,
                    key=key,
                    require_signed=require_flag(args),
                    **filters,
                )
            except (RegistryError, LayoutError, OSError) as exc:
                print(f"error: {one_line(str(exc))}", file=sys.stderr)
                _check_in(args, client, None, time.perf_counter() - started, error=str(exc))
                return 1
            if args.json:
                print(result_json(result), flush=True)
            else:
                rows.append(_row(len(rows) + 1, result, phase_seconds(result)))
                if result.reason:
                    print(f"tensorizer path: {one_line(result.reason)}", file=sys.stderr)
            _check_in(args, client, result, result.seconds, error=None)
            rates.append(result.gbps)
            del result
    summary = {
        "runs": runs,
        "best_gbps": round(max(rates), 3),
        "median_gbps": round(statistics.median(rates), 3),
    }
    if args.json:
        if runs > 1:
            print(json.dumps(summary))
        return 0
    print_table(HEADERS, rows)
    if runs > 1:
        print(
            f"{runs} runs: best {summary['best_gbps']:.2f} GB/s, median "
            f"{summary['median_gbps']:.2f} GB/s"
        )
    return 0


# The step columns add up to SECONDS (OTHER: resolving and what no step covers).
HEADERS = ["RUN", "PATH", "SOURCE", "DEVICE", "SIZE", "SECONDS", "GB/S", "VERIFIED", "SIGNED",
           "SIGNATURE", "LAYOUT", "READ", "OTHER"]  # fmt: skip


def _row(run: int, result: LoadResult, steps: dict[str, float]) -> list[Any]:
    return [
        run,
        result.path,
        result.source,
        result.device,
        format_size(result.bytes),
        f"{result.seconds:.3f}",
        f"{result.gbps:.2f}",
        "yes" if result.verified else "no",
        result.signed_by or "unsigned",
        *(f"{steps[k]:.3f}" for k in ("signature", "layout", "read", "other")),
    ]


def _check_in(
    args: argparse.Namespace,
    client: RegistryClient,
    result: LoadResult | None,
    seconds: float,
    *,
    error: str | None,
) -> None:
    """One check-in per load, done or failed (tensor_registry/checkins.py: never fails it)."""
    if args.no_checkin:
        return
    try:
        name, ref = parse_model_ref(args.model)
    except RegistryError:
        name, ref = args.model[:128], None
    entry = checkins.load_entry(
        by=args.command,
        model=result.model if result and result.model else name,
        ref=ref,
        artifact_id=result.artifact_id if result else None,
        version=result.version if result else None,
        path=result.path if result else "none",
        seconds=seconds,
        gbps=result.gbps if result else None,
        verified=result.verified if result else False,
        rank=args.rank,
        error=error,
    )
    cache = NodeCache()
    checkins.report(client, cache.root, entry, cached=cache.artifacts())
