"""Serialize a loaded model with tensorizer into any seekable binary sink.

What tensorizer 2.x does with the object it is given to write to (`TensorSerializer(obj)`):
it probes `readable()`/`writable()` (must both be true), `seekable()` (must be true) and
`fileno()`; with a file descriptor it writes tensor data with `os.pwrite` from several threads,
otherwise it serialises all writes behind one lock as `tell()` → `seek(offset)` → `write(buf)`
(repeated while `write` returns a short count) → `seek(back)`. It also calls `flush()` and, in
`close()`, `close()`. It never reads. Writes are not append-only: each tensor's header is
written after its data (once the hashes are known, by another thread, so it can land tens of MB
behind the furthest write), and the 256 KiB metadata index and the file header at the start
are rewritten at the end. An object-store sink therefore has to spool (to a local temporary
file, then upload) rather than stream parts out in order. A buffer passed to `write` may be
changed right after the call (encryption works in place on the model's memory), so a sink
must consume or copy the bytes before `write` returns.

`serialize_hf` always hands tensorizer a small pure-Python proxy around the caller's sink: it
counts bytes for progress, accepts sinks whose `write` returns None, and keeps tensorizer from
closing the sink (the caller owns it: an S3 multipart writer must be completed or aborted by
whoever knows whether serialization succeeded).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

KEY_BYTES = 32
# tensorizer's chunked XSalsa20-Poly1305 (libsodium secretbox) over a raw 32-byte key.
ENCRYPTION_ALGORITHM = "tensorizer-xsalsa20-poly1305"

# tensorizer reserves a fixed 256 KiB metadata index at the start of every file
# (`TensorSerializer.__init__`: metadata_size = 256 * 1024) and fails with "Metadata overflow"
# only after writing, so the limit is checked here first. Per-tensor index entry, from
# `_TensorHeaderSerializer.metadata_entry_segment_template`: u16 name length, name, u8 tensor
# type, u8 dtype length, dtype, u8 rank, rank x u32 (u64 once any dimension is >= 2**32, which
# also prefixes every entry with a u32 version tag), then three u64 offsets.
METADATA_INDEX_BYTES = 256 * 1024
MAX_MODULES = 1 << 16  # module index is a u16 in each tensor header
MAX_NAME_BYTES = (1 << 16) - 1
MAX_RANK = 255

Progress = Callable[[int, int], None]


class Sink(Protocol):
    """A seekable binary destination: a real file, or e.g. an S3 writer that keeps what it is
    given and handles rewrites of earlier offsets. `write` may return None (= all written)."""

    def write(self, data: Any, /) -> int | None: ...

    def seek(self, offset: int, whence: int = ..., /) -> int | None: ...

    def tell(self) -> int: ...


class SerializeError(Exception):
    """The model cannot be written in the requested format."""

    code = "serialize_failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TooManyTensors(SerializeError):
    code = "too_many_tensors"


class FormatUnavailable(SerializeError):
    code = "format_unavailable"


@dataclass(frozen=True)
class SerializeStats:
    tensor_count: int
    parameter_count: int
    tensor_bytes: int
    file_bytes: int
    seconds: float
    tensorizer_version: str
    torch_version: str
    transformers_version: str | None
    encryption_algorithm: str | None
    # Memory-mapped weight pages handed back to the kernel once in the file (`_PageReleaser`).
    released_bytes: int = 0


@dataclass(frozen=True)
class _PlannedTensor:
    name: str
    module_index: int
    tensor: torch.Tensor


def new_encryption_key() -> bytes:
    """A fresh random key for one artifact (tensorizer's `EncryptionParams` takes it raw)."""
    return secrets.token_bytes(KEY_BYTES)


def _planned_tensors(model: torch.nn.Module) -> Iterator[_PlannedTensor]:
    """The entries `TensorSerializer.write_module(m, include_non_persistent_buffers=False)`
    writes, in its order: each distinct module once, its own parameters, then its persistent
    buffers, named `<module path>.<attribute>`."""
    for index, (module_name, module) in enumerate(model.named_modules()):
        non_persistent: set[str] = getattr(module, "_non_persistent_buffers_set", set())
        for attr, param in module.named_parameters(recurse=False):
            yield _PlannedTensor(f"{module_name}.{attr}", index, param)
        for attr, buffer in module.named_buffers(recurse=False):
            if attr not in non_persistent:
                yield _PlannedTensor(f"{module_name}.{attr}", index, buffer)


def _tensorizer_dtype_name(dtype: torch.dtype) -> str:
    """The dtype string tensorizer stores: numpy's `dtype.str`, or for types numpy lacks
    (bfloat16, float8) an opaque void type plus NUL plus the torch name."""
    import torch

    probe = torch.empty(0, dtype=dtype)
    try:
        return str(probe.numpy().dtype.str)
    except TypeError:
        width = probe.element_size()
        return f"{'|' if width == 1 else '<'}V{width}\0{dtype}"


def metadata_index_bytes(entries: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> int:
    """Bytes tensorizer's metadata index needs for (name, dtype, shape) entries."""
    long_dims = any(dim >= 1 << 32 for _, _, shape in entries for dim in shape)
    per_dim = 8 if long_dims else 4
    total = 0
    for name, dtype, shape in entries:
        total += 2 + len(name.encode()) + 1 + 1 + len(_tensorizer_dtype_name(dtype).encode())
        total += 1 + per_dim * len(shape) + 24 + (4 if long_dims else 0)
    return total


def check_tensorizer_limits(planned: list[_PlannedTensor]) -> None:
    if planned and planned[-1].module_index >= MAX_MODULES:
        raise TooManyTensors(
            f"model has more than {MAX_MODULES} modules; tensorizer stores the module index"
            " in 16 bits"
        )
    for entry in planned:
        if entry.name.startswith("."):
            raise SerializeError(
                f"tensor {entry.name[1:]!r} sits on the root module; tensorizer would name it"
                f" {entry.name!r}, which matches no state_dict key"
            )
        if len(entry.name.encode()) > MAX_NAME_BYTES or entry.tensor.dim() > MAX_RANK:
            raise SerializeError(f"tensor {entry.name[:80]!r} exceeds tensorizer's header limits")
    needed = metadata_index_bytes(
        [(e.name, e.tensor.dtype, tuple(e.tensor.shape)) for e in planned]
    )
    if needed > METADATA_INDEX_BYTES:
        raise TooManyTensors(
            f"{len(planned)} tensors need a {needed:,}-byte metadata index; tensorizer"
            f" reserves {METADATA_INDEX_BYTES:,} bytes (about"
            f" {len(planned) * METADATA_INDEX_BYTES // needed} tensors with these names)"
        )


_RELEASE_MIN_BYTES = 1 << 20


class _PageReleaser:
    """Gives back the memory of tensors that are completely in the file.

    On CPU, weights whose file dtype is the target dtype stay backed by the memory-mapped
    safetensors file (`load_model`), so each page enters the worker's RSS when tensorizer first
    reads it and, left alone, stays until the model is freed: peak RSS = imports + the whole
    model. Once a tensor's data has been handed to the sink *and* its header has been written
    (tensorizer writes a header only after both hashes over the data are computed), nothing
    reads that memory again except another tensor sharing it; so its pages are handed back
    with `madvise(MADV_PAGEOUT)`, which reclaims clean file pages (re-read from the file on a
    later touch, so a shared tensor still sees the same bytes) and never changes contents.
    Only ranges inside file-backed mappings are advised; anonymous memory (a cast model,
    GPU staging buffers) is left alone, and nothing is done with encryption, which rewrites
    tensor memory in place.

    Data and header are matched by file offset: tensorizer writes a tensor's header at
    [P, P + L) and its data at P + L, from different threads in either order.
    """

    def __init__(self) -> None:
        from tensor_registry_server.artifacts.making.page_out import Pager, file_backed_ranges

        self._pager = Pager(file_backed_ranges())
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[int, int]] = {}
        self._headers: set[int] = set()

    @property
    def released_bytes(self) -> int:
        return self._pager.released_bytes

    def wrote(self, position: int, data: Any, size: int) -> None:
        if not self._pager.active:
            return
        release = None
        with self._lock:
            if size >= _RELEASE_MIN_BYTES:
                import numpy as np

                address = int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
                if position in self._headers:
                    self._headers.discard(position)
                    release = (address, size)
                else:
                    self._pending[position] = (address, size)
            else:
                data_position = position + size
                release = self._pending.pop(data_position, None)
                if release is None:
                    self._headers.add(data_position)
        if release is not None:
            self._pager.pageout(*release)


class _SinkProxy(io.RawIOBase):
    """What tensorizer writes to: forwards write/seek/tell/flush to the caller's sink.

    No `fileno`, so tensorizer takes its locked seek+write path and every byte passes through
    `write`, where it is counted for progress. `close` flushes but leaves the sink open.
    """

    def __init__(
        self,
        sink: Sink,
        total: int,
        progress: Progress | None,
        releaser: _PageReleaser | None = None,
    ) -> None:
        super().__init__()
        self._sink = sink
        self._releaser = releaser
        self._total = total
        self._progress = progress
        self._lock = threading.Lock()
        self._position = sink.tell()
        if self._position != 0:
            raise ValueError("the sink must be positioned at offset 0")
        self.bytes_written = 0
        self.size = 0
        self.detached = False

    def readable(self) -> bool:
        # tensorizer insists on "wb+" streams; it never reads from a serializer's target.
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.detached:
            # A tensorizer thread still running after serialize_hf gave up must not touch
            # a sink the caller is already discarding.
            raise OSError("serialization was aborted")
        size = memoryview(data).nbytes
        position = self._position
        written = self._sink.write(data)
        if written is None:
            written = size
        if self._releaser is not None and written == size:
            self._releaser.wrote(position, data, size)
        with self._lock:
            self._position += written
            self.size = max(self.size, self._position)
            self.bytes_written += written
            done = min(self.bytes_written, self._total)
        if self._progress is not None:
            self._progress(done, self._total)
        return written

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._sink.seek(offset, whence)
        self._position = self._sink.tell() if position is None else position
        return self._position

    def tell(self) -> int:
        self._position = self._sink.tell()
        return self._position

    def flush(self) -> None:
        flush = getattr(self._sink, "flush", None)
        if callable(flush):
            flush()

    def close(self) -> None:
        if not self.closed:
            self.flush()
        super().close()


def serialize_hf(
    model: torch.nn.Module,
    sink: Sink,
    *,
    encryption_key: bytes | None,
    progress: Progress | None = None,
    release_written: bool = True,
) -> SerializeStats:
    """Write `model` in tensorizer's module format with Hugging Face names (state_dict keys).

    Non-persistent buffers (rotary `inv_freq`, causal masks) are left out, so the entries are
    exactly `model.state_dict()` (minus aliases of a module registered twice): loading with
    `load_state_dict(strict=True)` works, and the buffers are recomputed from config by the
    model constructor, as every loader (transformers, vLLM) already does.

    `sink` must be open at offset 0, seekable, and left open (the caller closes it).
    `progress(done, total)` counts bytes written against the model's tensor bytes; it is called
    from tensorizer's writer threads, must be cheap, and may raise to abort serialization.
    `release_written` (default on; no effect with encryption) hands the pages of memory-mapped
    weights back to the kernel once they are in the file (see `_PageReleaser`); the model's
    contents are unchanged, a later read just faults them in again from the source file.
    `model` must not be used concurrently: with encryption tensorizer encrypts each tensor in
    place and restores it after writing (after a failure some may stay encrypted: discard it).
    """
    import tensorizer
    import torch
    from tensorizer import EncryptionParams, TensorSerializer

    if encryption_key is not None and len(encryption_key) != KEY_BYTES:
        raise ValueError(f"encryption key must be {KEY_BYTES} bytes")
    planned = list(_planned_tensors(model))
    check_tensorizer_limits(planned)
    tensor_bytes = sum(
        0 if e.tensor.is_meta else e.tensor.numel() * e.tensor.element_size() for e in planned
    )
    unique_parameters = {id(p): p for p in model.parameters()}
    parameter_count = sum(p.numel() for p in unique_parameters.values())

    # Without encryption, memory-mapped weights already in the file go back to the kernel as
    # serialization proceeds (`_PageReleaser`): peak RSS stays near imports + what is in flight.
    releaser = _PageReleaser() if release_written and encryption_key is None else None
    proxy = _SinkProxy(sink, tensor_bytes, progress, releaser)
    encryption = EncryptionParams(key=encryption_key) if encryption_key is not None else None
    started = time.perf_counter()
    serializer = TensorSerializer(proxy, encryption=encryption)
    try:
        with torch.no_grad():
            serializer.write_module(model, include_non_persistent_buffers=False)
        serializer.close()
    except BaseException:
        # tensorizer cancels queued work but lets running threads finish; they must not write
        # on. With encryption a cancelled job can leave tensors encrypted in memory, so a
        # model whose serialization failed is to be discarded.
        proxy.detached = True
        del serializer
        raise
    seconds = time.perf_counter() - started
    if progress is not None:
        progress(tensor_bytes, tensor_bytes)
    return SerializeStats(
        tensor_count=len(planned),
        parameter_count=parameter_count,
        tensor_bytes=tensor_bytes,
        file_bytes=proxy.size,
        seconds=seconds,
        tensorizer_version=tensorizer.__version__,
        torch_version=torch.__version__,
        transformers_version=_transformers_version(),
        encryption_algorithm=ENCRYPTION_ALGORITHM if encryption is not None else None,
        released_bytes=releaser.released_bytes if releaser is not None else 0,
    )


def _transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return str(transformers.__version__)


def serialize_vllm(
    src_dir: Path,
    out_dir: Path,
    *,
    dtype: str,
    tensor_parallel_size: int = 1,
    encryption_key: bytes | None = None,
    progress: Progress | None = None,
    timeout: float | None = None,
) -> list[Path]:
    """Write vLLM-layout tensor files (`model.tensors`, or `model-rank-%03d.tensors` per rank)
    with vLLM's own serializer.

    Runs `python -m tensor_registry_server.artifacts.making.vllm_serialize` (see there) as a child
    process in
    a new process
    group: vLLM builds its engine, loads the weights into its own (fused, sharded) modules,
    registers the `vllm_tensorized_marker` parameter (stored as `.vllm_tensorized_marker`) and
    writes each rank with `TensorSerializer.write_module`. The files land in `out_dir` for the
    caller to upload. `progress(bytes_written, 0)` is called about twice a second while the
    child runs; whatever it raises (a cancelled job) kills the child's whole process group,
    vLLM's GPU memory with it, and propagates. A child that fails raises `SerializeError`
    with the end of its output.
    """
    if importlib.util.find_spec("vllm") is None:
        raise FormatUnavailable(
            "format 'vllm' needs vLLM on the worker (vllm is not importable);"
            " use format 'hf' or run a worker with vLLM installed"
        )
    out_dir = Path(out_dir)
    if "%" in str(out_dir):
        raise ValueError("out_dir must not contain '%' (vLLM formats the rank into the path)")
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "model-rank-%03d.tensors" if tensor_parallel_size > 1 else "model.tensors"
    expected = (
        [out_dir / (name % rank) for rank in range(tensor_parallel_size)]
        if tensor_parallel_size > 1
        else [out_dir / name]
    )
    with tempfile.TemporaryDirectory(prefix="vllm-serialize-") as key_dir:
        cmd = [
            sys.executable, "-m", "tensor_registry_server.artifacts.making.vllm_serialize",
            "--src", str(src_dir),
            "--out-uri", str(out_dir / name),
            "--dtype", dtype,
            "--tensor-parallel-size", str(tensor_parallel_size),
        ]  # fmt: skip
        if encryption_key is not None:
            cmd += ["--keyfile", str(_write_keyfile(Path(key_dir), encryption_key))]
        returncode, output = _run_child(
            cmd, Path(key_dir) / "output.log", out_dir, progress=progress, timeout=timeout
        )
    _check_report(returncode, output, expected)
    return expected


def _check_report(returncode: int, output: str, expected: list[Path]) -> None:
    """The child succeeded and its last line reports exactly the ``expected`` files, which
    exist: a failed child's error is the end of its output."""
    if returncode != 0:
        tail = output.strip().splitlines()[-20:]
        raise SerializeError("vLLM's serializer failed: " + " | ".join(tail)[-2000:])
    try:
        reported = json.loads(output.strip().splitlines()[-1])["files"]
    except (ValueError, KeyError, IndexError):
        raise SerializeError("vLLM's serializer exited without reporting its files") from None
    if sorted(Path(f) for f in reported) != sorted(expected) or not all(
        p.is_file() for p in expected
    ):
        raise SerializeError(f"vLLM's serializer wrote {reported}, expected {expected}")


def _write_keyfile(key_dir: Path, encryption_key: bytes) -> Path:
    """Only the child reads the key, from a 0600 file in a 0700 directory removed on exit:
    never on a command line, in the environment or in a log."""
    keyfile = key_dir / "key"
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(encryption_key)
    return keyfile


def _run_child(
    cmd: list[str],
    log_path: Path,
    out_dir: Path,
    *,
    progress: Progress | None,
    timeout: float | None,
) -> tuple[int, str]:
    """Run the serializer child in a process group of its own, its output into ``log_path``;
    report the bytes in ``out_dir`` while it runs. Whatever stops the wait (the timeout, a
    cancel raised by ``progress``) kills the whole group first. Returns its exit status and
    output."""
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        # The engine core in the child itself (tp workers are still their own processes).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "HF_HUB_OFFLINE": "1",
    }
    with open(log_path, "w+b") as log:
        child = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root),
            start_new_session=True,
        )  # fmt: skip
        started = time.monotonic()
        try:
            while child.poll() is None:
                if timeout is not None and time.monotonic() - started > timeout:
                    raise SerializeError(f"vLLM's serializer ran past {timeout:.0f} s")
                if progress is not None:
                    written = sum(p.stat().st_size for p in out_dir.glob("*.tensors"))
                    progress(written, 0)
                time.sleep(0.5)
        except BaseException:
            _kill_group(child)
            raise
        log.seek(0)
        output = log.read().decode(errors="replace")
    return child.returncode, output


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
