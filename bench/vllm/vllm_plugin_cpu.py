"""The vLLM loader plugin against vLLM's own Llama and serializer, on a CPU (no GPU, no engine):
the plugin's side of bench/vllm/vllm_plugin_real.py, checked before any device time is spent.

    PYTHONPATH=SITE python bench/vllm/vllm_plugin_cpu.py     # SITE: vLLM 0.24 and the wheels it
                                                        # imports; a CPU torch beside them

vLLM's CUDA wheel imports without a GPU (bench/vllm/vllm_wheels.py's set, installed with
``pip install --no-deps --target SITE``; for another Python take its builds of the binary
wheels). vLLM chooses its CPU platform only for a CPU build, so it is set here by hand
(``vllm.platforms._current_platform``); then vLLM's EngineArgs builds the config and vLLM's
``initialize_model`` builds its real LlamaForCausalLM on the CPU. With the registry played on
loopback (bench/common.py), checked:

1. the plugin registers through its entry point (vLLM's ``load_general_plugins`` finds the
   dist-info on PYTHONPATH), EngineArgs takes ``load_format="tensor-registry"``, and
   ``get_model_loader`` builds our loader from vLLM's LoadConfig;
2. ``hf`` artifact (the worker's serialize_hf) -> our ``load_weights`` -> vLLM's own
   ``LlamaForCausalLM.load_weights`` (fuses q/k/v and gate/up, reports what it loaded): every
   parameter equals the fused source, bit for bit;
3. vLLM's ``serialize_vllm_model`` on that model writes the ``vllm`` artifact (the marker, the
   rotary cache, the attention scales); our ``load_weights`` copies it into a fresh model:
   every parameter and buffer equals the serialized model's.

Not covered here: vLLM's engine, its attention kernels, generation, and its TensorizerLoader
(it asks for an accelerator). Prints JSON; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def everything(model: Any) -> dict[str, Any]:
    """Parameters and buffers (what a vllm-format file holds), less the serializer's marker."""
    tensors = {
        n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]
    }
    tensors.pop("vllm_tensorized_marker", None)
    return tensors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-plugin-cpu"))
    args = parser.parse_args()
    import shutil

    import torch

    from bench.common import publish_files, resolve_answer, resolve_server
    from bench.engine.gpu_load import builtin_server
    from bench.vllm.vllm_check import build_model
    from bench.vllm.vllm_plugin_real import fused_state, plugin_site, same_bytes, write_hf_artifact
    from tensor_registry.api.resolution import Resolution
    from tensor_registry.vllm.plugin import LOAD_FORMAT, extra_config_for

    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    site = plugin_site(work / "site")
    sys.path.insert(0, str(site))  # the entry point, as the GPU bench's children see it
    src, storage = work / "src", work / "storage"
    model = build_model("bfloat16", hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2)
    model.save_pretrained(src, safe_serialization=True)
    expected = fused_state(dict(model.state_dict()))
    hf_files = write_hf_artifact(model, storage / "hf")
    del model
    checks: dict[str, Any] = {}

    import vllm
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # type: ignore[attr-defined]
    from vllm.config import set_current_vllm_config
    from vllm.config.load import LoadConfig
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader import tensorizer as vllm_tensorizer
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.plugins import load_general_plugins
    from vllm.utils.torch_utils import set_default_torch_dtype

    checks["vllm"] = vllm.__version__
    with contextlib.ExitStack() as stack:
        sign = stack.enter_context(builtin_server(storage))
        answers = {
            "bench/llama-hf": resolve_answer("bench/llama-hf", "hf", 1, hf_files, sign, "hf")
        }
        url = stack.enter_context(resolve_server(answers))
        os.environ.update(
            TENSOR_REGISTRY_URL=url,
            TENSOR_REGISTRY_TOKEN="trg_bench",
            TENSOR_REGISTRY_CACHE_DIR=str(work / "cache"),
        )
        load_general_plugins()
        hf_extra = extra_config_for(Resolution(answers["bench/llama-hf"]))

        def engine_config() -> Any:
            return EngineArgs(
                model=str(src),
                load_format=LOAD_FORMAT,
                model_loader_extra_config=hf_extra,
                dtype="bfloat16",
                enforce_eager=True,
                skip_tokenizer_init=True,
                max_model_len=128,
            ).create_engine_config()

        def fresh_model() -> Any:
            config = engine_config()  # one config per model: vLLM names its attention layers
            with (
                set_current_vllm_config(config),
                torch.device("cpu"),
                set_default_torch_dtype(torch.bfloat16),
            ):
                return initialize_model(vllm_config=config, model_config=config.model_config)

        config = engine_config()
        checks["load_format"] = config.load_config.load_format
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{tempfile.mktemp(dir=work)}",
            backend="gloo",
        )
        with set_current_vllm_config(config):
            initialize_model_parallel(1, 1)

        # 2. hf artifact -> vLLM's Llama.load_weights
        loader = get_model_loader(
            LoadConfig(load_format=LOAD_FORMAT, model_loader_extra_config=hf_extra)
        )
        checks["loader"] = type(loader).__qualname__
        model = fresh_model()
        started = time.perf_counter()
        with set_current_vllm_config(config):
            loader.load_weights(model, config.model_config)
        params = dict(model.named_parameters())
        checks["hf"] = {
            "load_weights_s": round(time.perf_counter() - started, 3),
            "parameters": len(params),
            "bit_exact": set(params) == set(expected)
            and all(same_bytes(params[k], v) for k, v in expected.items()),
        }

        # 3. vLLM's serializer on that model -> vllm artifact -> a fresh model
        vllm_tensorizer.serialize_extra_artifacts = lambda *a, **k: None  # no Hub downloads
        (storage / "vllm").mkdir(parents=True)
        with set_current_vllm_config(config):
            vllm_tensorizer.serialize_vllm_model(
                model,
                vllm_tensorizer.TensorizerConfig(
                    tensorizer_uri=str(storage / "vllm" / "model.tensors")
                ),
                config.model_config,
            )
        serialized = everything(model)
        vllm_files = publish_files(storage / "vllm", ["model.tensors"])
        answers["bench/llama-vllm"] = resolve_answer(
            "bench/llama-vllm", "vllm", 1, vllm_files, sign, "vllm"
        )
        vllm_extra = extra_config_for(Resolution(answers["bench/llama-vllm"]))
        loader = get_model_loader(
            LoadConfig(load_format=LOAD_FORMAT, model_loader_extra_config=vllm_extra)
        )
        fresh = fresh_model()
        started = time.perf_counter()
        with set_current_vllm_config(config):
            loader.load_weights(fresh, config.model_config)
        loaded = everything(fresh)
        checks["vllm_format"] = {
            "load_weights_s": round(time.perf_counter() - started, 3),
            "tensors": len(serialized),
            "buffers": sorted({n.rsplit(".", 1)[-1] for n, _ in fresh.named_buffers()}),
            "bit_exact": set(loaded) == set(serialized)
            and all(same_bytes(loaded[k], v) for k, v in serialized.items()),
        }
    ok = checks["load_format"] == LOAD_FORMAT and checks["hf"]["bit_exact"]
    ok = ok and checks["vllm_format"]["bit_exact"]
    checks["ok"] = bool(ok)
    print(json.dumps(checks))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
