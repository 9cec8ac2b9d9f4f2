"""The engine's public call against the other ways onto a GPU (issue 35 §0), one process.

    python3 bench/engine/public_load.py --size-gb 7.81 --rounds 5 --out $OUT   # GPU machine
    .venv/bin/python bench/engine/public_load.py --size-gb 0.05 --rounds 1 --cpu-check  # here

A real ``tensor-registry serve`` (embedded: SQLite, local storage) holds a Llama-shaped bf16
artifact (bench/common.py's ``llama_config`` at hidden 4096: 7.81 GB is 18 layers, 165
tensors), tensorized, with its layout manifest and a manifest signed by the registry's key
(tensor_registry_server.artifacts.making.signatures.backfill_manifest), alias ``prod``. The
weights sit in the node cache (hard link, recorded for the artifact's compatibility key), page
cache warm. The node finds the registry and its cache through the environment
(TENSOR_REGISTRY_URL, _TOKEN, _CACHE_DIR), so the engine arms are the library's public call
with its defaults, exactly:

    tensor_registry.engine.load_artifact("bench/public:prod", device="cuda")

Arms, interleaved round by round (the order rotating), each timed by the wall clock around the
whole call (resolve and signature check included) and ``torch.cuda.synchronize()``:

- ``engine, node cache``: the call above; the node decides how (tensor_registry.engine.plan);
- ``engine, signed URL``: the same call with an empty node cache: the engine reads the signed
  URL that ``serve`` answered;
- ``engine, node cache, register 1.0`` / ``0.0``: ``options=LoadOptions(register_fraction=…)``,
  what the plan chose between (1.0: the registry's advice that the node followed before);
- ``tensorizer, unverified`` / ``verified``: ``TensorDeserializer(file, device="cuda",
  num_readers=16, verify_hash=…)`` on the node cache's file;
- ``safetensors``: ``safetensors.torch.load_file(file, device="cuda")`` of the same tensors;
- ``pinned copy``: one copy of the same number of bytes from pinned host memory (the ceiling).

The first load of every arm is compared with the source tensors, bit for bit. Prints a table
(median and best GB/s of the tensor bytes, ÷ the pinned copy, ÷ tensorizer unverified) and the
engine's phases; writes public_load.json under --out. ``--cpu-check``: everything on the CPU
(device "cpu", no pinned copy), to check the bench itself where no GPU is.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import llama_config  # noqa: E402
from bench.engine.load import (  # noqa: E402
    ADMIN_TOKEN,
    GB,
    ready_version,
    register_artifact,
    registry,
    write_tensorizer,
)
from bench.engine.trust_cpu import _sign  # noqa: E402

MODEL = "bench/public"


def llama_tensors(target_bytes: int, device: str, hidden: int = 4096) -> dict[str, Any]:
    """Random bf16 tensors in a Llama's names and shapes (``llama_config``)."""
    import torch

    cfg: Any = llama_config(target_bytes, 2, hidden=hidden)
    h, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = h // cfg.num_attention_heads * cfg.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    g = torch.Generator(device=device).manual_seed(35)
    return {
        name: torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
        for name, shape in shapes.items()
    }


def same(loaded: dict[str, Any], source: dict[str, Any]) -> bool:
    import torch

    if set(loaded) != set(source):
        return False
    return all(torch.equal(loaded[k].to(source[k].device), source[k]) for k in source)


def publish(reg: Any, work: Path, tensors: dict[str, Any]) -> tuple[Path, Path]:
    """The tensorized artifact with its layout manifest and signed manifest, alias prod; the
    weights hard-linked into a node cache; returns (node cache dir, the cached file)."""
    import httpx

    from tensor_registry import RegistryClient
    from tensor_registry.formats.layout import LAYOUT_FILE, ArtifactLayout, build_file_layout
    from tensor_registry.node_cache import NodeCache

    staging = work / "staging"
    staging.mkdir()
    weights = staging / "model.tensors"
    write_tensorizer(weights, {k: v.cpu() for k, v in tensors.items()})
    with weights.open("rb") as fh:
        layout = build_file_layout(
            fh, "model.tensors", size=weights.stat().st_size, threads=os.cpu_count() or 4
        )
    (staging / LAYOUT_FILE).write_bytes(ArtifactLayout(files=(layout,)).dumps())
    model = ready_version(reg, MODEL)
    artifact_id = register_artifact(
        reg, MODEL, 1, {"model.tensors": weights, LAYOUT_FILE: staging / LAYOUT_FILE}
    )
    asyncio.run(_sign(reg.settings(), artifact_id))
    with httpx.Client(
        base_url=reg.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
    ) as http:
        http.put(
            f"/api/v1/models/{model['id']}/aliases/prod", json={"version": 1}
        ).raise_for_status()
    with RegistryClient(reg.url, ADMIN_TOKEN) as client:
        answer = client.resolve(MODEL, "prod")
    entry = next(f for f in answer.files if f.path == "model.tensors")
    cache_dir = work / "node-cache"
    cache = NodeCache(cache_dir)
    cached = cache.path(entry.sha256)
    cached.parent.mkdir(parents=True, exist_ok=True)
    os.link(
        reg.settings().local_storage_root / "artifacts" / answer.artifact_id / "model.tensors",
        cached,
    )
    cache.record_compatibility(entry.sha256, answer.data["compatibility_key"])
    # Hashed once and stamped here, as the node's own download does: without the stamp the
    # first load's check of the cached object hashed all of it again (6.2 s of round 0 in the
    # nineteenth session's first run, which was taken for set-up of the process).
    if not cache.contains(
        entry.sha256, entry.size, compatibility_key=answer.data["compatibility_key"]
    ):
        raise RuntimeError("the file linked into the node cache does not hash to its sha256")
    return cache_dir, cached


def arms(
    device: str, cache_dir: Path, empty_cache: Path, cached: Path, st_path: Path, nbytes: int
) -> dict[str, Callable[[], dict[str, Any]]]:
    import torch

    from tensor_registry.engine import LoadOptions, load_artifact, wait_released

    phases: dict[str, list[dict[str, Any]]] = {}

    def engine(cache: Path, label: str, options: LoadOptions | None = None) -> Callable[[], Any]:
        def run() -> dict[str, Any]:
            os.environ["TENSOR_REGISTRY_CACHE_DIR"] = str(cache)
            result = load_artifact(f"{MODEL}:prod", device=device, options=options)
            assert result.path == "engine" and result.signed_by is not None, result
            phases.setdefault(label, []).append(
                {"source": result.source, "seconds": result.seconds, **result.phases}
            )
            return result.tensors

        return run

    def tensorizer(verify: bool) -> Callable[[], Any]:
        def run() -> dict[str, Any]:
            from tensorizer import TensorDeserializer

            with TensorDeserializer(
                str(cached), device=device, num_readers=16, verify_hash=verify
            ) as d:
                return dict(d.items())

        return run

    def safetensors() -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(str(st_path), device=device)

    table: dict[str, Callable[[], Any]] = {
        "engine, node cache": engine(cache_dir, "engine, node cache"),
        "engine, signed URL": engine(empty_cache, "engine, signed URL"),
        "engine, node cache, register 1.0": engine(
            cache_dir, "engine, node cache, register 1.0", LoadOptions(register_fraction=1.0)
        ),
        "engine, node cache, register 0.0": engine(
            cache_dir, "engine, node cache, register 0.0", LoadOptions(register_fraction=0.0)
        ),
        "tensorizer, unverified": tensorizer(False),
        "tensorizer, verified": tensorizer(True),
        "safetensors": safetensors,
    }
    if device.startswith("cuda"):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(7)
        dest = torch.empty(nbytes, dtype=torch.uint8, device=device)

        def pinned_copy() -> dict[str, Any]:
            dest.copy_(host, non_blocking=True)
            return {}

        table["pinned copy"] = pinned_copy
    arms.phases = phases  # type: ignore[attr-defined]
    arms.wait_released = wait_released  # type: ignore[attr-defined]
    return table


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = "cpu" if args.cpu_check else "cuda"
    work = Path(tempfile.mkdtemp(prefix="bench-public-", dir=args.workdir))
    os.environ["TENSOR_REGISTRY_CONFIG_DIR"] = str(work / "client-config")
    try:
        source = llama_tensors(int(args.size_gb * GB), device, args.hidden)
        nbytes = sum(t.numel() * t.element_size() for t in source.values())
        st_path = work / "model.safetensors"
        from safetensors.torch import save_file

        save_file({k: v.cpu() for k, v in source.items()}, str(st_path))
        with registry(work / "data") as reg:
            cache_dir, cached = publish(reg, work, source)
            empty = work / "empty-cache"
            empty.mkdir()
            os.environ["TENSOR_REGISTRY_URL"] = reg.url
            os.environ["TENSOR_REGISTRY_TOKEN"] = ADMIN_TOKEN
            for path in (cached, st_path):  # page cache warm
                with path.open("rb") as fh:
                    while fh.read(64 << 20):
                        pass
            table = arms(device, cache_dir, empty, cached, st_path, nbytes)
            names = list(table)
            seconds: dict[str, list[float]] = {n: [] for n in names}
            exact: dict[str, bool] = {}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    gc.collect()
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    loaded = table[name]()
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    seconds[name].append(time.perf_counter() - t)
                    if name not in exact and name != "pinned copy":
                        exact[name] = same(loaded, source)
                    del loaded
                    arms.wait_released()  # type: ignore[attr-defined]
                print(
                    json.dumps({"round": r, **{n: round(s[-1], 4) for n, s in seconds.items()}}),
                    flush=True,
                )
        return {
            "bytes": nbytes,
            "tensors": len(source),
            "file_bytes": cached.stat().st_size if cached.exists() else None,
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
            "seconds": seconds,
            "bit_exact": exact,
            "phases": arms.phases,  # type: ignore[attr-defined]
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(result: dict[str, Any]) -> str:
    nbytes = result["bytes"]
    med = {n: statistics.median(s) for n, s in result["seconds"].items()}
    best = {n: min(s) for n, s in result["seconds"].items()}
    pinned = nbytes / med["pinned copy"] / GB if "pinned copy" in med else None
    tz = nbytes / med["tensorizer, unverified"] / GB
    lines = [
        f"{nbytes / GB:.2f} GB in {result['tensors']} tensors, {result['device']}, "
        f"{result['cpus']} CPUs, {result['rounds']} rounds (median; best in brackets)",
        "| arm | s | GB/s | ÷ pinned copy | ÷ tensorizer unverified | bit-exact |",
        "|---|---|---|---|---|---|",
    ]
    for name in med:
        rate, top = nbytes / med[name] / GB, nbytes / best[name] / GB
        ratio = f"{rate / pinned:.2f}" if pinned else "-"
        lines.append(
            f"| {name} | {med[name]:.3f} ({best[name]:.3f}) | {rate:.1f} ({top:.1f}) | {ratio} "
            f"| {rate / tz:.2f} | {result['bit_exact'].get(name, '-')} |"
        )
    url, cache = med.get("engine, signed URL"), med.get("engine, node cache")
    if url and cache:
        lines.append(f"signed URL ÷ node cache: {cache / url:.2f}")
    # Round 0's first arm is the process's first call: what a node's fresh process waits.
    lines.append(
        "round 0 (the first call of the process first): "
        + ", ".join(f"{n} {s[0]:.3f} s" for n, s in result["seconds"].items())
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=7.81)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--cpu-check", action="store_true")
    parser.add_argument("--hidden", type=int, default=4096, help="smaller for --cpu-check")
    args = parser.parse_args()
    result = run(args)
    text = report(result)
    print(text)
    for name, runs in result["phases"].items():
        print(name, json.dumps(runs[-1], default=str))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "public_load.json").write_text(json.dumps(result, indent=1, default=str))
        (Path(args.out) / "public_load.md").write_text(text + "\n")
    return 0 if all(result["bit_exact"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
