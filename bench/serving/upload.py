"""Upload speed: a file PUT through the API vs ``cp`` of the same file on the same disk.

A real ``tensor-registry serve`` (SQLite, local storage on the same file system as the source
file) receives ``curl -T file`` into a draft version: the bytes stream from the socket into
storage with sha256 computed on the way, are fsynced, then published. Every baseline is measured
in the same run, interleaved with the API (best and median of ``BENCH_RUNS``):

- ``cp`` of the same file to the same disk: the issue's baseline. GNU cp copies inside the
  kernel (``copy_file_range``) and hashes nothing.
- ``cp`` then ``sync FILE``: the same durability as the API's 201.
- ``cp`` then ``sha256sum`` of the copy: the least a server must do (copy and hash), by the
  standard tools, one after the other.
- a raw Python server: one thread, ``recv_into`` a 1 MiB buffer, ``sha256.update``,
  ``os.write``, ``fsync``, the same ``curl -T`` client. What the API would cost without HTTP
  framework, database, atomic publish or any overlap of hashing and writing.

Also reported: SHA-256 speed of ``hashlib`` on one core (no upload can beat it: one stream is
hashed sequentially), the ceiling that puts on the ratio to ``cp``, and the API process's peak
RSS (VmHWM).

``--batch-sweep`` also measures ``LocalStorage.put_stream`` in-process with several write-batch
sizes (the constant WRITE_BATCH in tensor_registry_server/storage/local.py).

    .venv/bin/python bench/serving/upload.py                        # 2.1 GB
    BENCH_UPLOAD_BYTES=500000000 .venv/bin/python bench/serving/upload.py --batch-sweep
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import (
    ADMIN_TOKEN,
    GB,
    MB,
    env_int,
    free_port,
    registry_server,
    server_pid,
    work_dir,
)

RAW_BUFFER = 1024 * 1024


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


def timed(step: Callable[[], None]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def timed_cp(source: Path, target: Path, *, then: str | None = None) -> float:
    """``cp``, optionally followed by ``sync FILE`` or ``sha256sum FILE`` of the copy."""

    def step() -> None:
        subprocess.run(["cp", str(source), str(target)], check=True)
        if then is not None:
            subprocess.run([then, str(target)], check=True, stdout=subprocess.DEVNULL)

    elapsed = timed(step)
    target.unlink()
    return elapsed


def curl_put(url: str, source: Path, sha256: str, *headers: str) -> None:
    out = subprocess.run(
        ["curl", "-sf", "-X", "PUT", "-T", str(source), *(x for h in headers for x in ("-H", h)),
         "-H", "Content-Type: application/octet-stream", url],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(out)["sha256"] == sha256, out


def timed_upload(base: str, model_id: str, path: str, source: Path, sha256: str) -> float:
    url = f"{base}/api/v1/models/{model_id}/versions/1/files/{path}"
    elapsed = timed(lambda: curl_put(url, source, sha256, f"Authorization: Bearer {ADMIN_TOKEN}"))
    api(base, "DELETE", f"/api/v1/models/{model_id}/versions/1/files/{path}")
    return elapsed


def raw_server(port: int, target: Path) -> None:
    """The raw baseline: one request per connection, received, hashed and written in one loop."""
    listener = socket.create_server(("127.0.0.1", port))
    buffer = bytearray(RAW_BUFFER)
    view = memoryview(buffer)
    while True:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and (more := conn.recv(65536)):
                head += more
            if b"\r\n\r\n" not in head:
                continue  # a readiness probe
            head, body = head.split(b"\r\n\r\n", 1)
            fields = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
            }
            if fields.get(b"expect", b"").lower() == b"100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            digest = hashlib.sha256()
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                digest.update(body)
                os.write(fd, body)
                left = int(fields[b"content-length"]) - len(body)
                while left:
                    n = conn.recv_into(view[: min(left, len(buffer))])
                    if not n:
                        raise ConnectionError("client went away")
                    digest.update(view[:n])
                    written = 0
                    while written < n:
                        written += os.write(fd, view[written:n])
                    left -= n
                os.fsync(fd)
            finally:
                os.close(fd)
            reply = json.dumps({"sha256": digest.hexdigest()}).encode()
            conn.sendall(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(reply), reply)
            )


@contextmanager
def raw_server_process(target: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--raw-server", str(port), str(target)],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the raw server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        target.unlink(missing_ok=True)


def sha256_speed(rounds: int = 3) -> float:
    """hashlib's SHA-256 on one core, GB/s: the best of ``rounds`` passes over 512 MB."""
    block = os.urandom(64 * MB)

    def hash_512mb() -> None:
        digest = hashlib.sha256()
        for _ in range(8):
            digest.update(block)

    return 8 * len(block) / min(timed(hash_512mb) for _ in range(rounds)) / GB


def bench_api(size: int, runs: int) -> list[str]:
    data_dir = work_dir("upload")
    try:
        source = data_dir / "source.safetensors"
        sha256 = make_source(source, size)
        print(f"source: {size / GB:.2f} GB on {data_dir}", flush=True)
        times: dict[str, list[float]] = {}
        arms = ("cp", "cp + fsync", "cp + sha256sum", "raw Python loop", "API")
        with (
            registry_server(data_dir / "registry") as base,
            raw_server_process(data_dir / "raw.bin") as raw_base,
        ):
            pid = server_pid(base)
            idle_rss = vm_hwm_mb(pid)
            model = api(base, "POST", "/api/v1/models", {"name": "bench/upload"})
            api(base, "POST", f"/api/v1/models/{model['id']}/versions", {})
            copy = data_dir / "copy.bin"

            def measure(arm: str, run: int) -> float:
                if arm == "cp":
                    return timed_cp(source, copy)
                if arm == "cp + fsync":
                    return timed_cp(source, copy, then="sync")
                if arm == "cp + sha256sum":
                    return timed_cp(source, copy, then="sha256sum")
                if arm == "raw Python loop":
                    return timed(lambda: curl_put(f"{raw_base}/raw", source, sha256))
                return timed_upload(base, model["id"], f"run{run}.safetensors", source, sha256)

            for run in range(runs):  # interleaved, so load drift hits every arm
                for arm in arms if run % 2 == 0 else arms[::-1]:
                    times.setdefault(arm, []).append(measure(arm, run))
            peak = vm_hwm_mb(pid)
        sha_speed = sha256_speed()
        best = {arm: min(t) for arm, t in times.items()}
        median = {arm: statistics.median(t) for arm, t in times.items()}
        t_api, m_api = best["API"], median["API"]
        lines = [
            f"upload {size / GB:.2f} GB, best (median) of {runs}: API (sha256 + fsync + publish) "
            f"{size / t_api / GB:.2f} GB/s ({size / m_api / GB:.2f}) in {t_api:.2f} s",
        ]
        for arm in arms[:-1]:
            lines.append(
                f"  vs {arm:<16} {size / best[arm] / GB:5.2f} GB/s ({size / median[arm] / GB:.2f}):"
                f" ratio {best[arm] / t_api:.2f}x ({median[arm] / m_api:.2f}x)"
            )
        lines += [
            f"sha256 (hashlib, one core) {sha_speed:.2f} GB/s: no upload beats that, so the "
            f"ceiling is {min(1.0, sha_speed * best['cp'] / (size / GB)):.2f}x of cp "
            f"({min(1.0, sha_speed * median['cp'] / (size / GB)):.2f}x at the median)",
            f"API process peak RSS {peak:.0f} MB (idle after start-up {idle_rss:.0f} MB)",
        ]
        for line in lines:
            print(line, flush=True)
        return lines
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def bench_batches(size: int, runs: int) -> list[str]:
    """put_stream in-process, fed 1 MiB chunks from memory (the shape the protocol delivers)."""
    import tensor_registry_server.storage.local as local

    data_dir = work_dir("batches")
    chunk = os.urandom(1024 * 1024)
    count = size // len(chunk)
    sizes_mb = (1, 2, 4, 8, 16, 32)

    async def body():  # type: ignore[no-untyped-def]
        for _ in range(count):
            yield chunk

    def put(batch_mb: int) -> float:
        local.WRITE_BATCH = batch_mb * 1024 * 1024
        key = f"versions/b/u/{batch_mb}"
        elapsed = timed(lambda: asyncio.run(storage.put_stream(key, body())))
        (data_dir / key).unlink()
        return elapsed

    try:
        storage = local.LocalStorage(data_dir)
        times: dict[int, list[float]] = {}
        for run in range(runs):  # interleaved, like the upload arms
            for batch_mb in sizes_mb if run % 2 == 0 else sizes_mb[::-1]:
                times.setdefault(batch_mb, []).append(put(batch_mb))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    lines = [
        f"put_stream batch {batch_mb:2d} MiB: {count * len(chunk) / min(t) / GB:.2f} GB/s "
        f"({count * len(chunk) / statistics.median(t) / GB:.2f} median)"
        for batch_mb, t in sorted(times.items())
    ]
    for line in lines:
        print(line, flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=env_int("BENCH_UPLOAD_BYTES", 2_100_000_000))
    parser.add_argument("--runs", type=int, default=env_int("BENCH_RUNS", 3))
    parser.add_argument("--batch-sweep", action="store_true")
    parser.add_argument("--raw-server", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_server:
        raw_server(int(args.raw_server[0]), Path(args.raw_server[1]))
        return
    lines = bench_api(args.size, args.runs)
    if args.batch_sweep:
        lines += bench_batches(min(args.size, 1000 * MB), args.runs)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"--- summary (load average {load}, {os.cpu_count()} CPUs)")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
