"""Tensorize throughput and worker memory, against baselines measured in the same run.

A random-weight Llama of ``--size-gb`` GB (in the target dtype) is saved as safetensors. A
fresh child process, doing what the tensorize job does
(``tensor_registry_server.artifacts.making.modeling.load_model`` on
the local storage's files, then ``tensor_registry_server.artifacts.making.serialize.serialize_hf``
into a
``LocalStorage.open_sink`` for ``artifacts/<id>/model.tensors`` and ``commit()``), reports:

- throughput: tensor bytes / seconds from the start of serialize to the committed (published)
  object, as recorded on artifacts (``stats.bytes_per_second``);
- baseline: the same number of bytes written raw through a sink of the same storage and
  committed (same hashing and fsync on commit); ratio = tensorize / raw (target >= 0.7);
- peak RSS of the process (VmHWM, imports of torch/transformers/tensorizer included) / the
  model's size in the target dtype (target <= 1.3).

    .venv/bin/python bench/worker/tensorize.py --size-gb 1            # bfloat16 source and target
    .venv/bin/python bench/worker/tensorize.py --size-gb 1 --encrypt
    .venv/bin/python bench/worker/tensorize.py --size-gb 1 --source-dtype float32   # cast on load
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1_000_000_000
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def make_model(directory: Path, size_gb: float, target: str, source: str) -> int:
    import torch
    from transformers import LlamaForCausalLM

    from bench.common import llama_config

    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    config = llama_config(int(size_gb * GB), DTYPE_BYTES[target])
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(dtypes[source])
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    model.save_pretrained(str(directory))
    count = sum(p.numel() for p in model.parameters())
    del model
    return count * DTYPE_BYTES[target]


def peak_rss() -> int:
    """This process's own high-water RSS (VmHWM; ``ru_maxrss`` would carry the parent's
    RSS at fork time across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(args: argparse.Namespace) -> None:
    """One tensorize, as the worker runs it; prints a JSON line of figures."""
    import tensorizer  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from tensor_registry_server.artifacts.making.modeling import load_model
    from tensor_registry_server.artifacts.making.serialize import new_encryption_key, serialize_hf
    from tensor_registry_server.storage.local import LocalStorage

    rss_imports = peak_rss()
    storage = LocalStorage(Path(args.storage))
    started = time.perf_counter()
    model = load_model(Path(args.source), dtype=args.dtype, device=args.device)
    loaded = time.perf_counter()
    key = new_encryption_key() if args.encrypt else None
    t0 = time.perf_counter()
    sink = storage.open_sink("artifacts/bench/model.tensors")
    stats = serialize_hf(model, sink, encryption_key=key)  # type: ignore[arg-type]
    stored = sink.commit()
    seconds = time.perf_counter() - t0
    peak = peak_rss()
    print(
        json.dumps(
            {
                "tensor_bytes": stats.tensor_bytes,
                "file_bytes": stored.size,
                "seconds": seconds,
                "load_seconds": loaded - started,
                "peak_rss": peak,
                "rss_after_imports": rss_imports,
                "tensor_count": stats.tensor_count,
            }
        )
    )


def raw_child(args: argparse.Namespace) -> None:
    """Baseline: the same bytes, written raw through a sink of the same storage."""
    from tensor_registry_server.storage.local import LocalStorage

    storage = LocalStorage(Path(args.storage))
    chunk = bytearray(os.urandom(1 << 20)) * 64  # 64 MiB, not compressible
    t0 = time.perf_counter()
    sink = storage.open_sink("artifacts/bench/raw.bin")
    left = args.bytes
    while left > 0:
        n = min(left, len(chunk))
        sink.write(memoryview(chunk)[:n])
        left -= n
    sink.commit()
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def run_child(mode: str, **kwargs: object) -> dict[str, float]:
    argv = [sys.executable, __file__, f"--{mode}"]
    for name, value in kwargs.items():
        if value is True:
            argv.append(f"--{name.replace('_', '-')}")
        elif value not in (None, False):
            argv += [f"--{name.replace('_', '-')}", str(value)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--source-dtype", default=None, choices=sorted(DTYPE_BYTES))
    parser.add_argument("--encrypt", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2, help="interleaved runs; best of each")
    parser.add_argument("--workdir", default=None, help="default: a temp dir under /tmp")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--raw-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--storage", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.raw_child:
        raw_child(args)
        return

    source_dtype = args.source_dtype or args.dtype
    work = Path(tempfile.mkdtemp(prefix="bench-tensorize-", dir=args.workdir))
    try:
        src = work / "source"
        storage = work / "storage"
        t = time.perf_counter()
        model_bytes = make_model(src, args.size_gb, args.dtype, source_dtype)
        print(
            f"model: {model_bytes / GB:.2f} GB in {args.dtype} (source {source_dtype}), "
            f"made in {time.perf_counter() - t:.1f}s",
            flush=True,
        )
        best_tz: dict[str, float] | None = None
        best_raw: dict[str, float] | None = None
        for run in range(args.runs):
            tz = run_child(
                "child",
                storage=storage,
                source=src,
                dtype=args.dtype,
                device=args.device,
                encrypt=args.encrypt,
            )
            raw = run_child("raw-child", storage=storage, bytes=int(tz["tensor_bytes"]))
            print(
                f"run {run + 1}: tensorize {tz['tensor_bytes'] / tz['seconds'] / GB:.3f} GB/s, "
                f"raw {tz['tensor_bytes'] / raw['seconds'] / GB:.3f} GB/s, "
                f"peak RSS {tz['peak_rss'] / GB:.2f} GB",
                flush=True,
            )
            if best_tz is None or tz["seconds"] < best_tz["seconds"]:
                best_tz = tz
            if best_raw is None or raw["seconds"] < best_raw["seconds"]:
                best_raw = raw
            shutil.rmtree(storage, ignore_errors=True)
        assert best_tz is not None and best_raw is not None
        tz_rate = best_tz["tensor_bytes"] / best_tz["seconds"]
        raw_rate = best_tz["tensor_bytes"] / best_raw["seconds"]
        peak = max(best_tz["peak_rss"], 0)
        print()
        print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
        print(
            f"tensor bytes        {best_tz['tensor_bytes'] / GB:.3f} GB "
            f"({int(best_tz['tensor_count'])} tensors), file {best_tz['file_bytes'] / GB:.3f} GB"
        )
        print(f"tensorize           {tz_rate / GB:.3f} GB/s (serialize start -> committed)")
        print(f"raw write, same sink {raw_rate / GB:.3f} GB/s")
        print(f"ratio tensorize/raw {tz_rate / raw_rate:.2f}  (target >= 0.7)")
        print(f"load                {best_tz['load_seconds']:.1f}s")
        print(f"RSS after imports   {best_tz['rss_after_imports'] / GB:.3f} GB")
        print(f"peak RSS            {peak / GB:.3f} GB")
        print(f"ratio peak RSS/model {peak / model_bytes:.2f}  (target <= 1.3)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
