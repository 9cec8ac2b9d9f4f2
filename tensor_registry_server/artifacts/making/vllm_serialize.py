"""Write vLLM-format tensorizer files with vLLM's own serializer, in a process of its own.

    python -m tensor_registry_server.artifacts.making.vllm_serialize --src DIR --out-uri
    DIR/model.tensors
    --dtype bfloat16 \
        [--tensor-parallel-size N] [--keyfile PATH]

`tensor_registry_server.artifacts.making.serialize.serialize_vllm` runs this as a child process of
the job,
because vLLM builds
a whole engine (its own processes for tensor parallelism, CUDA contexts, most of the GPU's
memory for the KV cache) that must be gone, GPU memory included, when the job ends or is
cancelled: killing the child's process group does that; nothing of vLLM lives in the Celery
pool process.

What vLLM's `tensorize_vllm_model` does, and the one step done differently here:
`EngineArgs(...).create_engine_config()` → `LLMEngine.from_vllm_config(...)` (vLLM loads the
safetensors into its own fused, sharded modules) → on every worker (one per tensor-parallel
rank) `serialize_vllm_model(model, TensorizerConfig, model_config)`, which registers the
`vllm_tensorized_marker` parameter, formats the rank into a `%0Nd` URI and writes the module
with `TensorSerializer.write_module`. After writing it calls `serialize_extra_artifacts`, which
downloads the config and tokenizer files from the Hugging Face Hub by the served model name:
that fails for any private model and on a worker with no internet (the name is a local
directory here). The registry writes those files beside the weights itself, so the rpc below
runs `serialize_vllm_model` with that step switched off in the worker process that runs it.

On success the last line of stdout is a JSON object: {"files": [...], "vllm_version": "..."}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any


def save_rank(worker: Any, uri: str, keyfile: str | None) -> str:
    """Runs inside each vLLM worker (`collective_rpc`): serialize this rank's module."""
    import vllm.model_executor.model_loader.tensorizer as vt

    # The registry writes config.json and the tokenizer files itself (see the module docstring).
    vt.serialize_extra_artifacts = lambda *args, **kwargs: None
    config = vt.TensorizerConfig(tensorizer_uri=uri, encryption_keyfile=keyfile)
    vt.serialize_vllm_model(worker.get_model(), config, worker.model_config)
    if config._is_sharded:
        from vllm.distributed import get_tensor_model_parallel_rank

        return uri % get_tensor_model_parallel_rank()
    return uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--src", required=True, help="model directory (config.json, safetensors)")
    parser.add_argument("--out-uri", required=True, help="file path; '%%03d' in it for tp > 1")
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--keyfile", default=None, help="32 raw bytes: encrypt with this key")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    args = parser.parse_args(argv)

    sharded = re.search(r"%0\dd", args.out_uri) is not None
    if (args.tensor_parallel_size > 1) != sharded:
        parser.error("--out-uri needs a %0Nd rank template exactly when tensor parallel size > 1")

    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    engine_args = EngineArgs(
        model=args.src,
        dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        # Serializing runs no requests: no CUDA graphs, no compilation, no tokenizer.
        enforce_eager=True,
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        load_format="safetensors",
    )
    engine = LLMEngine.from_vllm_config(engine_args.create_engine_config())
    try:
        files = engine.collective_rpc(
            save_rank, kwargs={"uri": args.out_uri, "keyfile": args.keyfile}
        )
    finally:
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
    print(json.dumps({"files": sorted(set(files)), "vllm_version": vllm.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    # Worker processes (tensor parallel) must not inherit a CUDA context from this one.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    sys.exit(main())
