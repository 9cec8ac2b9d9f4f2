"""What verifying the signed manifest adds to a CPU load (issue 14).

A real `tensor-registry serve` (embedded) holds a ``--size-gb`` bf16 tensorizer artifact with
its layout manifest and a signed manifest (written by
``tensor_registry_server.artifacts.making.signatures.backfill_manifest`` with the registry's key).
The weights sit in the
node cache (hard link, recorded for the artifact's compatibility key). Interleaved, best of
``--runs``:

- signed: ``load_artifact(answer)``: fetch ``manifest.sig.json`` over its signed URL, check
  the pinned key, the Ed25519 signature, the artifact id, every file's size and sha256 and
  the compatibility key, then the engine load with every 8 MiB chunk BLAKE3-checked;
- unsigned: the same resolve answer with the manifest entry removed (nothing to verify), the
  same verified engine load.

Also the median of ``verify_resolution`` alone over 50 calls, against the unsigned load: the
robust figure when two whole loads differ by less than this VM's noise.

    .venv/bin/python bench/engine/trust_cpu.py [--size-gb 2] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.engine.load import (  # noqa: E402
    ADMIN_TOKEN,
    GB,
    random_tensors,
    ready_version,
    register_artifact,
    registry,
    write_tensorizer,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from tensor_registry import RegistryClient, trust
    from tensor_registry.api.resolution import Resolution
    from tensor_registry.engine import load_artifact
    from tensor_registry.formats.layout import LAYOUT_FILE, ArtifactLayout, build_file_layout
    from tensor_registry.formats.signed_manifest import MANIFEST_FILE
    from tensor_registry.node_cache import NodeCache
    from tensor_registry.trust import verify_resolution

    work = Path(tempfile.mkdtemp(prefix="bench-trust-cpu-"))
    os.environ["TENSOR_REGISTRY_CONFIG_DIR"] = str(work / "client-config")
    try:
        tensors = random_tensors(int(args.size_gb * GB))
        staging = work / "staging"
        staging.mkdir()
        weights = staging / "model.tensors"
        write_tensorizer(weights, tensors)
        del tensors
        with weights.open("rb") as fh:
            manifest = build_file_layout(fh, "model.tensors", size=weights.stat().st_size)
        (staging / LAYOUT_FILE).write_bytes(ArtifactLayout(files=(manifest,)).dumps())
        with registry(work / "data") as reg:
            ready_version(reg, "bench/trust")
            artifact_id = register_artifact(
                reg,
                "bench/trust",
                1,
                {"model.tensors": weights, LAYOUT_FILE: staging / LAYOUT_FILE},
            )
            asyncio.run(_sign(reg.settings(), artifact_id))
            client = RegistryClient(reg.url, ADMIN_TOKEN)
            signed = client.resolve("bench/trust", ttl=3600, cpu_count=os.cpu_count())
            assert any(f.path == MANIFEST_FILE for f in signed.files)
            unsigned_data = copy.deepcopy(signed.data)
            unsigned_data["files"] = [
                f for f in unsigned_data["files"] if f["path"] != MANIFEST_FILE
            ]
            unsigned = Resolution(unsigned_data, signed.params)
            entry = next(f for f in signed.files if f.path == "model.tensors")
            cache = NodeCache(work / "cache")
            cached = cache.path(entry.sha256)
            cached.parent.mkdir(parents=True)
            stored = reg.settings().local_storage_root / "artifacts" / signed.artifact_id
            os.link(stored / "model.tensors", cached)
            cache.record_compatibility(entry.sha256, signed.data["compatibility_key"])
            verify_resolution(client, signed)  # pins the key (first use), warms the route

            signature_phase: list[float] = []

            def load(answer: Resolution) -> float:
                gc.collect()
                started = time.perf_counter()
                result = load_artifact(answer, client=client, cache=cache, verify=True)
                seconds = time.perf_counter() - started
                assert result.path == "engine" and result.source == "file"
                assert (result.signed_by is not None) == (answer is signed)
                if answer is signed:
                    signature_phase.append(result.phases["signature"])
                del result
                return seconds

            load(signed)
            load(unsigned)
            best = {"signed": float("inf"), "unsigned": float("inf")}
            arms = {"signed": signed, "unsigned": unsigned}
            for run in range(args.runs):
                # ABBA: neither arm always runs right after the other one's teardown.
                order = ["signed", "unsigned"] if run % 2 == 0 else ["unsigned", "signed"]
                for arm in order:
                    best[arm] = min(best[arm], load(arms[arm]))
            alone, uncached = [], []
            for _ in range(50):
                started = time.perf_counter()
                verify_resolution(client, signed)
                alone.append(time.perf_counter() - started)
                trust.manifest._fetched.clear()  # a fresh process: the manifest comes over HTTP
                started = time.perf_counter()
                verify_resolution(client, signed)
                uncached.append(time.perf_counter() - started)
            client.close()
        size = entry.size
        print(f"{size / GB:.2f} GB, best of {args.runs}, {os.cpu_count()} CPUs")
        for name, seconds in best.items():
            print(f"{name:<12}{seconds:>9.3f} s{size / seconds / GB:>8.2f} GB/s")
        verify_median = statistics.median(alone)
        fetch_median = statistics.median(uncached)
        inside = statistics.median(signature_phase)
        print(
            f"signature phase inside signed loads: median {inside * 1000:.2f} ms; "
            f"verify_resolution with the manifest fetched over HTTP: median "
            f"{fetch_median * 1000:.2f} ms = {fetch_median / best['unsigned'] * 100:.3f} % "
            "of the unsigned load"
        )
        print(
            f"signed / unsigned load time: {best['signed'] / best['unsigned']:.4f} "
            f"(+{(best['signed'] / best['unsigned'] - 1) * 100:.2f} %)\n"
            f"verify_resolution alone: median {verify_median * 1000:.2f} ms = "
            f"{verify_median / best['unsigned'] * 100:.3f} % of the unsigned load (target < 2 %)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


async def _sign(settings: object, artifact_id: object) -> None:
    from tensor_registry_server.artifacts.making.signatures import backfill_manifest
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.storage.registry import StorageRegistry

    storages = StorageRegistry(settings)  # type: ignore[arg-type]
    engine = create_engine(settings.database_url)  # type: ignore[attr-defined]
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            await backfill_manifest(session, settings, storages.get("local"), artifact_id)  # type: ignore[arg-type]
    finally:
        await engine.dispose()
        await storages.close()


if __name__ == "__main__":
    sys.exit(main())
