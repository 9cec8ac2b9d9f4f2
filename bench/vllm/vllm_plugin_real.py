"""The registry's vLLM loader plugin in a real vLLM on one GPU (issue 12, item 4): weight-load
seconds of ``--load-format tensor-registry`` (tensor_registry/vllm/plugin.py) against vLLM's own
``load_format="tensorizer"`` on the same artifact, in the same run, and the generated tokens of
each against vLLM loading the safetensors source.

    VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/vllm/vllm_plugin_real.py --out $OUT   # vLLM, 1 GPU
    python bench/vllm/vllm_plugin_real.py --standin  # CPU, no vLLM

1. a random-weight Llama (bf16; GQA, so vLLM fuses q/k/v and gate/up; by default hidden 2048,
   12 layers, 672 M parameters, 1.34 GB), saved as safetensors + config.json
   (bench/vllm/vllm_check.py's build_model);
2. two artifacts of it, each with its layout manifest (bench/common.py's publish_files: what
   tensor_registry_server/artifacts/making/layout_writer.py writes at publish): ``hf``, the
   worker's writer
   (tensor_registry_server.artifacts.making.serialize.serialize_hf: Hugging Face names), and
   ``vllm``, vLLM's
   own serializer in
   a child process (tensor_registry_server.artifacts.making.serialize.serialize_vllm: vLLM's fused
   names, the
   marker);
3. the registry played on loopback (bench/common.py): bench/engine/gpu_load.py's signed range server
   for the files, a resolve endpoint answering what GET /api/v1/resolve answers for them
   (signed URLs, the registry's engine advice for the caller, the ``vllm`` block's tensorizer
   config);
4. vLLM, each run in its own process (vLLM keeps GPU memory until its process ends), greedy
   tokens from fixed token ids (bench/vllm/vllm_check.py's generate: enforce_eager, no tokenizer,
   max_model_len 256, gpu_memory_utilization 0.3):
   - ``safetensors``: the reference tokens;
   - ``tensorizer-url``: vLLM's tensorizer loader on the vllm file, configured exactly as the
     resolve answer's ``vllm`` block says (the signed URL, tensorizer's curl reader, the advised
     ``num_readers``, ``verify_hash``): what a node without the plugin does;
   - ``tensorizer-file``: the same from the local file (tensorizer's best case);
   - ``plugin-vllm`` / ``plugin-hf``: ``load_format="tensor-registry"`` with the extra config
     ``tensor-registry vllm-args --loader tensor-registry`` prints for that artifact
     (extra_config_for); the engine reads the signed URL onto the GPU, every chunk verified;
   - ``plugin-vllm-cache``: the same with the file already in the node cache (the plugin's
     prefetch, what ``download_model`` and ``pull --weights`` do): the engine reads the local
     file, against ``tensorizer-file``;
   - ``plugin-vllm-mp``: the plugin once more with vLLM's engine core in a process of its own
     (the default of ``vllm serve``): the entry point must register the loader there too;
5. per run: ``load_weights_s``, the loader's own ``load_weights`` (weights into the built
   model, CUDA synchronized), timed in the child around the method (the engine core runs in
   the child: VLLM_ENABLE_V1_MULTIPROCESSING=0; not measured in the ``-mp`` run); and vLLM's
   own log lines, parsed from the child's output: "Model loading took X GiB memory and Y
   seconds" (``model_loading_s``: model init + weights + post-processing, every loader),
   "Loading weights took" (default loader), "Deserialized ... in Ys" (tensorizer); the plugin's
   summary line (source, verified, GB/s) and the engine's phases. Tokens against the reference.

Prints one JSON line per run and writes vllm_plugin_real.json to --out after every run (a run
that outlives the call still leaves what was done); exit status 1 when any run fails or any
tokens differ. The files are in the page cache (just written): this measures the loaders and the
loopback transport, not a disk or a network.

How the plugin gets into vLLM without our package installed: a ``*.dist-info`` holding the entry
point (``vllm.general_plugins: tensor_registry = tensor_registry.vllm.plugin:register``) in a folder
on the children's PYTHONPATH. vLLM 0.24 runs ``load_general_plugins()`` (importlib.metadata's
entry points) in EngineArgs.__post_init__, in EngineCore.__init__ and in every worker's
init_worker, once per process; a spawned engine core inherits the PYTHONPATH.

``--standin`` (CPU, no vLLM, no GPU): steps 1-3 for real at a small shape, the vllm artifact
written in vLLM's fused layout by tensorizer directly, then the plugin in the interface stand-in
of harness/vllm_standin.py (its LlamaForCausalLM has vLLM's Llama parameter names), entry point,
timers and log parsing as above; each run's parameters compared bit for bit with the source.

On the nvidia-h200 device machine (no vLLM there: bench/vllm/vllm_wheels.py writes .whlv1-.whlv3
under /work/main, 57.7 + 49.4 + 28.2 MB; the lead's .whl, 28.6 MB, holds tensorizer 2.12.1,
blake3 and the rest), three calls in a row on one warm machine (its /tmp lasts while it stays
warm; call 2 says so when it did not). Each is one shell line; the backslashes only wrap them:

    1. carry [".whlv1"]:
       mkdir -p /tmp/vw && cp .whlv1/* /tmp/vw/ && ls -l /tmp/vw && df -h /tmp
    2. carry [".whlv2"]:
       test -f /tmp/vw/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl.partaa || { echo \\
       'partaa is gone (the machine went cold): redo call 1'; exit 1; }; cp .whlv2/* /tmp/vw/ \\
       && ls -l /tmp/vw
    3. carry [".whlv3", ".whl"], timeout_s 600:
       set -o pipefail; cp .whlv3/* /tmp/vw/ && (cd /tmp/vw && cat \\
       vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl.part?? > \\
       vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl && sha256sum -c SHA256SUMS) && python3 \\
       -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target \\
       /tmp/site /tmp/vw/*.whl .whl/*.whl && export PYTHONPATH=/tmp/site \\
       VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 && python3 bench/vllm/vllm_plugin_real.py \\
       --workdir /tmp/vpr --budget 520 --out $OUT 2>&1 | tee $OUT/log.txt

``--budget 520`` leaves the pip install (about 20 s) and a margin inside the call's 600 s;
runs that would not fit are skipped and listed (``--runs`` picks them for a second call, on
the same warm machine: the install is then already in /tmp/site).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODELS = {"hf": "bench/llama-hf", "vllm": "bench/llama-vllm"}
MARKER = ".vllm_tensorized_marker"
ENTRY_POINTS = "[vllm.general_plugins]\ntensor_registry = tensor_registry.vllm.plugin:register\n"
REAL_SHAPE = {"hidden": 2048, "intermediate": 5632, "heads": 16, "kv_heads": 4, "vocab": 32000}
STANDIN_SHAPE = {"hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "vocab": 256}
# In order of importance: a --budget that runs out skips the last ones.
RUNS = (
    "safetensors",
    "tensorizer-url",
    "plugin-vllm",
    "plugin-hf",
    "tensorizer-file",
    "plugin-vllm-cache",
    "plugin-vllm-mp",
)
# Set for every vLLM process of the bench (the serializer's too) unless already set.
CHILDREN_ENV = {
    # Nothing outside the device machine is reachable: no Hub lookups, no usage reports.
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",  # whatever vLLM binds for its own processes: loopback
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # FlashInfer is not carried (bench/vllm/vllm_wheels.py)
    # xgrammar (vLLM's engine core imports it) imports apache-tvm-ffi, which on a torch without
    # the DLPack exchange API JIT-builds a CUDA extension at import; nothing here uses it.
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
}
LOG_LINES = 400  # of each run's output, into --out's vllm_plugin_real_runs.log

PATTERNS = {
    "model_loading_gib": (re.compile(r"Model loading took ([\d.]+) GiB"), float),
    "model_loading_s": (re.compile(r"Model loading took [\d.]+ GiB memory and ([\d.]+) s"), float),
    "vllm_loading_weights_s": (re.compile(r"Loading weights took ([\d.]+) seconds"), float),
    "tensorizer_deserialized_s": (re.compile(r"Deserialized \S+ \S* ?in ([\d.]+)s"), float),
    "load_weights_s": (re.compile(r"^LOAD_WEIGHTS_S ([\d.]+)", re.M), float),
    "loader_class": (re.compile(r"^LOAD_WEIGHTS_S [\d.]+ (\S+)", re.M), str),
    "tokens": (re.compile(r"^TOKENS (.+)$", re.M), json.loads),
    "plugin": (re.compile(r"tensor-registry: loaded (\{.*\})"), json.loads),
    "engine": (re.compile(r"^ENGINE (\{.*\})$", re.M), json.loads),
}  # fmt: skip


def parse_output(text: str) -> dict[str, Any]:
    """What a child's output says (the first match of each pattern)."""
    found: dict[str, Any] = {}
    for key, (pattern, convert) in PATTERNS.items():
        match = pattern.search(text)
        if match:
            found[key] = convert(match.group(1))
    return found


# ---------------------------------------------------------------------------------------------
# Inside a child process


def _timed(method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = method(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        print(
            f"LOAD_WEIGHTS_S {time.perf_counter() - started:.4f} {type(self).__name__}",
            flush=True,
        )
        return result

    wrapper.bench_timed = True  # type: ignore[attr-defined]
    return wrapper


def time_loaders() -> list[str]:
    """Wrap ``load_weights`` of every loader class vLLM knows (after the plugins ran, ours
    among them) with a timer that prints ``LOAD_WEIGHTS_S seconds Class``."""
    from vllm.model_executor import model_loader

    table = getattr(model_loader, "_LOAD_FORMAT_TO_MODEL_LOADER", {})
    wrapped = []
    for cls in set(table.values()):
        method = vars(cls).get("load_weights")
        if method is not None and not getattr(method, "bench_timed", False):
            cls.load_weights = _timed(method)
            wrapped.append(cls.__name__)
    return sorted(wrapped)


def report_engine_phases() -> None:
    """Print the engine's LoadResult (phases, seconds) for the plugin's load: the plugin's own
    log line carries no phases. vllm_loader imports load_artifact when it runs."""
    import tensor_registry.engine as engine

    original = engine.load_artifact

    @functools.wraps(original)
    def load_artifact(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        phases = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.phases.items()}
        line = {"seconds": round(result.seconds, 4), "gbps": round(result.gbps, 3), **phases}
        print("ENGINE " + json.dumps(line), flush=True)
        return result

    engine.load_artifact = load_artifact  # type: ignore[assignment]


CHILD_ENV = "VLLM_PLUGIN_REAL_CHILD"


def show_plugin_log() -> None:
    """The plugin's summary line (model, source, verified, GB/s) on stdout: its logger has no
    handler of its own. Also at import in a spawned engine core (the ``-mp`` run), which
    imports this file again as ``__mp_main__`` with the child's environment."""
    import logging

    logger = logging.getLogger("tensor_registry")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


if os.environ.get(CHILD_ENV) and __name__ != "__main__":
    show_plugin_log()


def child(args: argparse.Namespace) -> int:
    os.environ[CHILD_ENV] = "1"
    show_plugin_log()

    from vllm.plugins import load_general_plugins

    # vLLM would run the plugins itself (EngineArgs); running them first lets the timers wrap
    # our class too. Through the entry point, as vLLM does: nothing registers it by hand.
    load_general_plugins()
    print("TIMED " + json.dumps(time_loaders()), flush=True)
    report_engine_phases()
    if args.standin_spec:
        import runpy

        sys.argv = ["vllm.standin_worker", args.standin_spec]
        runpy.run_module("vllm.standin_worker", run_name="__main__")
        return 0
    from bench.vllm.vllm_check import generate

    return generate(
        argparse.Namespace(
            src=args.src,
            load=args.load,
            extra_config=args.extra_config,
            dtype=args.dtype,
            uri=None,
            keyfile=None,
        )
    )


# ---------------------------------------------------------------------------------------------
# The parent


def plugin_site(directory: Path) -> Path:
    """A folder for PYTHONPATH whose dist-info declares the plugin's entry point (what
    ``pip install tensor-registry`` would register)."""
    dist = directory / "tensor_registry_bench-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tensor-registry-bench\nVersion: 0\n"
    )
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    return directory


def fused_state(hf: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face Llama state dict in vLLM's layout (one rank): q/k/v into ``qkv_proj``,
    gate/up into ``gate_up_proj``, every other tensor by name (bench/vllm/vllm_check.py checks the
    real serializer's file against the same mapping)."""
    import torch

    out: dict[str, Any] = {}
    for name, tensor in hf.items():
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            parts = [name.replace("q_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat([hf[p] for p in parts])
        elif ".gate_proj." in name:
            parts = [name.replace("gate_proj", p) for p in ("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat([hf[p] for p in parts])
        else:
            out[name] = tensor
    return out


def write_hf_artifact(model: Any, directory: Path) -> list[dict[str, Any]]:
    """``model`` through the worker's hf writer, plus its layout manifest."""
    from bench.common import publish_files
    from tensor_registry_server.artifacts.making.serialize import serialize_hf

    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "model.tensors").open("w+b") as sink:
        serialize_hf(model, sink, encryption_key=None)
    return publish_files(directory, ["model.tensors"])


def write_vllm_artifact(
    src: Path, directory: Path, dtype: str, *, standin_state: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """vLLM's serializer on ``src`` (the worker's serialize_vllm), plus the layout manifest.
    ``standin_state``: no vLLM here, tensorizer writes that (fused) state instead."""
    from bench.common import publish_files

    directory.mkdir(parents=True, exist_ok=True)
    if standin_state is None:
        from tensor_registry_server.artifacts.making.serialize import serialize_vllm

        serialize_vllm(src, directory, dtype=dtype, timeout=600)
    else:
        import torch
        from tensorizer import TensorSerializer

        serializer = TensorSerializer(str(directory / "model.tensors"))
        serializer.write_state_dict({**standin_state, MARKER: torch.zeros(0)})
        serializer.close()
    return publish_files(directory, ["model.tensors"])


def same_bytes(a: Any, b: Any) -> bool:
    import torch

    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    flat = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return bool(torch.equal(*flat))


def run_child(
    label: str,
    command: list[str],
    env: dict[str, str],
    timeout: float,
    log_dir: Path,
) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        rc, output = done.returncode, done.stdout + "\n" + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -9
        output = "\n".join(
            (x.decode(errors="replace") if isinstance(x, bytes) else x or "")
            for x in (exc.stdout, exc.stderr)
        )
        output += f"\n[bench] killed after {timeout:.0f} s"
    (log_dir / f"{label}.log").write_text(output)
    row: dict[str, Any] = {
        "run": label,
        "rc": rc,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    row.update(parse_output(output))
    row["signature_in_log"] = "sig=" in output
    if rc != 0:
        row["tail"] = [line for line in output.strip().splitlines() if line.strip()][-12:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-plugin-real"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, default=None, help="12 (2 with --standin)")
    parser.add_argument("--hidden", type=int, default=None, help="2048 (64 with --standin)")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"of {','.join(RUNS)}")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per vLLM run")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole bench: a run that would not fit (by the slowest so far) "
        "is skipped and listed, so a device call's limit never cuts one short",
    )
    parser.add_argument("--standin", action="store_true", help="CPU: the interface stand-in")
    # A child process (one vLLM):
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--extra-config", help=argparse.SUPPRESS)
    parser.add_argument("--standin-spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    import torch

    from bench.common import resolve_answer, resolve_server
    from bench.engine.gpu_load import builtin_server
    from bench.vllm.vllm_check import build_model
    from tensor_registry.api.resolution import Resolution
    from tensor_registry.vllm.plugin import extra_config_for

    runs = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}")
    if args.standin:
        runs = [r for r in runs if r.startswith("plugin-") and not r.endswith("-mp")]
    shape = dict(STANDIN_SHAPE if args.standin else REAL_SHAPE)
    shape["layers"] = args.layers or (2 if args.standin else 12)
    if args.hidden:
        shape["hidden"] = args.hidden
    started = time.perf_counter()
    for name, value in CHILDREN_ENV.items():  # before vLLM's serializer child starts too
        os.environ.setdefault(name, value)
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    src, storage = work / "src", work / "storage"
    report: dict[str, Any] = {"standin": args.standin, "shape": shape, "runs": []}

    def save() -> None:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "vllm_plugin_real.json").write_text(json.dumps(report, indent=1))
            # One file for every run's output (a device call brings back at most 8 files).
            with (args.out / "vllm_plugin_real_runs.log").open("w") as fh:
                for log in sorted((work / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime):
                    lines = log.read_text(errors="replace").splitlines()
                    fh.write(f"===== {log.stem} ({len(lines)} lines, the last {LOG_LINES})\n")
                    fh.write("\n".join(lines[-LOG_LINES:]) + "\n")

    if not args.standin:
        import vllm

        report["vllm"] = vllm.__version__
        report["device"] = torch.cuda.get_device_name(0)
    report["torch"] = torch.__version__

    # 1. the source
    t0 = time.perf_counter()
    # Built on the GPU (672 M parameters initialize in seconds there, not on 16 CPU cores).
    model = build_model(args.dtype, device="cpu" if args.standin else "cuda", **shape)
    model.save_pretrained(src, safe_serialization=True)
    hf_state = dict(model.state_dict())
    report["source"] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": sum(t.numel() * t.element_size() for t in hf_state.values()),
        "build_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps({"source": report["source"]}), flush=True)

    # 2. the artifacts
    t0 = time.perf_counter()
    hf_files = write_hf_artifact(model, storage / "hf")
    report["hf_artifact_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    # What the stand-in's runs must end with (the real runs compare tokens instead).
    expected = fused_state(hf_state) if args.standin else {}
    del hf_state, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # vLLM's serializer and runs want the GPU's memory
    vllm_files: list[dict[str, Any]] | None = None
    try:
        vllm_files = write_vllm_artifact(
            src, storage / "vllm", args.dtype, standin_state=expected if args.standin else None
        )
    except Exception as exc:  # the runs that need no vllm artifact still run
        report["vllm_artifact_error"] = f"{type(exc).__name__}: {exc}"[-3000:]
        runs = [r for r in runs if r in ("safetensors", "plugin-hf")]
    report["vllm_artifact_s"] = round(time.perf_counter() - t0, 1)
    report["artifact_bytes"] = {
        fmt: next(f["size"] for f in files if f["kind"] == "weights")
        for fmt, files in (("hf", hf_files), ("vllm", vllm_files))
        if files
    }
    print(json.dumps({k: report.get(k) for k in ("hf_artifact_s", "vllm_artifact_s")}), flush=True)
    save()

    site = plugin_site(work / "site")
    standin_pkg = None
    if args.standin:
        from harness.vllm_standin import write_standin

        standin_pkg = write_standin(work / "pkg", serializing=False)
    path = [str(p) for p in (standin_pkg, site, ROOT) if p] + [os.environ.get("PYTHONPATH", "")]
    base_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "TENSOR_REGISTRY_TOKEN": "trg_bench",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONUNBUFFERED": "1",
    }

    # 3. the registry on loopback; 4. the runs
    with contextlib.ExitStack() as stack:
        sign = stack.enter_context(builtin_server(storage))
        answers = {MODELS["hf"]: resolve_answer(MODELS["hf"], "hf", 1, hf_files, sign, "hf")}
        if vllm_files:
            answers[MODELS["vllm"]] = resolve_answer(
                MODELS["vllm"], "vllm", 1, vllm_files, sign, "vllm"
            )
        url = stack.enter_context(resolve_server(answers))
        tensorizer_extra = dict(
            answers.get(MODELS["vllm"], {}).get("vllm", {}).get("model_loader_extra_config", {})
        )
        report["tensorizer_extra_config"] = {
            k: v for k, v in tensorizer_extra.items() if k != "tensorizer_uri"
        }
        plugin_extra = {
            fmt: extra_config_for(Resolution(answers[MODELS[fmt]]), url=None)
            for fmt in MODELS
            if MODELS[fmt] in answers
        }
        report["plugin_extra_config"] = plugin_extra
        for label in runs:
            slowest = max((r["wall_s"] for r in report["runs"]), default=0.0)
            if args.budget and time.perf_counter() - started + slowest > args.budget:
                report.setdefault("skipped", []).append(label)
                print(json.dumps({"skipped": label, "reason": "budget"}), flush=True)
                continue
            env = {
                **base_env,
                "TENSOR_REGISTRY_URL": url,
                # A fresh node cache: the plugin reads the signed URL (vLLM never calls
                # download_model on its own).
                "TENSOR_REGISTRY_CACHE_DIR": str(work / f"cache-{label}"),
            }
            command = [sys.executable, str(Path(__file__).resolve()), "--child"]
            command += ["--dtype", args.dtype, "--src", str(src)]
            if label.endswith("-cache"):
                from tensor_registry.vllm.plugin import parse_extra_config, prefetch

                t0 = time.perf_counter()
                options = parse_extra_config(
                    {
                        **plugin_extra["vllm"],
                        "url": url,
                        "cache_dir": env["TENSOR_REGISTRY_CACHE_DIR"],
                    }
                )
                fetched = prefetch(options, world_size=1, dtype=args.dtype)
                prefetched = {"bytes": fetched, "seconds": round(time.perf_counter() - t0, 2)}
            if label == "safetensors":
                command += ["--load", "safetensors"]
            elif label.startswith("tensorizer-"):
                extra = dict(tensorizer_extra)
                if label == "tensorizer-file":
                    extra["tensorizer_uri"] = str(storage / "vllm" / "model.tensors")
                command += ["--load", "tensorizer", "--extra-config", json.dumps(extra)]
            else:
                fmt = label.split("-")[1]
                command += ["--load", "tensor-registry"]
                command += ["--extra-config", json.dumps(plugin_extra[fmt])]
                if label.endswith("-mp"):
                    # A fresh engine-core process (spawn, not fork: nothing inherited from
                    # the child's own plugin run) must register the loader by itself.
                    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
                    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
            if args.standin:
                fmt = label.split("-")[1]
                spec = work / f"spec-{label}.json"
                out = work / f"out-{label}.pt"
                spec.write_text(
                    json.dumps(
                        {
                            "model_dir": str(src),
                            "load_format": "tensor-registry",
                            "extra": plugin_extra[fmt],
                            "out": str(out),
                            "device": "cpu",
                            "dtype": args.dtype,
                        }
                    )
                )
                command += ["--standin-spec", str(spec)]
            row = run_child(label, command, env, args.timeout, work / "logs")
            if label.endswith("-cache"):
                row["prefetch"] = prefetched
            if args.standin and row["rc"] == 0:
                saved = torch.load(work / f"out-{label}.pt", map_location="cpu", weights_only=True)
                state = saved["state"]
                row["bit_exact"] = set(state) == set(expected) and all(
                    same_bytes(state[k], v) for k, v in expected.items()
                )
                row["in_place"] = saved["in_place"]
            report["runs"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "tokens"}), flush=True)
            save()

    rows = {r["run"]: r for r in report["runs"]}
    reference = rows.get("safetensors", {}).get("tokens")
    problems = ["vllm artifact: " + report["vllm_artifact_error"]] if vllm_files is None else []
    for row in report["runs"]:
        if row["rc"] != 0:
            problems.append(f"{row['run']}: exit {row['rc']}")
        if row["run"].startswith("plugin-"):
            # (vLLM's tensorizer runs log their extra config, the signed URL with it.)
            if row["signature_in_log"]:
                problems.append(f"{row['run']}: a URL signature in the log")
            # In the -mp run the load happens in vLLM's engine-core process: its success (the
            # loader is found there) is the check; its summary line shows when that process
            # imported this file (spawn) and got the log handler.
            mp = row["run"].endswith("-mp")
            if row["rc"] == 0 and "plugin" not in row and not mp:
                problems.append(f"{row['run']}: no plugin summary line")
            source = (row.get("plugin") or {}).get("source")
            wanted = "file" if row["run"].endswith("-cache") else "url"
            if row["rc"] == 0 and source != wanted and not (mp and source is None):
                problems.append(f"{row['run']}: read from {source}")
        if args.standin:
            if row["rc"] == 0 and not (row.get("bit_exact") and row.get("in_place")):
                problems.append(f"{row['run']}: parameters differ from the source")
            if row["rc"] == 0 and row.get("load_weights_s") is None:
                problems.append(f"{row['run']}: load_weights not timed")
        elif row["run"] != "safetensors":
            row["tokens_match"] = reference is not None and row.get("tokens") == reference
            if not row["tokens_match"]:
                problems.append(f"{row['run']}: tokens differ from safetensors")
    problems += [f"{label}: skipped (budget)" for label in report.get("skipped", [])]
    report["problems"] = problems
    report["ok"] = not problems and bool(report["runs"])
    report["bench_s"] = round(time.perf_counter() - started, 1)
    # Per run: the loader's load_weights, vLLM's own figures, the plugin's source and GB/s.
    columns = ("run", "load_weights_s", "model_loading_s", "vllm_loading_weights_s")
    columns += ("tensorizer_deserialized_s", "tokens_match")
    report["table"] = [
        {k: row.get(k) for k in columns}
        | {k: (row.get("plugin") or {}).get(k) for k in ("source", "gbps")}
        for row in report["runs"]
    ]
    save()
    print(json.dumps({"ok": report["ok"], "problems": problems, "table": report["table"]}))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
