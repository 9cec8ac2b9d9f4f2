"""The load engine on a GPU: hot page cache → cuda, verified and not, against the pinned copy and
the other loaders, all in one run.

    python bench/engine/engine_gpu.py --size-gb 10 --out $OUT       # on a GPU machine

Writes ``--size-gb`` of random bf16 tensors (large ones plus small odd-sized ones, so tensor
offsets are unaligned as in real tensorizer files) once as a tensorizer file with its layout
manifest and once as a safetensors file. Both stay in the page cache. Then, each timed from
open to the last byte on the device (``torch.cuda.synchronize``), best of ``--runs``:

- baseline: one copy of the same number of bytes from pinned host memory (the H2D ceiling);
- the engine from the file, over a sweep of ``register_fraction`` (the most of the file
  pinned in place with cudaHostRegister while 16 threads pread the rest into pinned buffers;
  ``--split``: the two meet where their rates put them, or the split is fixed there) and of
  the pinning slice (``--slices-mib``),
  without chunk verification, verified on the device (BLAKE3 in a Triton kernel over the
  staged bytes, tensor_registry/engine/gpu_blake3.py) and verified on host threads; every load is
  compared with the source on the device;
- the engine from a signed URL of a range server on loopback (bench/engine/gpu_load.py's built-in
  server: HMAC-signed, 206 + sendfile; the device machine lacks the registry's server stack);
- tensorizer (1/8/16 readers), safetensors ``load_file``, and, when importable, InstantTensor,
  fastsafetensors and the Run:ai model streamer, each from the safetensors file;
- tensor parallel 2 (issue 15 on one GPU): the tensors split in two halves written as
  ``model-rank-000.tensors`` / ``model-rank-001.tensors`` with a layout each; each rank's file
  loaded by the engine (verified on the device) and compared with its shard.

Before all that, ``device_digest_check`` compares the kernel's digests with the blake3 package
on random data (one flipped byte must be found) and times it alone.

Prints a table of GB/s and x pinned; writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1e9
BIG = 256 << 20


def make_state(total: int) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    state: dict[str, Any] = {}
    count = max(1, total // BIG)
    for i in range(count):
        name = f"model.layers.{i}.mlp.{'gate_up' if i % 2 else 'down'}_proj.weight"
        state[name] = torch.randn(BIG // 2 // 4096, 4096, generator=g, device="cuda").to(
            torch.bfloat16
        )
        # Odd-sized neighbours: the next big tensor's data lands on an unaligned offset.
        state[f"model.layers.{i}.norm{'_' * (i % 5)}.weight"] = torch.randn(
            4096 + i, generator=g, device="cuda"
        ).to(torch.bfloat16)
        state[f"model.layers.{i}.bias"] = torch.randn(3 + i, generator=g, device="cuda")
    return state


def write_artifact(path: Path, state: dict[str, Any]) -> Any:
    """``state`` written to ``path`` as a tensorizer file, read once into the page cache;
    returns its layout manifest (tensor_registry.formats.layout.FileLayout)."""
    from tensorizer import TensorSerializer

    from tensor_registry.formats.layout import build_file_layout

    path.parent.mkdir(parents=True, exist_ok=True)
    serializer = TensorSerializer(str(path))
    serializer.write_state_dict({k: v.cpu() for k, v in state.items()})
    serializer.close()
    with path.open("rb") as fh:
        manifest = build_file_layout(fh, path.name, size=path.stat().st_size, threads=16)
        fh.seek(0)
        while fh.read(64 << 20):  # every byte in the page cache before timing
            pass
    return manifest


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/engine-bench")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--fractions", type=float, nargs="+", default=[0, 0.3, 0.45, 0.6, 0.75])
    parser.add_argument("--readers", type=int, nargs="+", default=[16])
    parser.add_argument(
        "--hash-threads", type=int, nargs="+", default=[16], help="host hashers (first value)"
    )
    parser.add_argument("--quick", action="store_true", help="engine only (no peers)")
    parser.add_argument(
        "--host-fractions",
        type=float,
        nargs="*",
        default=[0.7, 0.9],
        help="register fractions also measured with digests on host threads",
    )
    parser.add_argument("--tp-gb", type=float, default=4, help="size of the TP=2 pair (0: skip)")
    parser.add_argument(
        "--url-connections", type=int, nargs="+", default=[16, 32], help="signed-URL arms"
    )
    parser.add_argument(
        "--split",
        choices=["balanced", "fixed", "both"],
        default="both",
        help="register fractions > 0: a split fixed at the fraction (the engine's default), "
        "or readers and pinning meeting where their rates put them (balanced), or both",
    )
    parser.add_argument(
        "--slices-mib", type=int, nargs="+", default=[512], help="pinning slice sizes (MiB)"
    )
    parser.add_argument(
        "--block-mib",
        type=int,
        nargs="+",
        default=[0],
        help="the ring's block sizes (MiB; multiples of the manifest's 8 MiB chunks; "
        "0: the engine's default)",
    )
    parser.add_argument(
        "--ring-per-reader",
        type=int,
        default=None,
        help="pinned ring buffers per reader (default: the engine's, two)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["plain"],
        help="engine options per arm, joined by '+': plain, prefault (4 threads fault the "
        "mapping in ahead of the pinning), pinN (N pinning threads), e.g. pin2+prefault",
    )
    args = parser.parse_args()

    import torch
    from safetensors.torch import save_file
    from tensorizer import TensorSerializer

    from bench.common import bench_dirs, failed_arm
    from tensor_registry import engine
    from tensor_registry.engine.pinned import cuda_runtime_library
    from tensor_registry.formats.layout import build_file_layout

    work, out = bench_dirs(args.workdir, args.out)
    log: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)), "torch": torch.__version__}
    t = time.perf_counter()
    state = make_state(int(args.size_gb * GB))
    tz_path, st_path = work / "model.tensors", work / "model.safetensors"
    cpu_state = {k: v.cpu() for k, v in state.items()}
    serializer = TensorSerializer(str(tz_path))
    serializer.write_state_dict(cpu_state)
    serializer.close()
    if not args.quick:
        save_file(cpu_state, str(st_path))
    del cpu_state
    size = tz_path.stat().st_size
    log["write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    with tz_path.open("rb") as fh:
        manifest = build_file_layout(fh, tz_path.name, size=size, threads=16)
    log["layout_s"] = time.perf_counter() - t
    log["bytes"] = size
    log["tensors"] = len(state)
    print(f"wrote {size / GB:.2f} GB, {len(state)} tensors; layout {log['layout_s']:.2f} s")

    # Every byte read once before timing: the page cache is hot for every arm.
    for p in (tz_path, st_path) if not args.quick else (tz_path,):
        with p.open("rb") as fh:
            while fh.read(64 << 20):
                pass

    rows: dict[str, dict[str, Any]] = {}
    log["device_digest"] = device_digest_check()

    def check(tensors: dict[str, Any]) -> None:
        bad = [k for k in state if not torch.equal(tensors[k], state[k])]
        if bad or set(tensors) != set(state):
            raise AssertionError(f"loaded tensors differ from the source: {bad[:3]}")

    def arm(name: str, fn: Callable[[], Any], nbytes: int, verify_output: bool = True) -> None:
        best: float | None = None
        phases: dict[str, float] = {}
        try:
            for _ in range(args.runs):
                last_phases.clear()
                seconds, loaded = timed(fn)
                last_phases["unpin_after_s"] = engine.wait_released()
                if verify_output and loaded is not None:
                    check(loaded)
                del loaded
                gc.collect()
                if best is None or seconds < best:
                    best = seconds
                    phases = dict(last_phases)
        except Exception as exc:
            failed_arm(rows, name, exc, width=55)
            return
        assert best is not None
        rows[name] = {"seconds": best, "gbps": nbytes / best / GB, "phases": phases}
        print(f"{name:55s} {nbytes / best / GB:7.2f} GB/s  {phases}", flush=True)

    last_phases: dict[str, float] = {}

    # Baseline: one pinned → device copy of the same bytes.
    pair = [torch.empty(size, dtype=torch.uint8, pin_memory=True)]
    pair[0].fill_(7)
    pair.append(torch.empty(size, dtype=torch.uint8, device="cuda"))

    def pinned_copy() -> None:
        pair[1].copy_(pair[0], non_blocking=True)

    arm("pinned copy (baseline)", pinned_copy, size)
    pair.clear()
    torch.cuda.empty_cache()

    def engine_file(
        fraction: float,
        verify: bool,
        readers: int,
        hashers: int = 16,
        digest_on: str = "auto",
        balance: bool = True,
        slice_mib: int = 512,
        variant: str = "plain",
        block_mib: int = 0,
    ) -> Callable[[], Any]:
        pins = re.search(r"pin(\d+)", variant)
        options: dict[str, Any] = {
            "prefault_threads": 4 if "prefault" in variant else 0,
            "pin_threads": int(pins.group(1)) if pins else 1,
        }

        def run() -> Any:
            return engine.load_cuda(
                manifest,
                path=tz_path,
                device="cuda",
                verify=verify,
                readers=readers,
                register_fraction=fraction,
                register_slice=slice_mib << 20,
                balance=balance,
                hash_threads=hashers,
                digest_on=digest_on,
                phases=last_phases,
                block_bytes=(block_mib << 20) or None,
                ring_buffers=args.ring_per_reader * readers if args.ring_per_reader else None,
                **options,
            )

        return run

    # Warm the pinned ring once (a process keeps it between loads; first-load cost reported).
    for digest_on in ("host", "device"):
        first, _ = timed(engine_file(0.0, True, 16, digest_on=digest_on))
        engine.wait_released()
        log[f"first_load_s_incl_ring_pinning_{digest_on}"] = first
    log["cudart"] = getattr(cuda_runtime_library(), "engine_source", "torch binding")
    print("cudart:", log["cudart"], flush=True)
    splits = {"balanced": [True], "fixed": [False], "both": [False, True]}[args.split]
    for readers, block_mib in ((r, b) for r in args.readers for b in args.block_mib):
        for variant in args.variants:
            for fraction in args.fractions:
                if fraction == 0 and variant != "plain":
                    continue  # the other options concern the pinning threads only
                if fraction >= 1 and block_mib != args.block_mib[0]:
                    continue  # no ring: the block size does not matter
                for balance in splits if fraction > 0 else [True]:
                    for slice_mib in args.slices_mib if fraction > 0 else [args.slices_mib[0]]:
                        arms = [(False, "auto"), (True, "device")]
                        if fraction in args.host_fractions and variant == "plain":
                            arms.append((True, "host"))
                        how = "" if variant == "plain" else f" {variant}"
                        if block_mib:
                            how += f" block={block_mib}M"
                        if fraction > 0:
                            how += f" {'balanced' if balance else 'fixed'} slice={slice_mib}M"
                        for verify, digest_on in arms:
                            arm(
                                f"engine file r={readers} register={fraction:.2f}{how} "
                                + (f"verified on {digest_on}" if verify else "unverified"),
                                engine_file(
                                    fraction,
                                    verify,
                                    readers,
                                    args.hash_threads[0],
                                    digest_on,
                                    balance,
                                    slice_mib,
                                    variant,
                                    block_mib,
                                ),
                                size,
                            )

    # Signed URL over loopback.
    from bench.engine.gpu_load import builtin_server

    with builtin_server(work) as sign:
        url = sign(tz_path.name)
        for conns in args.url_connections:
            for verify, digest_on in ((False, "auto"), (True, "device"), (True, "host")):
                if conns != args.url_connections[0] and digest_on == "host":
                    continue
                arm(
                    f"engine url conns={conns} "
                    + (f"verified on {digest_on}" if verify else "unverified"),
                    partial(
                        engine.load_cuda,
                        manifest,
                        url=url,
                        device="cuda",
                        verify=verify,
                        readers=conns,
                        digest_on=digest_on,
                        phases=last_phases,
                    ),
                    size,
                )
    log["corruption"] = corruption_check(manifest, tz_path)
    if not args.quick:  # before the TP pair: every peer's load is compared with ``state``
        peers(args, arm, tz_path, st_path, size, log)
    if args.tp_gb > 0:
        del state
        gc.collect()
        torch.cuda.empty_cache()
        tensor_parallel(args, arm, work, rows)

    log["rows"] = rows
    (out / "engine_gpu.json").write_text(json.dumps(log, indent=1))
    base = rows["pinned copy (baseline)"]["gbps"]
    print("\n| arm | GB/s | x pinned |\n|---|---|---|")
    for name, row in rows.items():
        if "gbps" in row:
            print(f"| {name} | {row['gbps']:.1f} | {row['gbps'] / base:.2f} |")
        else:
            print(f"| {name} | {row['error'][:80]} | - |")
    print("\nverified ÷ unverified, same run:")
    for name, row in rows.items():
        if "verified on" in name and "gbps" in row:
            plain = rows.get(name.split(" verified on")[0] + " unverified", {})
            if "gbps" in plain:
                print(f"  {name}: {row['gbps'] / plain['gbps']:.3f}")
    return 0


def device_digest_check() -> dict[str, Any]:
    """The device BLAKE3 (tensor_registry/engine/gpu_blake3.py) against the blake3 package on random
    bytes (8 MiB chunks, a shorter last one, one flipped byte), then its rate alone on 4 GiB
    already on the device."""
    import blake3
    import torch

    from tensor_registry.engine import gpu_blake3
    from tensor_registry.formats.layout import CHUNK_BYTES, FileLayout

    out: dict[str, Any] = {}
    try:
        size = 5 * CHUNK_BYTES + 12345
        data = torch.randint(0, 256, (size,), dtype=torch.uint8)
        raw = data.numpy().tobytes()
        chunks = tuple(
            blake3.blake3(raw[i : i + CHUNK_BYTES]).hexdigest() for i in range(0, size, CHUNK_BYTES)
        )
        layout = FileLayout("check", size, "", 1, False, CHUNK_BYTES, chunks, ())
        gpu_blake3.warm_up("cuda", CHUNK_BYTES)
        staged = data.cuda()
        digests = gpu_blake3.DeviceDigests(layout, "cuda")
        digests.hash_block(staged, 0, size)
        out["clean_mismatches"] = digests.mismatches()
        staged[3 * CHUNK_BYTES + 777] ^= 1
        digests = gpu_blake3.DeviceDigests(layout, "cuda")
        digests.hash_block(staged, 0, size)
        out["flipped_mismatches"] = digests.mismatches()
        out["host_tail"] = digests.host_tail()
        big = 512 * CHUNK_BYTES
        blob = torch.randint(0, 256, (big,), dtype=torch.uint8, device="cuda")
        fake = FileLayout("rate", big, "", 1, False, CHUNK_BYTES, ("00" * 32,) * 512, ())
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            d = gpu_blake3.DeviceDigests(fake, "cuda")
            d.hash_block(blob, 0, big)
            d.mismatches()
            torch.cuda.synchronize()
            out["gbps_alone"] = big / (time.perf_counter() - t) / GB
        ok = out["clean_mismatches"] == [] and out["flipped_mismatches"] == [3]
        out["ok"] = ok
    except Exception as exc:  # reported, and the engine arms show the consequence
        traceback.print_exc()
        out["error"] = f"{type(exc).__name__}: {exc}"
    print("device digest check:", out, flush=True)
    return out


def copy_pair(pair: list[Any]) -> None:
    pair[1].copy_(pair[0], non_blocking=True)


def tensor_parallel(
    args: argparse.Namespace, arm: Callable[..., None], work: Path, rows: dict[str, Any]
) -> None:
    """Two rank files (each tensor's halves along dim 0, as column-parallel layers split), each
    loaded by the engine verified on the device, bit-identical to its shard; x the pinned copy
    measured right before, on the same GPU (one GPU here: the ranks load one after another)."""
    import torch
    from tensorizer import TensorSerializer

    from tensor_registry import engine
    from tensor_registry.formats.layout import build_file_layout

    state = make_state(int(args.tp_gb * GB))
    shards: list[dict[str, Any]] = [{}, {}]
    for name, tensor in state.items():
        halves = tensor.chunk(2, dim=0) if tensor.shape[0] > 1 else (tensor, tensor)
        for rank in (0, 1):
            shards[rank][name] = halves[rank].contiguous()
    del state
    for rank in (0, 1):
        path = work / f"model-rank-{rank:03d}.tensors"
        serializer = TensorSerializer(str(path))
        serializer.write_state_dict({k: v.cpu() for k, v in shards[rank].items()})
        serializer.close()
        with path.open("rb") as fh:
            layout = build_file_layout(fh, path.name, size=path.stat().st_size, threads=16)
        with path.open("rb") as fh:
            while fh.read(64 << 20):
                pass
        size = path.stat().st_size
        pair = [torch.empty(size, dtype=torch.uint8, pin_memory=True)]
        pair[0].fill_(3)
        pair.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        arm(f"tp2 rank {rank}: pinned copy", partial(copy_pair, pair), size)
        pair.clear()
        torch.cuda.empty_cache()

        def load(layout: Any = layout, path: Path = path, rank: int = rank) -> Any:
            tensors = engine.load_cuda(
                layout, path=path, device="cuda", verify=True, register_fraction=0.7
            )
            bad = [k for k in shards[rank] if not torch.equal(tensors[k], shards[rank][k])]
            if bad or set(tensors) != set(shards[rank]):
                raise AssertionError(f"rank {rank} differs from its shard: {bad[:3]}")
            return None

        arm(f"tp2 rank {rank}: engine verified on device", load, size, verify_output=False)
        base = rows[f"tp2 rank {rank}: pinned copy"].get("gbps")
        got = rows[f"tp2 rank {rank}: engine verified on device"].get("gbps")
        if base and got:
            print(f"tp2 rank {rank}: {got:.1f} GB/s = {got / base:.2f}x pinned", flush=True)


def corruption_check(manifest: Any, path: Path) -> list[str]:
    """A flipped byte in the pread part and one in the registered part each fail the CUDA load
    with the tensor named (the file is restored after each)."""
    from tensor_registry import engine

    outcomes = []
    big = [t for t in manifest.tensors if t.data_length > 1 << 20]
    for tensor in (big[len(big) // 4], big[-2]):  # first half: pread; second: registered
        offset = tensor.data_offset + tensor.data_length // 2
        with path.open("r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)
            fh.seek(offset)
            fh.write(bytes([byte[0] ^ 1]))
        try:
            for digest_on in ("device", "host"):
                try:
                    engine.load_cuda(
                        manifest,
                        path=path,
                        device="cuda",
                        register_fraction=0.5,
                        balance=False,  # so the second byte is surely in the pinned part
                        digest_on=digest_on,
                    )
                    outcomes.append(f"{tensor.name} ({digest_on}): NOT DETECTED")
                except engine.ChunkMismatch as exc:
                    verdict = "named" if tensor.name in exc.tensors else "NOT NAMED"
                    outcomes.append(f"{tensor.name} ({digest_on}): {verdict} ({exc})")
                engine.wait_released()
        finally:
            with path.open("r+b") as fh:
                fh.seek(offset)
                fh.write(byte)
            engine.wait_released()
    for line in outcomes:
        print("corruption check:", line[:300], flush=True)
    return outcomes


def peers(
    args: argparse.Namespace,
    arm: Callable[..., None],
    tz_path: Path,
    st_path: Path,
    size: int,
    log: dict[str, Any],
) -> None:
    import torch
    from tensorizer import TensorDeserializer

    def tensorizer(readers: int, verify: bool) -> Callable[[], Any]:
        def run() -> Any:
            d = TensorDeserializer(
                str(tz_path), device="cuda", num_readers=readers, verify_hash=verify
            )
            tensors = dict(d.items())
            d.close()
            return tensors

        return run

    for readers in (1, 8, 16):
        arm(f"tensorizer readers={readers}", tensorizer(readers, False), size)
    arm("tensorizer readers=16 verify_hash", tensorizer(16, True), size)

    from safetensors.torch import load_file

    arm("safetensors load_file(cuda)", lambda: load_file(str(st_path), device="cuda:0"), size)

    def instanttensor() -> Any:
        # Buffered I/O: its default Direct I/O would bypass the page cache every arm reads.
        os.environ["INSTANTTENSOR_BACKEND"] = "BUFFERED"
        from instanttensor import safe_open

        tensors = {}
        with safe_open(str(st_path), framework="pt", device=0) as f:
            for name, tensor in f.tensors():
                tensors[name] = tensor
        return tensors

    arm("InstantTensor safe_open", instanttensor, size)

    def fastsafetensors() -> Any:
        from fastsafetensors import fastsafe_open

        tensors = {}
        with fastsafe_open(filenames=[str(st_path)], nogds=True, device="cuda:0") as f:
            for name in f.keys():  # noqa: SIM118 - its handle is no dict
                tensors[name] = f.get_tensor(name).clone()
        return tensors

    arm("fastsafetensors (nogds)", fastsafetensors, size)

    def runai() -> Any:
        os.environ.setdefault("RUNAI_STREAMER_CONCURRENCY", "16")
        from runai_model_streamer import SafetensorsStreamer

        tensors = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(str(st_path))
            for name, tensor in streamer.get_tensors():
                tensors[name] = tensor.to("cuda", non_blocking=True)
        return tensors

    arm("Run:ai model streamer (concurrency 16)", runai, size)
    del torch


if __name__ == "__main__":
    sys.exit(main())
