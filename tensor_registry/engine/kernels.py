"""CUDA C kernels built at run time: NVRTC for the device, launched on torch's streams through
the driver API; the host C compiler for CPU tensors (the same source, its thread bodies in a
loop: how CI, which has no GPU, runs the engine's device code).

Why not Triton: its JIT cost every fresh process 0.67-0.96 s before the first launch with its disk
cache warm and 4.4-6 s cold (bench/RESULTS.md), longer than a whole 10 GB
verified load, so the engine hashed on host threads at half the speed. A cubin that NVRTC
built once is cached on disk (``TENSOR_REGISTRY_KERNEL_CACHE``, else ``kernels/`` under the
node's cache root, ``TENSOR_REGISTRY_CACHE_DIR``: ``cache_dir``) and loads in milliseconds;
building it takes NVRTC well under a second.

A kernel here takes its arguments as declared in :meth:`Module.launch`'s ``types`` and, last, the
``unsigned long long`` count of threads; the device build guards ``t < n`` itself, the host
build loops ``t`` over ``[0, n)``.

Every call into the CUDA libraries goes through ctypes, which releases the GIL.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from tensor_registry.node_dirs import default_cache_dir

_lock = threading.Lock()
_modules: dict[tuple[str, str], Module] = {}
_driver: Any = None
_nvrtc: Any = None

BLOCK = 128  # threads per block of a device launch


def cuda_library(names: list[str]) -> ctypes.CDLL | None:
    """The first of ``names`` that loads (``libcudart.so.13``, …), then the same stems among the
    libraries torch's wheels ship (site-packages/nvidia/*/lib, torch/lib); None if none does."""
    import torch

    root = os.path.dirname(os.path.dirname(torch.__file__))
    candidates = list(names)
    for name in names:
        stem = name.split(".so")[0]
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", f"{stem}.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "torch", "lib", f"{stem}*.so*")))
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cache_dir() -> Path:
    """``TENSOR_REGISTRY_KERNEL_CACHE``, else ``kernels/`` under the node's cache root
    (tensor_registry/node_dirs.py): a node that keeps its weights across restarts keeps its
    built kernels with them, and a fresh process loads them instead of building (0.7-1.6 s
    on a fresh machine against 0.04-0.09 s loaded: bench/results/engine.md)."""
    explicit = os.environ.get("TENSOR_REGISTRY_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    return default_cache_dir() / "kernels"


def _private(path: Path) -> None:
    """Refuse a cache entry or folder another user could have written: what is loaded from it
    runs as this process (a cubin on the GPU, a host build in it)."""
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise CudaError(f"kernel cache {path} is writable by another user; not loading from it")


def _cached(key: str, suffix: str, build: Any) -> Path:
    """``cache_dir()/key+suffix``, built by ``build(path)`` into a temporary name and renamed,
    so concurrent processes never read a half-written file."""
    folder = cache_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(folder)
    path = folder / f"{key}{suffix}"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=suffix)
        os.close(fd)
        try:
            build(Path(tmp))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    _private(path)
    return path


class CudaError(RuntimeError):
    pass


def _check(lib: Any, status: int, what: str) -> None:
    if status != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(name))
        raise CudaError(f"{what}: {(name.value or b'').decode()} ({status})")


def _libcuda() -> Any:
    global _driver
    if _driver is None:
        lib = cuda_library(["libcuda.so.1", "libcuda.so"])
        if lib is None:
            raise CudaError("the CUDA driver library (libcuda) is not loadable")
        lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p, *[ctypes.c_uint] * 6, ctypes.c_uint, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        lib.cuModuleLoadData.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        _driver = lib
    return _driver


def _libnvrtc() -> Any:
    global _nvrtc
    if _nvrtc is None:
        names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"]
        lib = cuda_library(names)
        if lib is None:
            raise CudaError("NVRTC (libnvrtc) is not loadable")
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        _nvrtc = lib
    return _nvrtc


def nvrtc_compile(source: bytes, arch: str) -> bytes:
    """A cubin of ``source`` for ``arch`` ("sm_90"), or the PTX for the driver to finish when
    this NVRTC does not know the architecture (a GPU newer than the wheel)."""
    lib = _libnvrtc()

    def check(status: int, what: str, prog: Any = None) -> None:
        if status == 0:
            return
        log = b""
        if prog is not None:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value
        reason = lib.nvrtcGetErrorString(status).decode()
        raise CudaError(f"NVRTC {what}: {reason} {log.decode(errors='replace')[-2000:]}")

    for target, getter in ((arch, "CUBIN"), ("compute_" + arch.removeprefix("sm_"), "PTX")):
        prog = ctypes.c_void_p()
        status = lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernels.cu", 0, None, None)
        check(status, "create")
        try:
            opts = [f"--gpu-architecture={target}".encode()]
            array = (ctypes.c_char_p * len(opts))(*opts)
            status = lib.nvrtcCompileProgram(prog, len(opts), array)
            if status != 0 and getter == "CUBIN":
                continue  # architecture unknown to this NVRTC: try its PTX
            check(status, "compile", prog)
            size = ctypes.c_size_t()
            check(getattr(lib, f"nvrtcGet{getter}Size")(prog, ctypes.byref(size)), "size")
            out = ctypes.create_string_buffer(size.value)
            check(getattr(lib, f"nvrtcGet{getter}")(prog, out), "get")
            return out.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
    raise CudaError("NVRTC built nothing")  # pragma: no cover - the PTX pass raises first


class Module:
    """The kernels of one source file, built for one device: ``"cuda:N"`` or ``"cpu"``."""

    def __init__(self, source: Path, device: str) -> None:
        self.device = device
        text = source.read_bytes()
        if device == "cpu":
            key = hashlib.sha256(b"host\0" + text).hexdigest()[:32]

            def build(path: Path) -> None:
                subprocess.run(
                    ["cc", "-O3", "-shared", "-fPIC", "-x", "c", "-", "-o", str(path)],
                    input=text,
                    check=True,
                    capture_output=True,
                )

            self.host = ctypes.CDLL(str(_cached(key, ".so", build)))
            return
        import torch

        index = torch.device(device).index or 0  # module() names the device
        major, minor = torch.cuda.get_device_capability(index)
        arch = f"sm_{major}{minor}"
        nvrtc = _libnvrtc()
        version = (ctypes.c_int(), ctypes.c_int())
        nvrtc.nvrtcVersion(ctypes.byref(version[0]), ctypes.byref(version[1]))
        ident = f"{arch}\0{version[0].value}.{version[1].value}\0".encode() + text
        key = hashlib.sha256(ident).hexdigest()[:32]
        image = _cached(key, ".bin", lambda p: p.write_bytes(nvrtc_compile(text, arch)))
        lib = _libcuda()
        _check(lib, lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), dev), "context")
        self._threads = threading.local()
        self._current()
        self.module = ctypes.c_void_p()
        data = image.read_bytes()
        _check(lib, lib.cuModuleLoadData(ctypes.byref(self.module), data), "cuModuleLoadData")
        self.functions: dict[str, ctypes.c_void_p] = {}

    def _current(self) -> None:
        """Make the device's primary context (torch's) current on the calling thread, asking
        the driver once per thread (a load's readers launch per block, and every driver call
        through ctypes hands the GIL over twice)."""
        if getattr(self._threads, "current", None) is self.context:
            return
        lib = _libcuda()
        now = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(now))
        if now.value != self.context.value:
            _check(lib, lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self._threads.current = self.context

    def _function(self, name: str) -> ctypes.c_void_p:
        fn = self.functions.get(name)
        if fn is None:
            fn = ctypes.c_void_p()
            lib = _libcuda()
            _check(lib, lib.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()), name)
            self.functions[name] = fn
        return fn

    def launch(self, name: str, n: int, types: str, *args: Any, stream: int | None = None) -> None:
        """Run kernel ``name`` over ``n`` threads. ``types`` spells the arguments: ``p`` a
        tensor (its data pointer) or an address, ``u`` an unsigned int, ``q`` an unsigned long
        long. On the device the launch goes on ``stream`` (a handle; None: torch's current
        stream) and returns at once; on the host it runs before returning."""
        if n <= 0:
            return
        kinds: dict[str, Any] = {
            "p": lambda a: ctypes.c_void_p(a if isinstance(a, int) else a.data_ptr()),
            "u": ctypes.c_uint32,
            "q": ctypes.c_uint64,
        }
        values: list[Any] = [kinds[kind](arg) for kind, arg in zip(types, args, strict=True)]
        values.append(ctypes.c_uint64(n))
        if self.device == "cpu":
            getattr(self.host, name)(*values)
            return
        import torch

        if stream is None:
            stream = torch.cuda.current_stream(torch.device(self.device)).cuda_stream
        self._current()
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        lib = _libcuda()
        grid = -(-n // BLOCK)
        status = lib.cuLaunchKernel(
            self._function(name), grid, 1, 1, BLOCK, 1, 1, 0, ctypes.c_void_p(stream), params, None
        )
        _check(lib, status, f"launch {name}")


def module(source: Path, device: Any) -> Module:
    """The built kernels of ``source`` for ``device`` (built once per process)."""
    name = str(device)
    if name.startswith("cpu"):
        name = "cpu"
    elif name.startswith("cuda"):
        import torch

        index = torch.device(name).index
        name = f"cuda:{torch.cuda.current_device() if index is None else index}"
    key = (str(source), name)
    with _lock:
        found = _modules.get(key)
        if found is None:
            found = _modules[key] = Module(source, name)
    return found
