"""Download speed: tensorizer reading a tensorized file through a signed registry URL.

Local backend: ``TensorDeserializer`` (tensorizer's own curl-based HTTP reader, N parallel
readers) reads the same file through a signed ``/api/v1/blobs/local/...`` URL of a real
``tensor-registry serve`` and through nginx (Debian package, ``sendfile on``) serving the same
storage directory on loopback. Ratio = registry throughput / nginx throughput, same readers,
same run, best of ``BENCH_RUNS`` interleaved runs each.

S3 backend (``--s3``): the same file in a bucket of a moto S3 server on loopback, read by
tensorizer through a presigned GET and through the registry's proxied blob URL (the one used for
``%03d`` templates), against a raw boto3 parallel ranged GET of the same object (baseline).

    .venv/bin/python bench/serving/download.py                      # 1 GB, readers 2,4,8
    BENCH_DOWNLOAD_BYTES=200000000 .venv/bin/python bench/serving/download.py --readers 4 --s3
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import (
    GB,
    SIGNING_KEY,
    best_of,
    env_int,
    gbps,
    nginx_server,
    registry_server,
    work_dir,
    write_tensorized,
)


def read_with_tensorizer(url: str, readers: int, expected_count: int) -> None:
    from tensorizer import TensorDeserializer

    deserializer = TensorDeserializer(url, device="cpu", num_readers=readers)
    try:
        count = len(deserializer)
        assert count == expected_count, (count, expected_count)
    finally:
        deserializer.close()
    del deserializer
    gc.collect()


def signed_url(base: str, storage: str, key: str, ttl: int = 3600) -> str:
    from tensor_registry_server.storage.signing import blob_url

    return blob_url(base, SIGNING_KEY.encode(), storage=storage, key=key, ttl=ttl)


def tensor_count(path: Path) -> int:
    from tensorizer import TensorDeserializer

    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        return len(d)


def bench_local(size: int, readers: list[int], runs: int, variants: list[str]) -> list[str]:
    data_dir = work_dir("download")
    lines = []
    try:
        storage_root = data_dir / "storage"
        key = f"artifacts/{uuid.uuid4()}/model.tensors"
        path = storage_root / key
        actual = write_tensorized(path, size)
        count = tensor_count(path)
        print(f"file: {actual / GB:.2f} GB, {count} tensors, {path}", flush=True)
        with contextlib.ExitStack() as stack:
            nginx_url = f"{stack.enter_context(nginx_server(storage_root))}/{key}"
            urls = {
                name: signed_url(
                    stack.enter_context(registry_server(data_dir, variant=name)), "local", key
                )
                for name in variants
            }
            for url in [nginx_url, *urls.values()]:
                read_with_tensorizer(url, 2, count)  # warm every path and the page cache
            for n in readers:
                best = {name: float("inf") for name in ["nginx", *urls]}
                for _ in range(runs):  # interleaved, so load drift hits every arm alike
                    for name, url in [("nginx", nginx_url), *urls.items()]:
                        best[name] = min(
                            best[name],
                            best_of(1, functools.partial(read_with_tensorizer, url, n, count)),
                        )
                for name in urls:
                    label = "registry" if name == "serve" else f"registry under {name} uvicorn"
                    ratio = best["nginx"] / best[name]
                    line = (
                        f"local readers={n}: {label} {gbps(actual, best[name]):.2f} GB/s, "
                        f"nginx {gbps(actual, best['nginx']):.2f} GB/s, ratio {ratio:.2f}x"
                    )
                    print(line, flush=True)
                    lines.append(line)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return lines


def boto3_parallel_get(client, bucket: str, key: str, size: int, parts: int) -> None:  # type: ignore[no-untyped-def]
    step = -(-size // parts)

    def fetch(start: int) -> int:
        end = min(size, start + step) - 1
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"]
        got = 0
        while chunk := body.read(8 * 1024 * 1024):
            got += len(chunk)
        return got

    with ThreadPoolExecutor(parts) as pool:
        total = sum(pool.map(fetch, range(0, size, step)))
    assert total == size, (total, size)


def bench_s3(size: int, readers: list[int], runs: int) -> list[str]:
    import boto3
    from botocore.config import Config

    from bench.common import moto_server

    data_dir = work_dir("download-s3")
    lines = []
    try:
        local = data_dir / "model.tensors"
        actual = write_tensorized(local, size)
        count = tensor_count(local)
        with moto_server() as endpoint:
            bucket = "bench"
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
                region_name="us-east-1",
                config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
            )
            client.create_bucket(Bucket=bucket)
            artifact_key = f"artifacts/{uuid.uuid4()}/model.tensors"
            client.upload_file(str(local), bucket, artifact_key)
            presigned = client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": artifact_key}, ExpiresIn=3600
            )
            s3_env = {
                "TENSOR_REGISTRY_STORAGE__S3__ENDPOINT_URL": endpoint,
                "TENSOR_REGISTRY_STORAGE__S3__ACCESS_KEY_ID": "bench",
                "TENSOR_REGISTRY_STORAGE__S3__SECRET_ACCESS_KEY": "bench",
                "TENSOR_REGISTRY_STORAGE__S3__BUCKET": bucket,
            }
            with registry_server(data_dir / "registry", **s3_env) as api:
                proxied = signed_url(api, "s3", artifact_key)
                read_with_tensorizer(presigned, 2, count)
                read_with_tensorizer(proxied, 2, count)
                for n in readers:
                    t_raw = t_pre = t_proxy = float("inf")
                    for _ in range(runs):
                        t_raw = min(
                            t_raw,
                            best_of(
                                1,
                                functools.partial(
                                    boto3_parallel_get, client, bucket, artifact_key, actual, n
                                ),
                            ),
                        )
                        t_pre = min(
                            t_pre,
                            best_of(
                                1, functools.partial(read_with_tensorizer, presigned, n, count)
                            ),
                        )
                        t_proxy = min(
                            t_proxy,
                            best_of(1, functools.partial(read_with_tensorizer, proxied, n, count)),
                        )
                    line = (
                        f"s3 readers={n}: boto3 ranged GET {gbps(actual, t_raw):.2f} GB/s; "
                        f"tensorizer via presigned URL {gbps(actual, t_pre):.2f} GB/s "
                        f"({t_raw / t_pre:.2f}x); via registry proxy "
                        f"{gbps(actual, t_proxy):.2f} GB/s ({t_raw / t_proxy:.2f}x)"
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
    parser.add_argument("--size", type=int, default=env_int("BENCH_DOWNLOAD_BYTES", 1_050_000_000))
    parser.add_argument("--readers", default="2,4,8")
    parser.add_argument("--runs", type=int, default=env_int("BENCH_RUNS", 3))
    parser.add_argument("--s3", action="store_true", help="also run the S3 comparison")
    parser.add_argument("--s3-only", action="store_true")
    parser.add_argument("--s3-size", type=int, default=env_int("BENCH_S3_BYTES", 0))
    parser.add_argument(
        "--variants",
        default="serve",
        help="registry servers to compare with nginx: serve (the shipped one), serve-loop "
        "(serve sending on its event loop, http.sendfile_threads 0), stock-uvloop, "
        "stock-asyncio (plain uvicorn, streamed bodies)",
    )
    args = parser.parse_args()
    readers = [int(n) for n in args.readers.split(",")]
    started = time.perf_counter()
    lines = []
    if not args.s3_only:
        lines += bench_local(args.size, readers, args.runs, args.variants.split(","))
    if args.s3 or args.s3_only:
        lines += bench_s3(args.s3_size or args.size, readers, args.runs)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    elapsed = time.perf_counter() - started
    print(f"--- summary ({elapsed:.0f} s, load average {load}, {os.cpu_count()} CPUs)")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
