"""GPU check: tensorize a large random-weight model on CUDA with the worker's own functions,
load it back to CUDA with tensorizer, and check every tensor is bit-identical.

Steps (each timed; ratios against baselines measured in the same run):

1. build a random-weight Llama of ``--size-gb`` GB (target dtype) on the GPU, save safetensors;
2. ``tensor_registry_server.artifacts.making.modeling.load_model(dir, dtype, device="cuda:0")``
(the job's
load);
3. ``tensor_registry_server.artifacts.making.serialize.serialize_hf`` into
``LocalStorage.open_sink(...)`` +
``commit()`` (the
   job's serialize-to-publish); baseline: the same bytes written raw through a sink of the
   same storage and committed;
4. ``TensorDeserializer(file, device="cuda:0", num_readers=N)``: every tensor to the GPU;
   baseline: the file read raw into pinned host memory and copied to the GPU;
5. ``torch.equal`` on the GPU for every tensor of the model's state_dict.

    python bench/worker/gpu_check.py --size-gb 10            # on a CUDA machine (H200: see results)
    python bench/worker/gpu_check.py --size-gb 0.05  # sanity check; CPU-only falls back to cpu

Exit status 1 when any tensor differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1_000_000_000
CHUNK = 256 * 1024 * 1024


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / GB:7.3f} GB/s ({seconds:6.2f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=10.0)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--num-readers", type=int, default=8)
    parser.add_argument("--encrypt", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the files go (default: /tmp)")
    args = parser.parse_args()

    import tensorizer
    import torch
    from tensorizer import DecryptionParams, TensorDeserializer
    from transformers import LlamaForCausalLM

    from bench.common import llama_config
    from tensor_registry_server.artifacts.making.modeling import load_model
    from tensor_registry_server.artifacts.making.serialize import new_encryption_key, serialize_hf
    from tensor_registry_server.storage.local import LocalStorage

    if torch.cuda.is_available():
        device = "cuda:0"
        name = torch.cuda.get_device_name(0)
    else:
        device = "cpu"
        name = "cpu"
        print("NOTICE: no CUDA device; running on the CPU (a sanity check, not GPU figures)")
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[
        args.dtype
    ]
    element = torch.empty(0, dtype=dtype).element_size()
    hidden = 4096 if args.size_gb >= 4 else 1024 if args.size_gb >= 0.5 else 256
    print(
        f"device {name}; torch {torch.__version__}; tensorizer {tensorizer.__version__}; "
        f"dtype {args.dtype}; target {args.size_gb} GB",
        flush=True,
    )

    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.workdir))
    try:
        src = work / "source"
        storage = LocalStorage(work / "storage")

        t = time.perf_counter()
        config = llama_config(int(args.size_gb * GB), element, hidden)
        torch.manual_seed(0)
        with torch.device("meta"):
            built = LlamaForCausalLM(config)
        built = built.to_empty(device=device).to(dtype)
        with torch.no_grad():
            for param in built.parameters():
                param.normal_(0, 0.02)
        built.save_pretrained(str(src))
        del built
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        print(f"built and saved the source in {time.perf_counter() - t:.1f} s", flush=True)

        # 2. The job's load.
        t = time.perf_counter()
        model = load_model(src, dtype=args.dtype, device=device)
        sync(device)
        load_s = time.perf_counter() - t
        state = model.state_dict()
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        first = next(iter(state.values()))
        print(f"model: {nbytes / GB:.2f} GB, {len(state)} tensors, on {first.device}")
        print(f"load (safetensors -> {device})        {rate(nbytes, load_s)}", flush=True)

        # 3. The job's serialize-to-publish, and the raw baseline on the same storage.
        key = new_encryption_key() if args.encrypt else None
        t = time.perf_counter()
        sink = storage.open_sink("artifacts/gpu-check/model.tensors")
        stats = serialize_hf(model, sink, encryption_key=key)  # type: ignore[arg-type]
        stored = sink.commit()
        ser_s = time.perf_counter() - t
        path = storage.local_path(stored.key)
        host = torch.empty(min(CHUNK, stats.tensor_bytes), dtype=torch.uint8).numpy()
        host[:] = 7
        t = time.perf_counter()
        raw = storage.open_sink("artifacts/gpu-check/raw.bin")
        left = stats.tensor_bytes
        while left > 0:
            n = min(left, len(host))
            raw.write(memoryview(host)[:n])
            left -= n
        raw.commit()
        raw_w_s = time.perf_counter() - t
        print(f"serialize {device} -> committed file   {rate(stats.tensor_bytes, ser_s)}")
        print(f"raw write, same storage sink       {rate(stats.tensor_bytes, raw_w_s)}")
        print(f"ratio serialize / raw write        {raw_w_s / ser_s:7.2f}", flush=True)

        # 4. Load back to the device with tensorizer; raw read baseline.
        encryption = DecryptionParams.from_key(key) if key is not None else None
        t = time.perf_counter()
        with TensorDeserializer(
            str(path), device=device, num_readers=args.num_readers, encryption=encryption
        ) as deserializer:
            loaded = {k: v for k, v in deserializer.items()}
        sync(device)
        de_s = time.perf_counter() - t
        pinned = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=device.startswith("cuda"))
        target = torch.empty(CHUNK, dtype=torch.uint8, device=device)
        view = memoryview(pinned.numpy())
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                target[:n].copy_(pinned[:n], non_blocking=True)
                sync(device)
        raw_r_s = time.perf_counter() - t
        file_bytes = os.path.getsize(path)
        print(f"tensorizer load file -> {device}      {rate(stats.tensor_bytes, de_s)}")
        print(f"raw read file -> pinned -> {device}   {rate(file_bytes, raw_r_s)}")
        load_ratio = (stats.tensor_bytes / de_s) / (file_bytes / raw_r_s)
        print(f"ratio tensorizer load / raw read   {load_ratio:7.2f}")

        # 5. Bit-identical, on the device.
        missing = sorted(set(state) - set(loaded))
        differing = [k for k, v in state.items() if k in loaded and not torch.equal(loaded[k], v)]
        wrong_device = [k for k, v in loaded.items() if str(v.device) != str(torch.device(device))]
        print(
            f"tensors: {len(state)} in the model, {len(loaded)} loaded, {len(missing)} missing, "
            f"{len(differing)} differing, {len(wrong_device)} not on {device}"
        )
        ok = not missing and not differing and not wrong_device
        print("BIT-IDENTICAL: yes" if ok else f"BIT-IDENTICAL: NO {(missing + differing)[:5]}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
