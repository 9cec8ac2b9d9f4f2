"""Upload speed: a file PUT through the API vs ``cp`` of the same file on the same disk.

A real ``tensor-registry serve`` (SQLite, local storage on the same file system as the source
file) receives ``curl -T file`` into a draft version: the bytes stream from the socket into
storage with sha256 computed on the way. Baseline: ``cp`` of the same file to the same disk,
measured in the same run (best of ``BENCH_RUNS``, interleaved). The API process's peak RSS
(VmHWM) is reported too.

``--batch-sweep`` also measures ``LocalStorage.put_stream`` in-process with several write-batch
sizes (the constant WRITE_BATCH in app/storage/local.py).

    .venv/bin/python bench/upload.py                        # 2.1 GB
    BENCH_UPLOAD_BYTES=500000000 .venv/bin/python bench/upload.py --batch-sweep
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ADMIN_TOKEN, GB, MB, env_int, registry_server, server_pid, work_dir


def make_source(path: Path, size: int) -> str:
    block = os.urandom(64 * 1024 * 1024)
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            piece = block[: min(left, len(block))]
            fh.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def api(base: str, method: str, path: str, body: dict | None = None) -> dict:
    data = ["-d", json.dumps(body)] if body is not None else []
    out = subprocess.run(
        ["curl", "-sf", "-X", method, "-H", f"Authorization: Bearer {ADMIN_TOKEN}",
         "-H", "Content-Type: application/json", *data, f"{base}{path}"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out) if out else {}


def timed_cp(source: Path, target: Path, *, durable: bool) -> float:
    """``cp`` (plain, or followed by an fsync of the copy: what the API does before its 201)."""
    started = time.perf_counter()
    subprocess.run(["cp", str(source), str(target)], check=True)
    if durable:
        subprocess.run(["sync", str(target)], check=True)
    elapsed = time.perf_counter() - started
    target.unlink()
    return elapsed


def timed_upload(base: str, model_id: str, path: str, source: Path, sha256: str) -> float:
    started = time.perf_counter()
    out = subprocess.run(
        ["curl", "-sf", "-X", "PUT", "-T", str(source),
         "-H", f"Authorization: Bearer {ADMIN_TOKEN}",
         "-H", "Content-Type: application/octet-stream",
         f"{base}/api/v1/models/{model_id}/versions/1/files/{path}"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    elapsed = time.perf_counter() - started
    assert json.loads(out)["sha256"] == sha256, out
    api(base, "DELETE", f"/api/v1/models/{model_id}/versions/1/files/{path}")
    return elapsed


def bench_api(size: int, runs: int) -> list[str]:
    data_dir = work_dir("upload")
    try:
        source = data_dir / "source.safetensors"
        sha256 = make_source(source, size)
        print(f"source: {size / GB:.2f} GB on {data_dir}", flush=True)
        with registry_server(data_dir / "registry") as base:
            pid = server_pid(base)
            idle_rss = vm_hwm_mb(pid)
            model = api(base, "POST", "/api/v1/models", {"name": "bench/upload"})
            api(base, "POST", f"/api/v1/models/{model['id']}/versions", {})
            t_cp = t_sync = t_api = float("inf")
            for run in range(runs):  # interleaved, so load drift hits every arm
                t_cp = min(t_cp, timed_cp(source, data_dir / "copy.bin", durable=False))
                t_sync = min(t_sync, timed_cp(source, data_dir / "copy.bin", durable=True))
                t_api = min(
                    t_api, timed_upload(base, model["id"], f"run{run}.safetensors", source, sha256)
                )
            peak = vm_hwm_mb(pid)
        lines = [
            f"upload {size / GB:.2f} GB: API (sha256 + fsync) "
            f"{size / t_api / GB:.2f} GB/s ({t_api:.2f} s)",
            f"  vs cp {size / t_cp / GB:.2f} GB/s ({t_cp:.2f} s): ratio {t_cp / t_api:.2f}x",
            f"  vs cp + fsync {size / t_sync / GB:.2f} GB/s ({t_sync:.2f} s): "
            f"ratio {t_sync / t_api:.2f}x",
            f"API process peak RSS {peak:.0f} MB (idle after start-up {idle_rss:.0f} MB)",
        ]
        for line in lines:
            print(line, flush=True)
        return lines
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def bench_batches(size: int) -> list[str]:
    """put_stream in-process, fed 64 KiB chunks from memory (the shape uvicorn delivers)."""
    import app.storage.local as local

    data_dir = work_dir("batches")
    lines = []
    chunk = os.urandom(64 * 1024)
    count = size // len(chunk)

    async def body():  # type: ignore[no-untyped-def]
        for _ in range(count):
            yield chunk

    try:
        storage = local.LocalStorage(data_dir)
        for batch_mb in (0.0625, 1, 4, 8, 16, 32):
            local.WRITE_BATCH = int(batch_mb * 1024 * 1024)
            started = time.perf_counter()
            asyncio.run(storage.put_stream(f"versions/b/u/{batch_mb}", body()))
            elapsed = time.perf_counter() - started
            (data_dir / f"versions/b/u/{batch_mb}").unlink()
            line = (
                f"put_stream batch {batch_mb:g} MiB: {count * len(chunk) / elapsed / GB:.2f} GB/s"
            )
            print(line, flush=True)
            lines.append(line)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=env_int("BENCH_UPLOAD_BYTES", 2_100_000_000))
    parser.add_argument("--runs", type=int, default=env_int("BENCH_RUNS", 3))
    parser.add_argument("--batch-sweep", action="store_true")
    args = parser.parse_args()
    lines = bench_api(args.size, args.runs)
    if args.batch_sweep:
        lines += bench_batches(min(args.size, 1000 * MB))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"--- summary (load average {load}, {os.cpu_count()} CPUs)")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
