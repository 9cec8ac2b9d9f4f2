"""vLLM for the device machine: a trimmed vLLM wheel and the wheels it imports, in carry folders.

    python bench/vllm/vllm_wheels.py --dest /work/main --with /work/main/.whl   # .whlv1-3 there
    python bench/vllm/vllm_wheels.py --scan-only --with /work/main/.whl         # the scan only

The device machine (x86-64, Python 3.12, torch 2.11.0+cu130, transformers 5.17; its package
list: /work/.library/device/KINDS.md, last paragraph) has no vLLM and reaches no registry, and
a call carries at most 64 MiB. vLLM 0.24.0 pins torch==2.11.0, the image's, and its kernels
link the image's CUDA 13; its wheel is 279 MB. This writes:

1. the vLLM wheel without what a bf16 Llama on an H200 (FlashAttention 3) never loads
   (:data:`LEFT_OUT`: FA2, the MoE kernels, the Rust frontend, the Blackwell kernels),
   repacked with its large members LZMA-compressed (preset 9: the FA3 kernels' 38 MB deflated
   are 8 MB so) and RECORD rewritten to list exactly what is inside; every kept file is the
   wheel's byte for byte. pip reads LZMA members (zipfile does). 279 -> 107 MB;
2. the wheels vLLM imports that the image lacks (:data:`DEPS`) and their requirements, each at
   the newest version uploaded before :data:`CUTOFF` (what vLLM 0.24.0's users got), vLLM's
   own pins kept; never torch, triton, nvidia-* or anything the image holds
   (:data:`IMAGE_DISTS`). xgrammar is trimmed as vLLM is (its static library);
3. the vLLM wheel split into parts (``cat`` joins them, as for ``split -b``) across the folders
   ``.whlv1`` ``.whlv2`` ``.whlv3`` under --dest, each within :data:`FOLDER_LIMITS`; the last
   holds the dependency wheels and SHA256SUMS (the joined wheel's digest).

Then the import scan (:func:`scan`; packing stops when it fails): every module that the
engine, the worker, the model loaders, the Llama model and FlashAttention import at module
level (vLLM's own source, parsed from the wheel; also a ``LazyLoader`` touched at import, as
backend_xgrammar.py's dataclass annotations do) must find its imports in the standard
library, the image (:data:`IMAGE_IMPORTS`) or the carried wheels, and no extension left out may
be imported outside a ``try``. What is reached only under an ``if``, a ``try`` or in a
function is listed for review.

On the device: join the parts, then ``pip install --no-index --no-deps --target DIR`` every
wheel (bench/vllm/vllm_plugin_real.py's docstring has the three calls).
"""

from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import csv
import hashlib
import io
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from collections import defaultdict, deque
from collections.abc import Iterator
from pathlib import Path

VLLM = "vllm==0.24.0"
CUTOFF = "2026-07-01T00:00:00Z"
MIB = 1 << 20
PART_BYTES = 55 * MIB
LZMA_FROM = 1 * MIB  # members at least this big are LZMA-compressed
# The lead's call 3 also carries .whl (28 MB: tensorizer and friends) and the 2.4 MB tree.
FOLDER_LIMITS = {".whlv1": 58_000_000, ".whlv2": 58_000_000, ".whlv3": 30_000_000}

# Members left out of carried wheels (by wheel), and why an H200 running a bf16 Llama does not
# load them.
LEFT_OUT = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2: Hopper runs FA3 "
    "(fa_utils.get_flash_attn_version); the import is in a try",
    "vllm/_moe_C_stable_libtorch.abi3.so": "MoE kernels (39 MB even as LZMA): a dense Llama "
    "calls none; CudaPlatform.import_kernels imports it in a try and logs a warning",
    "vllm/vllm-rs": "the optional Rust frontend binary (VLLM_RUST_FRONTEND_PATH)",
    "vllm/third_party/fmha_sm100/": "Blackwell (sm100) attention kernels",
    "vllm/third_party/deep_gemm/_C.cpython-310-": "DeepGEMM for other Pythons",
    "vllm/third_party/deep_gemm/_C.cpython-311-": "DeepGEMM for other Pythons",
    "vllm/third_party/deep_gemm/_C.cpython-313-": "DeepGEMM for other Pythons",
    "vllm/third_party/deep_gemm/_C.cpython-314-": "DeepGEMM for other Pythons",
    # xgrammar 0.2.3 (31 MB deflated of its 45): a static library for C++ users; Python loads
    # libxgrammar_bindings.so (xgrammar/load_binding.py).
    "xgrammar/lib/libxgrammar.a": "xgrammar's static library (C++ linking only)",
}
TRIMMED = ("vllm", "xgrammar")  # the wheels LEFT_OUT applies to (repacked, RECORD rewritten)

# What vLLM 0.24.0 requires and the image lacks, that an offline LLM(...) imports at module level
# (first group: the scan fails without them) or may import lazily on the way (second group);
# their own requirements are added by resolve(). Versions: vLLM's pins, else the newest before
# CUTOFF; openai below 3 (openai 3 moved to httpx2; vLLM 0.24 was released against 2.x).
DEPS = [
    "cachetools",
    "cbor2",
    "fastapi>=0.133.0,<0.137.0",
    "starlette>=1.0.1",
    "msgspec",
    "openai>=2.0.0,<3",
    "openai-harmony>=0.0.3",
    "partial-json-parser",
    "pybase64",
    "pydantic>=2.12.0",
    "pyzmq>=25.0.0",
    # -- lazily imported on some paths (engine-core process title, compilation, structured
    # outputs, quantization configs, logging); small, so carried
    "setproctitle",
    "depyf==0.20.0",
    "diskcache==5.6.3",
    "llguidance>=1.7.0,<1.8.0",
    "outlines_core==0.2.14",
    "lm-format-enforcer==0.11.3",
    "lark==1.2.2",
    "jsonschema>=4.23.0",
    "python-json-logger",
    "ijson",
    "prometheus-fastapi-instrumentator>=8.0.0",
    "compressed-tensors==0.17.0",
    "watchfiles",
    # vllm/v1/structured_output/backend_xgrammar.py touches its LazyLoader("xgrammar") in a
    # dataclass annotation at import, on the way to vllm.v1.engine.core: needed at start.
    # vLLM pins apache-tvm-ffi==0.1.9; xgrammar 0.2.6 and later need >=0.1.10, so 0.2.3 (the
    # newest before CUTOFF) with its static library left out.
    "apache-tvm-ffi==0.1.9",
    "xgrammar>=0.2.1,<1.0.0",
]
# Newest regardless of CUTOFF: backwards compatible, so never older than the image's copy
# (pydantic needs typing-extensions>=4.14.1; the image's version is not on record).
LATEST = ["typing-extensions"]
# Not carried although vLLM lists them: its pins that would replace the image's stack (torch,
# torchaudio, torchvision, numba), GPU libraries an H200 + bf16 Llama does not call (flashinfer:
# hence VLLM_USE_FLASHINFER_SAMPLER=0; tilelang, quack-kernels, nvidia-cutlass-dsl (FA4),
# tokenspeed-mla, humming-kernels, nvidia-cudnn-frontend), the API server's and tools' extras
# (anthropic, mcp, model-hosting-container-standards, mistral_common, opentelemetry-*). The
# lead's .whl brings blake3, tensorizer, fastsafetensors, runai-model-streamer, boto3.
NOT_CARRIED = {"torch", "triton", "torchaudio", "torchvision", "numba"}

# Import names of the image's packages (KINDS.md's list, read 2026-11-17), for the scan.
_IMAGE_IMPORTS = """
    absl accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated_doc anyio attr attrs
    botorch build certifi charset_normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda cupy cupyx cupy_backends cycler Cython cython pyximport diffrax e3nn einops
    equinox etils execnet filelock flatbuffers flax fontTools formulaic frozenlist fsspec
    gpytorch grpc h11 h5py hf_xet httpcore httpx huggingface_hub humanize hypothesis idna
    imageio iniconfig interface_meta jax jax_plugins jaxlib jaxtyping jinja2 joblib kiwisolver
    lazy_loader lightning lightning_utilities linear_operator lineax llvmlite lxml markdown
    markdown_it markupsafe matplotlib mpl_toolkits mdurl mesonbuild mpi4py mpmath msgpack
    multidict multipledispatch mypy_extensions nanobind narwhals networkx ninja numba numpy
    numpyro nvidia pynvml onnx onnx_ir onnxruntime onnxscript cv2 optax opt_einsum
    opt_einsum_fx optimistix orbax packaging pandas pathspec patsy peft PIL pip pluggy
    portalocker prometheus_client propcache google psutil pyarrow pybind11 cpuinfo pygments
    pyparsing pyproject_hooks pyre_extensions pytest _pytest xdist pytest_benchmark pytest_cov
    pytest_mock pytest_timeout dateutil pytorch_lightning yaml regex requests rich sacrebleu
    safetensors scikit_build_core skimage sklearn scipy seaborn sentencepiece
    sentence_transformers setuptools pkg_resources _distutils_hack shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard_data_server tensorstore
    threadpoolctl tifffile tiktoken tiktoken_ext timm tokenizers toolz tlz torch functorch
    torchgen torchaudio torchdiffeq torch_geometric torchmetrics torchvision tqdm transformers
    treescope triton typer typing_extensions typing_inspect urllib3 uvloop wadler_lindig
    werkzeug wheel wrapt xarray xxhash yarl zipp"""
IMAGE_IMPORTS = set(_IMAGE_IMPORTS.split())
# The image's distributions (the same list): never carried.
_IMAGE_DISTS = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
    prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
    statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
    torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
    typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""
IMAGE_DISTS = set(_IMAGE_DISTS.split())

# Where LLM(...) goes on one GPU: the scan's roots ("pkg.*": every module under pkg).
ROOTS = [
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.model_loader.*",
    "vllm.model_executor.models.llama",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.sample.sampler",
    "vllm.platforms.cuda",
    "vllm.plugins",
    "vllm.distributed",
]

PLATFORMS = [
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
    "manylinux_2_5_x86_64", "manylinux1_x86_64", "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
]  # fmt: skip


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-", 1)[0])


def pip_download(spec: str, dest: Path, *, cutoff: str | None) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    first = subprocess.run(
        [*cmd, *(["--uploaded-prior-to", cutoff] if cutoff else []), spec],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if first.returncode and cutoff:  # an exact pin uploaded a little after the cutoff
        print(f"  {spec}: none before {cutoff}, taking the newest", flush=True)
        subprocess.run([*cmd, spec], check=True)
    elif first.returncode:
        raise SystemExit(f"pip download {spec} failed")


def metadata(path: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    fields: dict[str, list[str]] = defaultdict(list)
    for line in text.split("\n\n", 1)[0].splitlines():
        if ":" in line and not line.startswith(" "):
            key, value = line.split(":", 1)
            fields[key].append(value.strip())
    return fields


def resolve(dest: Path) -> list[Path]:
    """DEPS and LATEST and their requirements, minus the image's packages: one wheel each."""
    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "extra": "",
           "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux",
           "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython"}  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    queue = [(spec, CUTOFF) for spec in DEPS] + [(spec, None) for spec in LATEST]
    done: dict[str, Path] = {}
    while queue:
        spec, cutoff = queue.pop(0)
        req = Requirement(spec)
        name = canonical(req.name)
        if name in done or name in NOT_CARRIED or name.startswith("nvidia-"):
            continue
        if name in IMAGE_DISTS and spec not in LATEST:
            continue
        found = [p for p in dest.glob("*.whl") if wheel_name(p) == name]
        if not found:
            pip_download(f"{req.name}{req.specifier}", dest, cutoff=cutoff)
            found = [p for p in dest.glob("*.whl") if wheel_name(p) == name]
        if len(found) != 1:
            raise SystemExit(f"{name}: {len(found)} wheels in {dest}")
        done[name] = found[0]
        for text in metadata(found[0]).get("Requires-Dist", []):
            sub = Requirement(text)
            if sub.marker is None or sub.marker.evaluate(env):
                queue.append((f"{sub.name}{sub.specifier}", CUTOFF))
    check_versions(list(done.values()))
    return sorted(done.values())


def check_versions(wheels: list[Path]) -> None:
    """Every carried wheel's requirement on another carried wheel holds (pip's --no-deps
    install checks nothing)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    versions: dict[str, str] = {}
    bad = []
    for w in wheels:
        name, version = canonical(metadata(w)["Name"][0]), metadata(w)["Version"][0]
        if name in versions:  # pip's install stops on two versions of one package
            bad.append(f"{name}: {versions[name]} and {version}")
        versions[name] = version
    for w in wheels:
        for text in metadata(w).get("Requires-Dist", []):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = versions.get(canonical(req.name))
            if have and not req.specifier.contains(Version(have), prereleases=True):
                bad.append(f"{w.name}: {text} (carried {have})")
    if bad:
        raise SystemExit("conflicting versions:\n  " + "\n  ".join(bad))


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


class _Lzma9(zipfile.LZMACompressor):  # type: ignore[name-defined,misc]
    """zipfile's LZMA member writer at preset 9 (zipfile's own uses the default, 6): the
    dictionary then spans the kernels' repeats. The reader takes the properties from the
    member, so any unzip that reads LZMA reads these."""

    def _init(self) -> bytes:
        import struct

        props = lzma._encode_filter_properties({"id": lzma.FILTER_LZMA1, "preset": 9})  # type: ignore[attr-defined]
        self._comp = lzma.LZMACompressor(
            lzma.FORMAT_RAW,
            filters=[lzma._decode_filter_properties(lzma.FILTER_LZMA1, props)],  # type: ignore[attr-defined]
        )
        return struct.pack("<BBH", 9, 4, len(props)) + props


@contextlib.contextmanager
def _lzma_preset_9() -> Iterator[None]:
    original = zipfile._get_compressor  # type: ignore[attr-defined]

    def get(compress_type: int, compresslevel: int | None = None):  # type: ignore[no-untyped-def]
        if compress_type == zipfile.ZIP_LZMA:
            return _Lzma9()
        return original(compress_type, compresslevel)

    zipfile._get_compressor = get  # type: ignore[attr-defined]
    try:
        yield
    finally:
        zipfile._get_compressor = original  # type: ignore[attr-defined]


def left_out(name: str) -> str | None:
    for prefix, why in LEFT_OUT.items():
        if name.startswith(prefix):
            return why
    return None


def trim(source: Path, dest: Path) -> Path:
    """``source`` without LEFT_OUT, LZMA members, RECORD listing exactly what is inside."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / source.name
    partial = target.with_suffix(".partial")
    dropped = []
    with zipfile.ZipFile(source) as zin, _lzma_preset_9():
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        kept = []
        for info in zin.infolist():
            (dropped if left_out(info.filename) else kept).append(info)
        rows = []
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in kept:
                if info.filename == record_name:
                    continue
                data = zin.read(info)
                out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out.external_attr = info.external_attr
                # LZMA for the kernels; its encoder costs ~0.7 GB and a moment to set up, so
                # the thousands of small sources stay deflated.
                big = len(data) >= LZMA_FROM
                out.compress_type = zipfile.ZIP_LZMA if big else zipfile.ZIP_DEFLATED
                zout.writestr(out, data, compresslevel=None if big else 9)
                if not info.is_dir():
                    rows.append([info.filename, _record_hash(data), str(len(data))])
            rows.append([record_name, "", ""])
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="\n").writerows(rows)
            zout.writestr(record_name, buffer.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    partial.replace(target)
    for prefix, why in LEFT_OUT.items():
        gone = [i for i in dropped if i.filename.startswith(prefix)]
        if gone:
            size = sum(i.file_size for i in gone)
            print(f"  left out {prefix} ({len(gone)} files, {size / 1e6:.1f} MB): {why}")
    return target


def pack(vllm_wheel: Path, deps: list[Path], base: Path) -> dict[str, int]:
    """Parts of ``vllm_wheel`` into the folders in order, the deps and SHA256SUMS into the
    last; returns each folder's bytes."""
    folders = list(FOLDER_LIMITS)
    for name in folders:
        shutil.rmtree(base / name, ignore_errors=True)
        (base / name).mkdir(parents=True)
    data_size = vllm_wheel.stat().st_size
    parts = []
    with vllm_wheel.open("rb") as fh:
        index = 0
        while chunk := fh.read(PART_BYTES):
            suffix = chr(ord("a") + index // 26) + chr(ord("a") + index % 26)
            parts.append((f"{vllm_wheel.name}.part{suffix}", chunk))
            index += 1
    sizes = dict.fromkeys(folders, 0)
    slot = 0
    for name, chunk in parts:
        while sizes[folders[slot]] + len(chunk) > FOLDER_LIMITS[folders[slot]]:
            slot += 1
            if slot == len(folders):
                raise SystemExit(f"{data_size} bytes of vLLM do not fit {FOLDER_LIMITS}")
        (base / folders[slot] / name).write_bytes(chunk)
        sizes[folders[slot]] += len(chunk)
    last = base / folders[-1]
    for dep in deps:
        shutil.copy2(dep, last / dep.name)
        sizes[folders[-1]] += dep.stat().st_size
    digest = hashlib.sha256(vllm_wheel.read_bytes()).hexdigest()
    (last / "SHA256SUMS").write_text(f"{digest}  {vllm_wheel.name}\n")
    for name in folders:
        if sizes[name] > FOLDER_LIMITS[name]:
            raise SystemExit(f"{name}: {sizes[name]} bytes, over {FOLDER_LIMITS[name]}")
    return sizes


# ---------------------------------------------------------------------------------------------
# The import scan


def _catches_import_errors(handlers: list[ast.ExceptHandler]) -> bool:
    caught = ("ImportError", "ModuleNotFoundError", "Exception", "OSError", "AttributeError")
    return any(h.type is None or any(c in ast.unparse(h.type) for c in caught) for h in handlers)


def _imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, str, int]]:
    """(imported module, kind, line): kind "top" (runs on import), "cond" (under a
    module-level if), "guarded" (in a try that catches ImportError), "func" (in a function);
    TYPE_CHECKING blocks are skipped."""
    found: list[tuple[str, str, int]] = []

    def absolute(level: int, name: str | None) -> str:
        if level == 0:
            return name or ""
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kind = "func"
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, kind)
            return
        elif isinstance(node, ast.If) and kind == "top":
            for child in node.body + node.orelse:
                visit(child, "cond")
            visit(node.test, kind)
            return
        elif isinstance(node, ast.Try) and kind != "func":
            inner = "guarded" if _catches_import_errors(node.handlers) else kind
            for child in node.body:
                visit(child, inner)
            for handler in node.handlers:
                for child in handler.body:
                    visit(child, "guarded")
            for child in node.orelse + node.finalbody:
                visit(child, kind)
            return
        elif isinstance(node, ast.With) and kind != "func" and "suppress" in ast.unparse(node):
            kind = "guarded"
        if isinstance(node, ast.Import):
            found.extend((alias.name, kind, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = absolute(node.level, node.module)
            found.append((target, kind, node.lineno))
            found.extend((f"{target}.{a.name}", kind, node.lineno) for a in node.names)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module"):
            first = node.args[0] if node.args else None
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if literal and not first.value.startswith("."):  # type: ignore[union-attr]
                found.append((first.value, kind, node.lineno))  # type: ignore[union-attr]
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    for statement in tree.body:
        visit(statement, "top")
    found.extend((module_name, "top", line) for module_name, line in _lazy_touches(tree))
    return found


def _lazy_touches(tree: ast.Module) -> list[tuple[str, int]]:
    """Modules behind vLLM's ``X = LazyLoader("X", globals(), "module")`` that the module's own
    import already loads: ``X`` used outside function bodies (a class body, a dataclass
    field's annotation, a default argument; annotations count unless the file has ``from
    __future__ import annotations``). backend_xgrammar.py does that with xgrammar."""
    future = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )  # fmt: skip
    lazy: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            if ast.unparse(call.func).endswith("LazyLoader") and len(call.args) >= 3:
                target = call.args[2]
                if isinstance(target, ast.Constant) and isinstance(target.value, str):
                    for name in node.targets:
                        if isinstance(name, ast.Name):
                            lazy[name.id] = target.value
    touches: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            evaluated: list[ast.AST] = [*node.decorator_list, *node.args.defaults]
            evaluated += [d for d in node.args.kw_defaults if d is not None]
            if not future:
                every = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                every += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
                evaluated += [a.annotation for a in every if a.annotation is not None]
                evaluated += [node.returns] if node.returns is not None else []
            for child in evaluated:
                visit(child)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.AnnAssign) and future:
            if node.value is not None:
                visit(node.value)
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in lazy:
            touches.append((lazy[node.id], node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    if lazy:
        for statement in tree.body:
            visit(statement)
    return touches


def top_level_names(wheel: Path) -> set[str]:
    names = set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            first = name.split("/", 1)[0]
            if first.endswith((".dist-info", ".data")):
                continue
            names.add(first.split(".", 1)[0])
    return names


def scan(vllm_wheel: Path, carried: list[Path], *, verbose: bool = False) -> bool:
    """The import scan (module docstring); True when nothing that surely runs is missing."""
    modules: dict[str, list[tuple[str, str, int]]] = {}
    extensions = set()
    with zipfile.ZipFile(vllm_wheel) as zf:
        for name in zf.namelist():
            if not name.startswith("vllm/"):
                continue
            if name.endswith(".so"):
                extensions.add(name[:-3].split(".abi3")[0].split(".cpython")[0].replace("/", "."))
            if not name.endswith(".py"):
                continue
            parts = name[:-3].split("/")
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            tree = ast.parse(zf.read(name), name)
            modules[module] = _imports(tree, module, is_package)
    available = set(sys.stdlib_module_names) | IMAGE_IMPORTS
    for wheel in carried:
        available |= top_level_names(wheel)

    def closure(kinds: tuple[str, ...]) -> dict[str, str]:
        via: dict[str, str] = {}
        queue: deque[str] = deque()

        def add(name: str, parent: str) -> None:
            pieces = name.split(".")
            for i in range(1, len(pieces) + 1):
                prefix = ".".join(pieces[:i])
                if prefix in via or (prefix not in modules and prefix not in extensions):
                    continue
                via[prefix] = parent
                if prefix in modules:
                    queue.append(prefix)

        for root in ROOTS:
            for module in modules:
                if module == root or (root.endswith(".*") and module.startswith(root[:-1])):
                    add(module, "(root)")
        while queue:
            module = queue.popleft()
            for target, kind, _ in modules[module]:
                if target.split(".")[0] == "vllm" and kind in kinds:
                    add(target, module)
        return via

    sure = closure(("top",))
    maybe = closure(("top", "cond", "guarded"))
    missing_sure: dict[str, list[str]] = defaultdict(list)
    review: dict[str, list[str]] = defaultdict(list)
    for module in maybe:
        for target, kind, line in modules.get(module, []):
            top = target.split(".")[0]
            if top == "vllm" or not top or top in available:
                continue
            where = f"{module}:{line}"
            if kind == "top" and module in sure:
                missing_sure[top].append(where)
            else:
                review[top].append(f"{where} ({kind}{'' if module in sure else ', maybe reached'})")
    # An extension left out of the wheel, imported where nothing catches the ImportError.
    dropped = {p[:-3].split(".abi3")[0].replace("/", ".") for p in LEFT_OUT if p.endswith(".so")}
    for module in (m for m in sure if m in modules):
        for target, kind, line in modules[module]:
            if kind == "top" and target in dropped:
                missing_sure[target].append(f"{module}:{line}")
    print(f"scan: {len(sure)} modules surely imported, {len(maybe)} reachable; "
          f"extensions reached: {sorted(m for m in maybe if m in extensions)}")  # fmt: skip
    print(f"  extensions left out: {sorted(dropped)}")
    for top in sorted(review):
        sample = review[top][:2] if not verbose else review[top]
        print(f"  review (not carried, not surely imported): {top}: {sample}")
    for top in sorted(missing_sure):
        print(f"  MISSING (imported at module level on the way): {top}: {missing_sure[top][:3]}")
    return not missing_sure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm-wheels"))
    parser.add_argument("--dest", type=Path, default=None, help="write .whlv1-3 here")
    parser.add_argument(
        "--with",
        dest="also",
        type=Path,
        action="append",
        default=[],
        help="another folder of carried wheels (the lead's .whl), for the scan",
    )
    parser.add_argument("--scan-only", action="store_true", help="scan what --work holds")
    parser.add_argument("--retrim", action="store_true", help="trim again (else reuse)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    work = args.work
    trimmed = work / "trimmed"
    if not args.scan_only:
        (work / "download").mkdir(parents=True, exist_ok=True)
        if not list((work / "download").glob("vllm-*.whl")):
            pip_download(VLLM, work / "download", cutoff=None)
        resolve(work / "deps")
        sources = list((work / "download").glob("vllm-*.whl"))
        sources += [p for p in (work / "deps").glob("*.whl") if wheel_name(p) in TRIMMED]
        for source in sources:
            done = trimmed / source.name
            if done.exists() and not args.retrim:
                continue
            print(f"trimming {source.name} ({source.stat().st_size / 1e6:.1f} MB)", flush=True)
            trim(source, trimmed)
            print(f"  -> {done.stat().st_size / 1e6:.1f} MB", flush=True)
    wheel = next(trimmed.glob("vllm-*.whl"))
    deps = [p for p in sorted((work / "deps").glob("*.whl")) if wheel_name(p) not in TRIMMED]
    deps += [p for p in sorted(trimmed.glob("*.whl")) if wheel_name(p) != "vllm"]
    extra = [p for folder in args.also for p in sorted(folder.glob("*.whl"))]
    check_versions(deps + extra)
    ok = scan(wheel, deps + extra, verbose=args.verbose)
    print(f"vLLM wheel {wheel.stat().st_size / 1e6:.1f} MB; dependency wheels: {len(deps)}, "
          f"{sum(d.stat().st_size for d in deps) / 1e6:.1f} MB")  # fmt: skip
    if args.dest and not args.scan_only and ok:
        sizes = pack(wheel, deps, args.dest)
        for name, size in sizes.items():
            count = len(os.listdir(args.dest / name))
            print(f"  {args.dest / name}: {size / 1e6:.1f} MB ({count} files)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
