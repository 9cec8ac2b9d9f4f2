"""The load engine on CPU (a CI-sized machine): ratios against baselines of the same run.

A real `tensor-registry serve` (embedded: SQLite + local storage) holds a tensorizer artifact of
``--size-gb`` random bf16 tensors with its layout manifest. Interleaved, best of ``--runs``:

- engine, node cache: ``load_artifact(..., device="cpu")`` finding the file in the node cache:
  zero-copy views of a private mmap, every 8 MiB chunk BLAKE3-checked on all cores (which
  reads every byte);
- safetensors: ``safetensors.torch.load_file`` of the same tensors, then every byte read
  (``bench/engine/load.py read_every_byte``: its tensors are mmap views too, so without reading
  them nothing was loaded); also plain ``load_file`` against the engine with verification off;
- engine, signed URL: ``load_artifact`` without the file cached: ``--connections`` parallel
  range connections into one anonymous mapping, chunks checked as they land;
- raw: the same URL, the same number of parallel single-range GETs straight into fresh memory
  (bench/engine/load.py ``raw_ranged_read``), no parsing, no checks.

Every arm's time includes freeing what it loaded (the engine arms drop their result, whose
mapping is unmapped then; the raw read frees its buffers before it returns). For the best run
of each arm the table also gives the CPU seconds this process and the server spent, and the
last line the blake3 package's speed on one core here: what verification adds on top of the
raw read's work.

    .venv/bin/python bench/engine/engine_cpu.py [--size-gb 1] [--connections 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.engine.load import (  # noqa: E402
    ADMIN_TOKEN,
    GB,
    random_tensors,
    raw_ranged_read,
    read_every_byte,
    ready_version,
    register_artifact,
    registry,
    write_tensorizer,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from safetensors.torch import load_file, save_file

    from tensor_registry import RegistryClient
    from tensor_registry.engine import load_artifact, load_file_cpu
    from tensor_registry.engine.cpu import usable_cores
    from tensor_registry.formats.layout import LAYOUT_FILE, ArtifactLayout, build_file_layout
    from tensor_registry.node_cache import NodeCache

    work = Path(tempfile.mkdtemp(prefix="bench-engine-cpu-"))
    try:
        tensors = random_tensors(int(args.size_gb * GB))
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        staging = work / "staging"
        staging.mkdir()
        weights = staging / "model.tensors"
        write_tensorizer(weights, tensors)
        st_path = work / "model.safetensors"
        save_file(tensors, str(st_path))
        del tensors
        with weights.open("rb") as fh:
            manifest = build_file_layout(fh, "model.tensors", size=weights.stat().st_size)
        (staging / LAYOUT_FILE).write_bytes(ArtifactLayout(files=(manifest,)).dumps())
        print(
            f"{nbytes / GB:.2f} GB of bf16 tensors, {args.connections} connections, "
            f"best of {args.runs}, {os.cpu_count()} CPUs"
        )
        with registry(work / "data") as reg:
            ready_version(reg, "bench/engine")
            register_artifact(
                reg,
                "bench/engine",
                1,
                {"model.tensors": weights, LAYOUT_FILE: staging / LAYOUT_FILE},
            )
            client = RegistryClient(reg.url, ADMIN_TOKEN)
            answer = client.resolve("bench/engine", ttl=3600, cpu_count=os.cpu_count())
            entry = next(f for f in answer.files if f.path == "model.tensors")
            url, size = entry.url, entry.size
            # Filled the way a node fills it (a node-cache file serves only the compatibility
            # key it was fetched for: a file linked in by hand would not count, and every
            # "node cache" arm would silently read the URL).
            cache = NodeCache(work / "cache")
            cache.fetch(
                url,
                sha256=entry.sha256,
                size=size,
                compatibility_key=answer.data.get("compatibility_key"),
            )
            cached = cache.path(entry.sha256)
            empty = NodeCache(work / "empty-cache")
            raw_ranged_read(url, size, args.connections)  # warm the page cache and the server
            read_every_byte(load_file(str(st_path)))

            def engine(cache_: NodeCache, verify: bool) -> Callable[[], Any]:
                def run() -> int:
                    result = load_artifact(
                        answer,
                        client=client,
                        cache=cache_,
                        verify=verify,
                        connections=args.connections,
                    )
                    assert result.path == "engine"
                    assert result.source == ("file" if cache_ is cache else "url"), result.source
                    return len(result.tensors)

                return run

            def safetensors_sha256() -> int:
                tensors = load_file(str(st_path))
                digest = hashlib.sha256()
                with st_path.open("rb") as fh:
                    while chunk := fh.read(16 << 20):
                        digest.update(chunk)
                return len(tensors)

            arms: dict[str, Callable[[], Any]] = {
                "engine node cache (verified)": engine(cache, True),
                "engine node cache (no verify)": engine(cache, False),
                "safetensors load_file + read every byte": lambda: read_every_byte(
                    load_file(str(st_path))
                ),
                "safetensors load_file": lambda: len(load_file(str(st_path))),
                "engine load_file_cpu, manifest in hand (no verify)": lambda: len(
                    load_file_cpu(cached, manifest, verify=False)
                ),
                "safetensors load_file + sha256 of the file": safetensors_sha256,
                "engine signed URL (verified)": engine(empty, True),
                "engine signed URL (no verify)": engine(empty, False),
                "raw ranged read": lambda: raw_ranged_read(url, size, args.connections),
            }
            best = {name: float("inf") for name in arms}
            # CPU seconds of the best run: this process and the server's, so the URL arms
            # show where two cores went (the raw read hashes nothing).
            cpu_of = {name: (0.0, 0.0) for name in arms}
            server = psutil.Process().children(recursive=True)
            for _ in range(args.runs):
                for name, fn in arms.items():
                    gc.collect()
                    before = _cpu_seconds(server)
                    started = time.perf_counter()
                    fn()
                    seconds = time.perf_counter() - started
                    after = _cpu_seconds(server)
                    if seconds < best[name]:
                        best[name] = seconds
                        cpu_of[name] = (after[0] - before[0], after[1] - before[1])
            client.close()
        hash_rate = _blake3_per_core(manifest.chunk_bytes)
        cores = usable_cores()
        print(f"{'arm':<50}{'seconds':>9}{'GB/s':>8}{'cpu s: client':>15}{'server':>8}")
        for name, seconds in best.items():
            mine, theirs = cpu_of[name]
            print(
                f"{name:<50}{seconds:>9.3f}{size / seconds / GB:>8.2f}{mine:>15.2f}{theirs:>8.2f}"
            )
        rate = {name: size / seconds for name, seconds in best.items()}
        hashed = rate["safetensors load_file + sha256 of the file"]
        views = rate["engine load_file_cpu, manifest in hand (no verify)"]
        st_read = rate["safetensors load_file + read every byte"]
        print(
            f"engine node cache verified / safetensors+read: "
            f"{rate['engine node cache (verified)'] / st_read:.2f}x (target >= 1.0x)\n"
            f"engine verified / safetensors+sha256 (both check integrity): "
            f"{rate['engine node cache (verified)'] / hashed:.2f}x\n"
            f"engine no verify / safetensors load_file (both mmap views): "
            f"{rate['engine node cache (no verify)'] / rate['safetensors load_file']:.2f}x "
            f"(resolve answer in hand; the manifest fetched over HTTP), "
            f"{views / rate['safetensors load_file']:.2f}x "
            f"(manifest in hand)\n"
            f"engine URL verified / raw ranged read: "
            f"{rate['engine signed URL (verified)'] / rate['raw ranged read']:.2f}x "
            f"(target >= 0.9x); unverified: "
            f"{rate['engine signed URL (no verify)'] / rate['raw ranged read']:.2f}x\n"
            f"BLAKE3 (blake3 package, one thread, {manifest.chunk_bytes >> 20} MiB chunks): "
            f"{hash_rate / GB:.2f} GB/s per core: {size / hash_rate:.3f} CPU s for this file, "
            f"{size / hash_rate / (cores * best['raw ranged read']):.0%} of the raw read's "
            f"{cores} core x seconds"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _cpu_seconds(server: list[psutil.Process]) -> tuple[float, float]:
    """User + system CPU seconds of this process and of the server's processes."""
    times = os.times()
    theirs = 0.0
    for process in server:
        try:
            t = process.cpu_times()
            theirs += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return times.user + times.system, theirs


def _blake3_per_core(chunk: int) -> float:
    """Bytes per second one thread hashes with the blake3 package, chunk by chunk."""
    import blake3

    data = memoryview(os.urandom(64 << 20))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for offset in range(0, len(data), chunk):
            blake3.blake3(data[offset : offset + chunk]).digest()
        best = min(best, time.perf_counter() - started)
    return len(data) / best


if __name__ == "__main__":
    sys.exit(main())
