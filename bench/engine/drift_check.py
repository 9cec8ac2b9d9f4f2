"""How much one GPU host's rates drift from moment to moment, and which of them drift.

    python3 bench/engine/drift_check.py --out $OUT          # GPU machine (carry .whl)

Writes bench/engine/engine_gpu.py's 10 GB file (tensorizer + layout manifest) and reads it into the
page cache; then, for ``--seconds`` while the kernel writes the dirty pages back and after,
repeats three arms back to back: the pinned → device copy of the file's bytes (the issue's
baseline), the page cache → pinned host copy alone (12 threads ``preadv`` 64 MiB blocks,
bench/engine/url_ceiling.py's ``pread`` arm) and the engine's ring-only load (``load_cuda``,
register 0, verified on the device, 12 readers). Each row: seconds since the file was written, the
three GB/s, the load ÷ that moment's pinned copy, and the Dirty and Writeback MB of
/proc/meminfo. Prints a line per round and a summary; writes drift_check.json.

Run 44 (first form, ring-only loads alone): 70 loads in a minute on one host, same code and
file, 29.0-46.6 GB/s, with no dip while 9 GB of dirty pages were written back (bench/results/
engine.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1e9


def meminfo_mb(*fields: str) -> dict[str, int]:
    found: dict[str, int] = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in fields:
                found[name] = int(rest.split()[0]) // 1024
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=10)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workdir", default="/tmp/drift-check")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    import torch

    from bench.engine.engine_gpu import make_state, timed, write_artifact
    from bench.engine.url_ceiling import Buffers, pread_arm
    from tensor_registry.engine import wait_released
    from tensor_registry.engine.cuda import load_cuda

    path = Path(args.workdir) / "model.tensors"
    manifest = write_artifact(path, make_state(int(args.size_gb * GB)))
    written = time.monotonic()  # once written and read in (run 45: once written)
    size = path.stat().st_size
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(7)
    device = torch.empty(size, dtype=torch.uint8, device="cuda")
    pread = pread_arm(path, size, Buffers(12, pinned=True))

    def engine() -> Any:
        return load_cuda(manifest, path=path, readers=12, verify=True, digest_on="device")

    engine()  # the ring and the kernels, once
    wait_released()
    rows: list[dict[str, Any]] = []
    while time.monotonic() - written < args.seconds:
        pinned = size / timed(lambda: device.copy_(host, non_blocking=True))[0] / GB
        host_copy = size / timed(lambda: pread(12))[0] / GB
        seconds, loaded = timed(engine)
        del loaded
        wait_released()
        load = size / seconds / GB
        row = {
            "t": round(time.monotonic() - written, 1),
            "pinned": round(pinned, 1),
            "pread": round(host_copy, 1),
            "load": round(load, 1),
            "ratio": round(load / pinned, 3),
            **meminfo_mb("Dirty", "Writeback"),
        }
        rows.append(row)
        print(row, flush=True)
    summary = {
        arm: [
            min(r[arm] for r in rows),
            statistics.median(r[arm] for r in rows),
            max(r[arm] for r in rows),
        ]
        for arm in ("pinned", "pread", "load", "ratio")
    }
    print("min / median / max:", summary, flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "drift_check.json").write_text(
        json.dumps({"rows": rows, "summary": summary}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
