"""What the engine's device BLAKE3 costs a fresh process before its first launch, and whether it
is right (tensor_registry/engine/kernels.py: CUDA C built by NVRTC, cubin cached on disk).

    python3 bench/engine/kernel_start.py --out $OUT      # on a CUDA machine

Three fresh processes in a row on one empty kernel cache (the first builds the cubin, the
others load it), each with CUDA initialised first (as in vLLM): seconds to import the module
and to run ``warm_up`` (build or load, one launch of each kernel), then bench/engine/engine_gpu.py's
device digest check (the blake3 package's digests on random bytes with a shorter last chunk,
one flipped byte found, the kernels' rate alone on 4 GiB). Writes kernel_start.json.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def child() -> dict[str, object]:
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    t = time.perf_counter()
    from tensor_registry.engine import gpu_blake3
    from tensor_registry.formats.layout import CHUNK_BYTES

    imported = time.perf_counter() - t
    t = time.perf_counter()
    gpu_blake3.warm_up(torch.device("cuda", 0), CHUNK_BYTES)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t
    from bench.engine.engine_gpu import device_digest_check

    return {"import_s": imported, "warm_up_s": warm, "check": device_digest_check()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child()))
        return 0
    cache = tempfile.mkdtemp(prefix="kernel-cache-")
    env = {**os.environ, "TENSOR_REGISTRY_KERNEL_CACHE": cache}
    runs = []
    for name in ("empty cache", "cached cubin", "cached cubin again"):
        t = time.perf_counter()
        done = subprocess.run(
            [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"error": done.stderr[-3000:]}
        result.update(run=name, process_wall_s=time.perf_counter() - t)
        runs.append(result)
        print(json.dumps(result), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "kernel_start.json").write_text(json.dumps(runs, indent=1))
    ok = all(r.get("check", {}).get("ok") for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
