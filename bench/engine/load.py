"""Load: an artifact into CPU memory through its signed `local` URL, with the client.

A real `tensor-registry serve` (embedded: SQLite + local storage) holds a tensorizer artifact of
``--size-gb`` random bfloat16 tensors (2 GB by default). In the same run, interleaved, best of
``--runs`` each:

- client:  ``tensor_registry.load_state_dict``: the file fetched from the signed URL into a fresh
           node cache (``--readers`` parallel range GETs, sha256 checked against the registry's
           digest before tensorizer reads a byte), then read by tensorizer; with per-tensor hash
           verification on (the registry's advice) and off;
- tensorizer over the URL: ``TensorDeserializer`` streaming the signed URL itself (``--readers``
           range readers; the client's in-process HTTP reader and tensorizer's curl reader),
           checked by tensorizer's own hashes only: what the verified load costs beside it;
- raw:     the same URL, the same number of parallel single-range GETs, each straight into
           memory it allocates for its range (http.client ``readinto``: no parsing, no
           tensors) — the ratio's baseline; and the same into one buffer allocated and faulted
           in beforehand ("bare transfer"), to show what fresh memory itself costs;
- safetensors: ``safetensors.torch.load_file`` of the same tensors from local disk.

safetensors' tensors are mmap views until read, so its load includes reading every byte
(``read_every_byte``); the client's tensors are filled by the load itself. Files are in the
page cache for all three (just written and read before timing), so this compares the loaders,
not the disk.

Prints GB/s and, for the client and the streaming reads, the ratios to the raw ranged read
(streaming target >= 0.85x) and to safetensors (aim >= 1.0x).

    .venv/bin/python bench/engine/load.py [--size-gb 2] [--readers 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import insert_artifact, ready_versions, serve_no_worker  # noqa: E402
from tensor_registry.formats.digests import sha256_file  # noqa: E402

ADMIN_TOKEN = "trg_bench-load-admin-token-0123456789abcdefghijklmn"
GB = 1_000_000_000
TENSOR_BYTES = 64 * 1024 * 1024


@dataclass
class Registry:
    url: str
    data_dir: Path
    env: dict[str, str]

    def settings(self) -> Any:
        from tensor_registry_server.settings import Settings

        database = self.env.get("TENSOR_REGISTRY_DATABASE__URL") or (
            f"sqlite+aiosqlite:///{self.data_dir / 'registry.db'}"
        )
        return Settings(
            data_dir=self.data_dir,
            database={"url": database},
            storage={},
            security={},
        )


@contextmanager
def registry(data_dir: Path, **extra_env: str) -> Iterator[Registry]:
    """`tensor-registry serve --no-worker` on a free loopback port."""
    env = {"TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN, "TENSOR_REGISTRY_LOG_LEVEL": "WARNING"}
    env.update(extra_env)
    with serve_no_worker(data_dir, env) as url:
        yield Registry(url=url, data_dir=data_dir, env={"TENSOR_REGISTRY_PUBLIC_URL": url, **env})


def ready_version(reg: Registry, name: str) -> dict[str, Any]:
    """Model ``name`` with version 1 finalized (a minimal config + safetensors source)."""
    return ready_versions(reg.url, ADMIN_TOKEN, name)


def register_artifact(
    reg: Registry, name: str, version: int, files: dict[str, Path], **variant: Any
) -> uuid.UUID:
    """Move ``files`` into the registry's storage under a new artifact and insert its rows."""
    from tensor_registry_server.storage.object_keys import artifact_prefix

    settings = reg.settings()
    artifact_id = uuid.uuid4()
    prefix = artifact_prefix(artifact_id)
    rows = []
    for path, source in files.items():
        target = settings.local_storage_root / prefix / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), target)
        rows.append((path, target.stat().st_size, sha256_file(target)))

    insert_artifact(
        settings.database_url,
        name,
        version,
        artifact_id,
        prefix,
        rows,
        storage="local",
        variant=variant,
    )
    return artifact_id


def random_tensors(total_bytes: int, dtype_name: str = "bfloat16") -> dict[str, Any]:
    import torch

    dtype = getattr(torch, dtype_name)
    elements = TENSOR_BYTES // torch.tensor([], dtype=dtype).element_size()
    count = max(1, total_bytes // TENSOR_BYTES)
    generator = torch.Generator().manual_seed(0)
    return {
        f"model.layers.{i}.weight": torch.randn(elements, generator=generator).to(dtype)
        for i in range(count)
    }


def write_tensorizer(path: Path, tensors: dict[str, Any]) -> None:
    from tensorizer import TensorSerializer

    serializer = TensorSerializer(str(path))
    try:
        serializer.write_state_dict(tensors)
    finally:
        serializer.close()


def read_every_byte(tensors: dict[str, Any]) -> int:
    """Sum every byte of every tensor: mmap-backed safetensors tensors are only views of the
    file until their bytes are read, so this is what makes their load comparable."""
    import torch

    total = 0
    for tensor in tensors.values():
        raw = tensor.reshape(-1).view(torch.uint8)
        words = raw[: raw.numel() // 8 * 8].view(torch.int64)  # 8 bytes per add: still all read
        total += int(words.sum()) + int(raw[words.numel() * 8 :].sum())
    return total


def raw_ranged_read(url: str, size: int, readers: int, buffer: Any = None) -> int:
    """``readers`` parallel single-range GETs of ``url``, each straight into memory.

    Without ``buffer`` every reader reads into memory it allocates for its range (uninitialised,
    as a loader allocates tensors): the raw cost of getting the bytes into fresh memory. With
    ``buffer`` (allocated and faulted in beforehand) it is the bare transfer.
    """
    import torch

    parts = urlsplit(url)
    target = f"{parts.path}?{parts.query}"
    whole = memoryview(buffer.numpy()).cast("B") if buffer is not None else None

    def fetch(start: int, end: int) -> int:
        if whole is not None:
            view = whole[start : end + 1]
        else:
            view = memoryview(torch.empty(end - start + 1, dtype=torch.uint8).numpy()).cast("B")
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        try:
            conn.request("GET", target, headers={"Range": f"bytes={start}-{end}"})
            response = conn.getresponse()
            if response.status != 206:
                raise RuntimeError(f"HTTP {response.status} for range {start}-{end}")
            done = 0
            while done < len(view):
                got = response.readinto(view[done:])
                if not got:
                    raise RuntimeError(f"short read at {start + done}")
                done += got
            return done
        finally:
            conn.close()

    bounds = [(size * i // readers, size * (i + 1) // readers - 1) for i in range(readers)]
    with ThreadPoolExecutor(readers) as pool:
        return sum(f.result() for f in [pool.submit(fetch, a, b) for a, b in bounds])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file, save_file
    from tensorizer import TensorDeserializer

    from tensor_registry import NodeCache, RegistryClient, load_state_dict
    from tensor_registry.tensorizer_stream import HTTPRangeStream

    work = Path(tempfile.mkdtemp(prefix="bench-load-", dir=args.dir))
    try:
        tensors = random_tensors(int(args.size_gb * GB))
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        staging = work / "staging"
        staging.mkdir()
        write_tensorizer(staging / "model.tensors", tensors)
        safetensors_path = work / "model.safetensors"
        save_file(tensors, str(safetensors_path))
        del tensors
        gc.collect()
        print(
            f"artifact: {nbytes / GB:.2f} GB of bfloat16 tensors "
            f"({(staging / 'model.tensors').stat().st_size / GB:.2f} GB tensorizer file), "
            f"{args.readers} readers, best of {args.runs}, {os.cpu_count()} CPUs"
        )
        with registry(work / "data") as reg:
            ready_version(reg, "bench/load")
            register_artifact(reg, "bench/load", 1, {"model.tensors": staging / "model.tensors"})
            client = RegistryClient(reg.url, ADMIN_TOKEN)
            answer = client.resolve("bench/load", ttl=3600, num_readers=args.readers)
            url, size = answer.tensorizer_uri, next(f.size for f in answer.files if f.is_weights)
            raw_buffer = torch.ones(size, dtype=torch.uint8)
            raw_ranged_read(url, size, args.readers)  # warm the page cache and the server
            load_file(str(safetensors_path))

            def client_load(verify: bool) -> Callable[[], Any]:
                def run() -> int:
                    # A fresh node cache each time: the download is part of a verified load.
                    cache_dir = Path(tempfile.mkdtemp(prefix="node-cache-", dir=work))
                    try:
                        state = load_state_dict(
                            answer, client=client, verify_hash=verify, cache=NodeCache(cache_dir)
                        )
                    finally:
                        shutil.rmtree(cache_dir, ignore_errors=True)
                    return len(state)

                return run

            def streamed(in_process: bool) -> Callable[[], Any]:
                def run() -> int:
                    source: Any = HTTPRangeStream(url) if in_process else url
                    with TensorDeserializer(
                        source, device="cpu", num_readers=args.readers, verify_hash=False
                    ) as deserializer:
                        return len(dict(deserializer.items()))

                return run

            def safetensors_load() -> int:
                return read_every_byte(load_file(str(safetensors_path)))

            candidates: dict[str, Callable[[], Any]] = {
                "client (verify_hash on)": client_load(True),
                "client (verify_hash off)": client_load(False),
                "streamed, in-process (hash off)": streamed(True),
                "streamed via curl (hash off)": streamed(False),
                "raw ranged read": lambda: raw_ranged_read(url, size, args.readers),
                "raw, into a ready buffer": lambda: raw_ranged_read(
                    url, size, args.readers, raw_buffer
                ),
                "safetensors.load_file": safetensors_load,
            }
            best = {name: float("inf") for name in candidates}
            for _ in range(args.runs):
                for name, fn in candidates.items():
                    seconds, _ = timed(fn)
                    best[name] = min(best[name], seconds)
            client.close()

        print(f"{'method':<34}{'seconds':>10}{'GB/s':>10}")
        for name, seconds in best.items():
            moved = size if name.startswith("raw") else nbytes
            print(f"{name:<34}{seconds:>10.3f}{moved / seconds / GB:>10.2f}")
        raw_rate = size / best["raw ranged read"]
        ready_rate = size / best["raw, into a ready buffer"]
        st_rate = nbytes / best["safetensors.load_file"]
        for label in (
            "client (verify_hash on)",
            "client (verify_hash off)",
            "streamed, in-process (hash off)",
            "streamed via curl (hash off)",
        ):
            rate = nbytes / best[label]
            target = " (target >= 0.85x)" if label.startswith("streamed") else ""
            print(
                f"{label}: {rate / raw_rate:.2f}x raw ranged read{target}, "
                f"{rate / ready_rate:.2f}x the bare transfer, "
                f"{rate / st_rate:.2f}x safetensors.load_file (aim >= 1.0x)"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
