"""A stand-in `vllm` package for the model-loader plugin (vLLM cannot be installed here).

It extends the stand-in of tests/workers/test_vllm_serialize.py (FAKE_VLLM, vLLM 0.24's
serializing interface; imported when written) with the loading side, as read in vLLM's source
(docs/vllm-loader-plugin.md has the files and commits):

- ``vllm.plugins.load_general_plugins()``: calls every ``vllm.general_plugins`` entry point
  (importlib.metadata), once per process;
- ``vllm.model_executor.model_loader``: ``register_model_loader(name)`` (refuses classes that
  are not ``BaseModelLoader`` subclasses, warns on a second registration) and
  ``get_model_loader(load_config)`` (ValueError for an unknown format);
- ``base_loader.BaseModelLoader``: ``__init__(load_config)``, abstract ``download_model`` and
  ``load_weights(model, model_config)``; ``load_model(vllm_config, model_config)`` builds the
  model on the target device in the model's dtype, calls ``load_weights``, then
  ``process_weights_after_loading``;
- ``vllm.distributed``: the tensor-parallel rank and world size (from STANDIN_TP_RANK /
  STANDIN_TP_SIZE: each rank is its own process, as in vLLM; ``none``: no group yet);
- ``vllm.config``: ``LoadConfig(load_format, model_loader_extra_config, device)``,
  ``ModelConfig(model, dtype, quantization)``, ``DeviceConfig``, ``VllmConfig``;
- two model classes shaped like vLLM's: ``ToyForCausalLM``, a fused, column-parallel
  ``qkv_proj`` and a row-parallel ``o_proj`` sharded by rank, a replicated norm, a buffer, and
  a ``load_weights(weights)`` that takes Hugging Face names (q/k/v_proj), fuses and shards them
  for the rank and returns the names it filled; ``LlamaForCausalLM`` (one rank), vLLM's Llama
  parameter names (``qkv_proj``, ``gate_up_proj``) built from a transformers config.json, whose
  ``load_weights`` fuses a Hugging Face Llama state dict (bench/vllm/vllm_plugin_real.py --standin).

``write_standin(..., serving=True)`` adds `vllm serve` with vLLM 0.24's compile-cache layout and
hash (SERVING_VLLM; docs/warm-state.md); ``distribution=True`` a dist-info so that
``importlib.metadata.version("vllm")`` answers.

``python -m vllm.standin_worker SPEC.json`` plays one vLLM worker process: plugins, the logged
load config, ``get_model_loader(...).load_model(...)``, then it saves the model's state dict and
whether every parameter kept its storage (in-place load) to SPEC's ``out``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

LOADING_VLLM = {
    "vllm/distributed/__init__.py": """
        import os

        RANK = int(os.environ.get("STANDIN_TP_RANK", "0"))
        # "none": this process has no tensor-parallel group (vLLM asserts then).
        WORLD_SIZE = os.environ.get("STANDIN_TP_SIZE", "1")


        def get_tensor_model_parallel_rank():
            return RANK


        def get_tensor_model_parallel_world_size():
            assert WORLD_SIZE != "none", "tensor model parallel group is not initialized"
            return int(WORLD_SIZE)
    """,
    "vllm/config/__init__.py": """
        import json, os
        import torch


        class LoadConfig:
            def __init__(self, load_format="auto", model_loader_extra_config=None, device=None):
                self.load_format = load_format
                self.model_loader_extra_config = model_loader_extra_config or {}
                self.device = device

            def __repr__(self):
                return (f"LoadConfig(load_format={self.load_format!r}, "
                        f"model_loader_extra_config={self.model_loader_extra_config!r}, "
                        f"device={self.device!r})")


        class ModelConfig:
            def __init__(self, model, dtype="auto", quantization=None):
                self.model = model
                self.hf_config = json.load(open(os.path.join(model, "config.json")))
                if dtype == "auto":
                    dtype = self.hf_config.get("torch_dtype", "float32")
                self.dtype = getattr(torch, dtype)
                self.quantization = quantization


        class DeviceConfig:
            def __init__(self, device="cpu"):
                self.device = device


        class VllmConfig:
            def __init__(self, model_config, load_config, device_config):
                self.model_config = model_config
                self.load_config = load_config
                self.device_config = device_config
    """,
    "vllm/plugins/__init__.py": """
        from importlib.metadata import entry_points

        DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
        _loaded = False


        def load_general_plugins():
            global _loaded
            if _loaded:
                return
            _loaded = True
            for plugin in entry_points(group=DEFAULT_PLUGINS_GROUP):
                plugin.load()()
    """,
    "vllm/model_executor/models.py": """
        import torch
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)


        class ToyForCausalLM(torch.nn.Module):
            def __init__(self, hf_config):
                super().__init__()
                hidden, vocab = hf_config["hidden_size"], hf_config["vocab_size"]
                self.tp = get_tensor_model_parallel_world_size()
                self.rank = get_tensor_model_parallel_rank()
                shard = hidden // self.tp
                self.embed = torch.nn.Embedding(vocab, hidden)
                self.qkv_proj = torch.nn.Linear(hidden, 3 * shard, bias=False)
                self.o_proj = torch.nn.Linear(shard, hidden, bias=False)
                self.norm = torch.nn.Parameter(torch.empty(hidden))
                self.register_buffer("position_ids", torch.zeros(8, dtype=torch.long))
                self.processed = False

            def load_weights(self, weights):
                params = dict(self.named_parameters())
                params.update(self.named_buffers())
                loaded = set()
                qkv = {}
                for name, tensor in weights:
                    if name in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
                        qkv[name[0]] = tensor.chunk(self.tp, dim=0)[self.rank]
                        continue
                    if name == "o_proj.weight":
                        tensor = tensor.chunk(self.tp, dim=1)[self.rank]
                    target = params[name]
                    with torch.no_grad():
                        target.copy_(tensor)
                    loaded.add(name)
                if qkv:
                    with torch.no_grad():
                        self.qkv_proj.weight.copy_(torch.cat([qkv["q"], qkv["k"], qkv["v"]]))
                    loaded.add("qkv_proj.weight")
                return loaded


        class _Norm(torch.nn.Module):
            def __init__(self, hidden):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.empty(hidden))


        def _linear(inputs, outputs):
            return torch.nn.Linear(inputs, outputs, bias=False)


        class LlamaForCausalLM(torch.nn.Module):
            # vLLM's parameter names for a Llama (fused qkv_proj and gate_up_proj), one rank,
            # and a load_weights that takes Hugging Face names and fuses them.
            def __init__(self, c):
                super().__init__()
                assert get_tensor_model_parallel_world_size() == 1
                hidden, inter = c["hidden_size"], c["intermediate_size"]
                heads = c["num_attention_heads"]
                kv = c.get("num_key_value_heads") or heads
                head_dim = c.get("head_dim") or hidden // heads
                self.shards = {
                    "q_proj": ("qkv_proj", 0, heads * head_dim),
                    "k_proj": ("qkv_proj", heads * head_dim, kv * head_dim),
                    "v_proj": ("qkv_proj", (heads + kv) * head_dim, kv * head_dim),
                    "gate_proj": ("gate_up_proj", 0, inter),
                    "up_proj": ("gate_up_proj", inter, inter),
                }
                self.model = torch.nn.Module()
                self.model.embed_tokens = torch.nn.Embedding(c["vocab_size"], hidden)
                self.model.layers = torch.nn.ModuleList()
                for _ in range(c["num_hidden_layers"]):
                    layer = torch.nn.Module()
                    layer.self_attn = torch.nn.Module()
                    layer.self_attn.qkv_proj = _linear(hidden, (heads + 2 * kv) * head_dim)
                    layer.self_attn.o_proj = _linear(heads * head_dim, hidden)
                    layer.mlp = torch.nn.Module()
                    layer.mlp.gate_up_proj = _linear(hidden, 2 * inter)
                    layer.mlp.down_proj = _linear(inter, hidden)
                    layer.input_layernorm = _Norm(hidden)
                    layer.post_attention_layernorm = _Norm(hidden)
                    self.model.layers.append(layer)
                self.model.norm = _Norm(hidden)
                self.lm_head = _linear(hidden, c["vocab_size"])
                self.processed = False

            def load_weights(self, weights):
                params = dict(self.named_parameters())
                loaded = set()
                for name, tensor in weights:
                    module, _, leaf = name.rpartition(".")
                    parent, _, part = module.rpartition(".")
                    if part in self.shards:
                        fused, start, size = self.shards[part]
                        name = f"{parent}.{fused}.{leaf}"
                        target = params[name].data.narrow(0, start, size)
                    else:
                        target = params[name].data
                    with torch.no_grad():
                        target.copy_(tensor)
                    loaded.add(name)
                return loaded


        def initialize_model(vllm_config, model_config):
            architecture = model_config.hf_config["architectures"][0]
            models = {"ToyForCausalLM": ToyForCausalLM, "LlamaForCausalLM": LlamaForCausalLM}
            return models[architecture](model_config.hf_config)
    """,
    "vllm/model_executor/model_loader/__init__.py": """
        import logging
        from vllm.model_executor.model_loader.base_loader import BaseModelLoader

        logger = logging.getLogger("vllm")


        class DummyModelLoader(BaseModelLoader):
            def download_model(self, model_config):
                pass

            def load_weights(self, model, model_config):
                pass


        _LOAD_FORMAT_TO_MODEL_LOADER = {"dummy": DummyModelLoader}


        def register_model_loader(load_format):
            def wrapper(cls):
                if load_format in _LOAD_FORMAT_TO_MODEL_LOADER:
                    logger.warning("Load format %s is already registered", load_format)
                if not issubclass(cls, BaseModelLoader):
                    raise ValueError("The model loader must be a subclass of BaseModelLoader.")
                _LOAD_FORMAT_TO_MODEL_LOADER[load_format] = cls
                return cls
            return wrapper


        def get_model_loader(load_config):
            if load_config.load_format not in _LOAD_FORMAT_TO_MODEL_LOADER:
                raise ValueError(f"Load format `{load_config.load_format}` is not supported")
            return _LOAD_FORMAT_TO_MODEL_LOADER[load_config.load_format](load_config)
    """,
    "vllm/model_executor/model_loader/base_loader.py": """
        from abc import ABC, abstractmethod
        import torch
        from vllm.model_executor.models import initialize_model


        class BaseModelLoader(ABC):
            def __init__(self, load_config):
                self.load_config = load_config

            @abstractmethod
            def download_model(self, model_config):
                raise NotImplementedError

            @abstractmethod
            def load_weights(self, model, model_config):
                raise NotImplementedError

            def load_model(self, vllm_config, model_config, prefix=""):
                device = vllm_config.load_config.device or vllm_config.device_config.device
                previous = torch.get_default_dtype()
                torch.set_default_dtype(model_config.dtype)
                try:
                    with torch.device(device):
                        model = initialize_model(vllm_config=vllm_config,
                                                 model_config=model_config)
                    # Not vLLM: the stand-in notes each storage to check the load is in place.
                    model.standin_storage = {
                        n: t.data_ptr() for n, t in model.state_dict(keep_vars=True).items()}
                    self.load_weights(model, model_config)
                    model.processed = True  # process_weights_after_loading
                finally:
                    torch.set_default_dtype(previous)
                return model.eval()
    """,
    "vllm/standin_worker.py": """
        import json, logging, sys
        import torch
        from vllm.config import DeviceConfig, LoadConfig, ModelConfig, VllmConfig
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.plugins import load_general_plugins

        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        spec = json.load(open(sys.argv[1]))
        load_general_plugins()
        load_config = LoadConfig(load_format=spec["load_format"],
                                 model_loader_extra_config=spec.get("extra"))
        # vLLM logs the engine config, the extra config with it.
        logging.getLogger("vllm").info("Initializing an engine with config: %r", load_config)
        model_config = ModelConfig(spec["model_dir"], dtype=spec.get("dtype", "auto"),
                                   quantization=spec.get("quantization"))
        vllm_config = VllmConfig(model_config, load_config,
                                 DeviceConfig(spec.get("device", "cpu")))
        loader = get_model_loader(load_config)
        if spec.get("download"):
            loader.download_model(model_config)
        if spec.get("download_only"):
            sys.exit(0)
        model = loader.load_model(vllm_config=vllm_config, model_config=model_config)
        state = model.state_dict(keep_vars=True)
        torch.save({
            "state": {n: t.detach() for n, t in state.items()},
            "in_place": all(state[n].data_ptr() == p for n, p in model.standin_storage.items()),
            "processed": model.processed,
            "loader": type(loader).__qualname__,
        }, spec["out"])
    """,
}


# `vllm serve` as vLLM 0.24 does it for its compile cache (vllm/compilation/backends.py): the
# directory is VLLM_CACHE_ROOT/torch_compile_cache/<sha256(str([env, config, code,
# compiler]))[:10]>/rank_0_0/backbone, logged as "Using cache directory: … for vLLM's
# torch.compile"; cache_key_factors.json written there once; an existing directory is loaded
# ("Directly load the compiled graph(s) … from the cache"), a new one compiled. What the
# config hash leaves out follows vLLM's ignored_factors (gpu_memory_utilization, seed,
# enable_prefix_caching). Then an OpenAI-style server: /health, /v1/models, /v1/completions.
# STANDIN_COMPILE_SECONDS: how long a compile takes; STANDIN_SERVE_RECORD: a JSON file of
# {"hash", "compiled"}; STANDIN_GPU: the compute capability the compiler hash sees.
SERVING_VLLM = {
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/main.py": """
        import argparse, hashlib, json, logging, os, signal, sys, time
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from importlib.metadata import version

        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(levelname)s %(asctime)s [backends.py:650] %(message)s")
        logger = logging.getLogger("vllm")
        IGNORED = {"--gpu-memory-utilization", "--seed", "--enable-prefix-caching",
                   "--no-enable-prefix-caching"}


        def sha(text):
            return hashlib.sha256(text.encode()).hexdigest()


        def main():
            if sys.argv[1:2] != ["serve"]:
                sys.exit("usage: vllm serve MODEL [options]")
            parser = argparse.ArgumentParser(prog="vllm serve")
            parser.add_argument("model")
            parser.add_argument("--host", default="0.0.0.0")
            parser.add_argument("--port", type=int, default=8000)
            parser.add_argument("--dtype", default="auto")
            parser.add_argument("--tensor-parallel-size", type=int, default=1)
            parser.add_argument("--load-format", default="auto")
            parser.add_argument("--served-model-name", default=None)
            parser.add_argument("--model-loader-extra-config", default=None)
            parser.add_argument("--enforce-eager", action="store_true")
            args, rest = parser.parse_known_args(sys.argv[2:])
            hashed = sorted(a for a in rest if a.partition("=")[0] not in IGNORED)
            hf_config = open(os.path.join(args.model, "config.json")).read()
            config_hash = sha(json.dumps({"model": args.model, "dtype": args.dtype,
                                          "tensor_parallel_size": args.tensor_parallel_size,
                                          "hf_config": hf_config, "args": hashed},
                                         sort_keys=True))
            env = {k: os.environ.get(k) for k in ("VLLM_USE_AOT_COMPILE",
                                                   "VLLM_ATTENTION_BACKEND")}
            env_hash = sha(json.dumps(env, sort_keys=True))
            code_hash = sha(open(__file__).read())
            gpu = os.environ.get("STANDIN_GPU", "cpu")
            compiler_hash = sha(f"torch={version('torch')};gpu={gpu}")
            key = sha(str([env_hash, config_hash, code_hash, compiler_hash]))[:10]
            root = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
            compiled = False
            if not args.enforce_eager:
                local = os.path.join(root, "torch_compile_cache", key, "rank_0_0", "backbone")
                hit = os.path.isdir(os.path.join(local, "inductor_cache"))
                os.makedirs(local, exist_ok=True)
                logger.info("Using cache directory: %s for vLLM's torch.compile", local)
                meta = os.path.join(local, "cache_key_factors.json")
                if not os.path.exists(meta):
                    with open(meta, "w") as f:
                        json.dump({"env": env, "config_hash": config_hash, "code_hash": code_hash,
                                   "compiler_hash": compiler_hash}, f, indent=2, sort_keys=True)
                if hit:
                    logger.info("Directly load the compiled graph(s) for compile range "
                                "(1, 8192) from the cache, took 0.010 s")
                else:
                    took = float(os.environ.get("STANDIN_COMPILE_SECONDS", "0.5"))
                    time.sleep(took)
                    graph = os.path.join(local, "inductor_cache", "fxgraph", "ab")
                    os.makedirs(graph, exist_ok=True)
                    open(os.path.join(graph, "fabcdef0123"), "wb").write(os.urandom(4096))
                    kernel = os.path.join(local, "triton_cache", "KERNELHASH0")
                    os.makedirs(kernel, exist_ok=True)
                    open(os.path.join(kernel, "__grp__triton_.json"), "w").write("{}")
                    logger.info("Compiling a graph for compile range (1, 8192) takes %.2f s", took)
                    compiled = True
            record = os.environ.get("STANDIN_SERVE_RECORD")
            if record:
                with open(record, "w") as f:
                    json.dump({"hash": key, "compiled": compiled}, f)
            name = args.served_model_name or args.model

            class Handler(BaseHTTPRequestHandler):
                def log_message(self, *a):
                    pass

                def _send(self, code, body):
                    data = json.dumps(body).encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

                def do_GET(self):
                    if self.path == "/health":
                        self._send(200, {})
                    elif self.path == "/v1/models":
                        self._send(200, {"data": [{"id": name}]})
                    else:
                        self._send(404, {})

                def do_POST(self):
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if self.path != "/v1/completions" or body.get("model") != name:
                        self._send(404, {"error": "unknown model or route"})
                        return
                    self._send(200, {"choices": [{"index": 0, "text": " world"}]})

            server = ThreadingHTTPServer((args.host, args.port), Handler)
            signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
            logger.info("Starting vLLM API server on http://%s:%d", args.host, args.port)
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
            finally:
                server.server_close()


        if __name__ == "__main__":
            main()
    """,
}


def write_standin(
    root: Path, *, serializing: bool = True, serving: bool = False, distribution: bool = False
) -> Path:
    """Write the stand-in package under ``root``; returns ``root`` (for PYTHONPATH).
    ``serializing=False`` leaves out FAKE_VLLM's serializing side (whose test module needs the
    server's packages), for a GPU machine that has only torch (bench/vllm/vllm_plugin_check.py)."""
    files = dict(LOADING_VLLM)
    if serializing:
        from tests.workers.test_vllm_serialize import FAKE_VLLM

        files = {**FAKE_VLLM, **LOADING_VLLM}
    if serving:
        files.update(SERVING_VLLM)
    if distribution:
        # importlib.metadata finds "vllm 0.24.0": what a worker's capability probe reads.
        files["vllm-0.24.0.dist-info/METADATA"] = (
            "Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n"
        )
    files.setdefault("vllm/__init__.py", '__version__ = "0.24.0+standin"\n')
    files.setdefault("vllm/model_executor/__init__.py", "")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root
