"""The engine's first load in a fresh process (what a vLLM rank pays: one load per process).

    python3 bench/first_load.py --size-gb 1.35 --out $OUT     # on a CUDA machine

The real-vLLM bench (bench/vllm_plugin_real.py) found the plugin's ``load_weights`` at 1.4-6.1 s
for a 1.35 GB model where vLLM's tensorizer loader took 0.56-0.74 s, nearly all of it in the
engine's set-up (``allocate_s``): Triton's kernel for the chunk digests and the pinned ring.
This writes one tensorizer file (+ layout manifest), reads it once (hot page cache), then loads
it in one fresh process per arm, CUDA already initialised (as in vLLM), and prints each arm's
seconds and set-up phases: signed URL and node-cache file, digests on the device with a cold
and a warm Triton cache or on host threads, the old 32-buffer ring or the sized one; and
tensorizer's own reader from the file, 16 readers, for comparison. Writes first_load.json.
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

ROOT = Path(__file__).resolve().parent.parent
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
    from app.client import engine
    from app.client.layout import loads

    layout = loads(Path(spec["layout"]).read_bytes()).files[0]
    phases: dict[str, Any] = {}
    t = time.perf_counter()
    tensors = engine.load_cuda(
        layout,
        path=spec.get("path"),
        url=spec.get("url"),
        device="cuda",
        verify=True,
        digest_on=spec["digest_on"],
        register_fraction=spec.get("fraction", 0.0),
        ring_buffers=spec.get("ring"),
        phases=phases,
    )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "tensors": len(tensors), "phases": phases}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=1.35)
    parser.add_argument("--workdir", default="/tmp/first-load")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    from tensorizer import TensorSerializer

    from app.client.layout import ArtifactLayout, build_file_layout
    from bench.engine_gpu import make_state
    from bench.gpu_load import builtin_server

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
        arms: list[tuple[str, dict[str, Any], str]] = [
            (
                "url, device digests, cold Triton cache, 32-buffer ring",
                {"url": url, "digest_on": "device", "ring": 32},
                cold,
            ),
            (
                "url, device digests, warm Triton cache, 32-buffer ring",
                {"url": url, "digest_on": "device", "ring": 32},
                cold,
            ),
            (
                "url, device digests, warm cache, sized ring",
                {"url": url, "digest_on": "device"},
                cold,
            ),
            ("url, host digests, sized ring", {"url": url, "digest_on": "host"}, cold),
            (
                "file 0.5, device digests, warm cache, sized ring",
                {"path": str(path), "digest_on": "device", "fraction": 0.5},
                cold,
            ),
            (
                "file 0.5, device digests, warm cache, 32-buffer ring",
                {"path": str(path), "digest_on": "device", "fraction": 0.5, "ring": 32},
                cold,
            ),
            (
                "file 0.5, host digests, sized ring",
                {"path": str(path), "digest_on": "host", "fraction": 0.5},
                cold,
            ),
            ("tensorizer, file, 16 readers", {"mode": "tensorizer", "path": str(path)}, cold),
        ]
        for name, spec, cache in arms:
            spec = {"mode": "engine", **base, **spec}
            env = {**os.environ, "TRITON_CACHE_DIR": cache}
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
            print(f"{name:55s} {seconds:.3f} s  {detail}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "first_load.json").write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
