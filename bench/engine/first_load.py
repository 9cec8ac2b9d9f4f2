"""The engine's first load in a fresh process (what a vLLM rank pays: one load per process).

    python3 bench/engine/first_load.py --size-gb 1.35 --out $OUT     # on a CUDA machine

The real-vLLM bench (bench/vllm/vllm_plugin_real.py) found the plugin's ``load_weights`` at 1.4-6.1
s for a 1.35 GB model where vLLM's tensorizer loader took 0.56-0.74 s, nearly all of it in the
engine's set-up (``allocate_s``): the (then Triton) digest kernel's start and the pinned ring.
This writes one tensorizer file (+ layout manifest), reads it once (hot page cache), then loads
it in one fresh process per arm, CUDA already initialised (as in vLLM), and prints each arm's
seconds and set-up phases: signed URL and node-cache file, digests on the device with an empty
and a filled kernel cache or on host threads, the old 32-buffer ring or the sized one, the split
fixed, balanced or pinning only; and tensorizer's own reader from the file, 16 readers, for
comparison. ``--set big``: the same questions for a >= 10 GB file, against the pinned copy.
Writes first_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1e9


def child(args: argparse.Namespace) -> None:
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    spec = json.loads(args.child)
    if spec["mode"] == "tensorizer":
        from tensorizer import TensorDeserializer

        t = time.perf_counter()
        with TensorDeserializer(spec["path"], device="cuda", num_readers=16) as d:
            n = sum(v.numel() for v in d.values())
        torch.cuda.synchronize()
        print(json.dumps({"seconds": time.perf_counter() - t, "elements": n}))
        return
    if spec["mode"] == "pinned":  # the baseline: one pinned → device copy of the same bytes
        size = spec["bytes"]
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(7)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        print(json.dumps({"seconds": best}))
        return
    from tensor_registry import engine
    from tensor_registry.engine import pinned
    from tensor_registry.formats.layout import loads

    pinned.RING_HUGE_PAGES = spec.get("huge", True)
    pinned.POPULATE_THREADS = spec.get("populate", pinned.POPULATE_THREADS)
    layout = loads(Path(spec["layout"]).read_bytes()).files[0]
    runs = []
    for _ in range(spec.get("repeat", 1)):
        phases: dict[str, Any] = {}
        t = time.perf_counter()
        tensors = engine.load_cuda(
            layout,
            path=spec.get("path"),
            url=spec.get("url"),
            device="cuda",
            verify=spec.get("verify", True),
            digest_on=spec["digest_on"],
            register_fraction=spec.get("fraction", 0.0),
            balance=spec.get("balance"),
            readers=spec.get("readers", 16),
            ring_buffers=spec.get("ring"),
            phases=phases,
        )
        torch.cuda.synchronize()
        runs.append({"seconds": time.perf_counter() - t, "phases": phases})
        del tensors
        engine.wait_released()
    print(json.dumps({**runs[0], "tensors": len(layout.tensors), "later": runs[1:]}))


Arm = tuple[str, dict[str, Any], str]


def _first_arms(path: Path, url: str, cold: str) -> list[Arm]:
    """A vLLM-sized model's first load: digests on the device (empty and filled kernel cache) or
    the host, the old 32-buffer ring or the sized one, URL and node-cache file, the split fixed
    at 0.5, balanced, or pinning only (the advice)."""
    file = {"path": str(path)}
    return [
        (
            "url, device digests, empty kernel cache, 32-buffer ring",
            {"url": url, "digest_on": "device", "ring": 32},
            cold,
        ),
        (
            "url, device digests, cached kernels, 32-buffer ring",
            {"url": url, "digest_on": "device", "ring": 32},
            cold,
        ),
        ("url, device digests, warm cache, sized ring", {"url": url, "digest_on": "device"}, cold),
        ("url, host digests, sized ring", {"url": url, "digest_on": "host"}, cold),
        (
            "file 0.5, device digests, warm cache, sized ring",
            {**file, "digest_on": "device", "fraction": 0.5},
            cold,
        ),
        (
            "file 0.5, host digests, sized ring",
            {**file, "digest_on": "host", "fraction": 0.5},
            cold,
        ),
        (
            "file 0.5 balanced, host digests",
            {**file, "digest_on": "host", "fraction": 0.5, "balance": True},
            cold,
        ),
        (
            "file 1.0 (pinning only), host digests",
            {**file, "digest_on": "host", "fraction": 1.0},
            cold,
        ),
        (
            "file 1.0 (pinning only), unverified",
            {**file, "digest_on": "host", "fraction": 1.0, "verify": False},
            cold,
        ),
        ("tensorizer, file, 16 readers", {"mode": "tensorizer", **file}, cold),
    ]


def _big_arms(path: Path, url: str, size: int, cold: str) -> list[Arm]:
    """A >= 10 GB file, each arm a fresh process loading it twice (the second finds the ring
    filled and the digest kernel running): pinning only (the advice), fixed and balanced 0.5,
    the URL, tensorizer's reader; the pinned copy of the same bytes is the baseline."""
    file = {"path": str(path), "readers": 12, "repeat": 2}
    url_arm = {"url": url, "readers": 12, "repeat": 2}
    plain = {"verify": False, "digest_on": "host"}
    return [
        ("pinned copy (baseline)", {"mode": "pinned", "bytes": size}, cold),
        ("file 1.0 (pinning only), unverified", {**file, "fraction": 1.0, **plain}, cold),
        (
            "file 1.0 (pinning only), host digests",
            {**file, "fraction": 1.0, "digest_on": "host"},
            cold,
        ),
        (
            "file 1.0 (pinning only), device digests",
            {**file, "fraction": 1.0, "digest_on": "device"},
            cold,
        ),
        ("file 0.5 fixed, unverified", {**file, "fraction": 0.5, **plain}, cold),
        ("file 0.5 fixed, device digests", {**file, "fraction": 0.5, "digest_on": "device"}, cold),
        (
            "file 0.5 balanced, unverified",
            {**file, "fraction": 0.5, "balance": True, **plain},
            cold,
        ),
        ("url 12 connections, unverified", {**url_arm, **plain}, cold),
        ("url 12 connections, host digests", {**url_arm, "digest_on": "host"}, cold),
        ("tensorizer, file, 16 readers", {"mode": "tensorizer", "path": str(path)}, cold),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=1.35)
    parser.add_argument("--workdir", default="/tmp/first-load")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--child", default=None)
    parser.add_argument(
        "--set",
        default="first",
        choices=["first", "big"],
        help="first: the vLLM-sized first-load arms; big: a >= 10 GB file in fresh processes, "
        "each loading it twice, with the pinned copy of the same bytes as the baseline",
    )
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    from tensorizer import TensorSerializer

    from bench.engine.engine_gpu import make_state
    from bench.engine.gpu_load import builtin_server
    from tensor_registry.formats.layout import ArtifactLayout, build_file_layout

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "model.tensors"
    state = {k: v.cpu() for k, v in make_state(int(args.size_gb * GB)).items()}
    serializer = TensorSerializer(str(path))
    serializer.write_state_dict(state)
    serializer.close()
    del state
    size = path.stat().st_size
    with path.open("rb") as fh:
        layout = build_file_layout(fh, path.name, size=size, threads=16)
    (work / "layout.json").write_bytes(ArtifactLayout(files=(layout,)).dumps())
    with path.open("rb") as fh:
        while fh.read(64 << 20):
            pass
    cold = tempfile.mkdtemp(prefix="triton-cold-")
    log: dict[str, Any] = {"bytes": size, "tensors": len(layout.tensors), "arms": {}}
    base = {"layout": str(work / "layout.json")}
    with builtin_server(work) as sign:
        url = sign(path.name)
        arms: list[tuple[str, dict[str, Any], str]] = (
            _big_arms(path, url, size, cold) if args.set == "big" else _first_arms(path, url, cold)
        )
        for name, spec, cache in arms:
            spec = {"mode": "engine", **base, **spec}
            env = {**os.environ, "TENSOR_REGISTRY_KERNEL_CACHE": cache}
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(spec)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            wall = time.perf_counter() - t
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            result: dict[str, Any] = (
                json.loads(lines[-1])
                if lines and done.returncode == 0
                else {"error": done.stderr[-2000:]}
            )
            result["process_wall_s"] = wall
            log["arms"][name] = result
            phases: dict[str, Any] = result.get("phases", {})
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in phases.items()}
            seconds = result.get("seconds", float("nan"))
            detail = shown or str(result.get("error", ""))[-300:]
            later = [round(r["seconds"], 3) for r in result.get("later", [])]
            rate = f"{size / seconds / GB:.1f} GB/s" if seconds == seconds else ""
            print(f"{name:55s} {seconds:.3f} s {rate} then {later}  {detail}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "first_load.json").write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
