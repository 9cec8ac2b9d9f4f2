"""The load engine: an artifact's bytes onto a device at the hardware's rate, every chunk verified.

    from app.client.engine import load_artifact
    result = load_artifact("acme/llama:prod", device="cuda")      # LoadResult
    result.tensors["model.embed_tokens.weight"], result.gbps, result.path   # "engine"

It needs the artifact's layout manifest (app.client.layout, the file ``tensors.layout.json``
beside the weights): where every tensor's bytes lie and a BLAKE3 digest per 8 MiB chunk. No
tensorizer parsing, no per-tensor reads. How bytes travel:

- **CPU, local file / node cache**: the file is mmap'd privately (copy-on-write: tensors are
  writable, the cached file never changes) and every tensor is a zero-copy ``torch.frombuffer``
  view into it, as safetensors does. Verification hashes every chunk on a thread pool (the
  binding releases the GIL). tensorizer does not align tensor data, so a view may start at an
  odd address: torch's CPU kernels accept that (``aligned=True`` copies such tensors instead).
- **CPU, signed URL**: ``connections`` threads each hold one HTTP/1.1 keep-alive connection and
  fetch ``block_bytes`` ranges (206, exact Content-Range) straight into one anonymous mapping.
- **CUDA**: one device allocation per file; each tensor gets a 256-byte aligned slot in it and
  every block of file bytes is scattered to its tensors' slots by async copies. Blocks reach the
  device two ways at once (local files): reader threads ``preadv`` blocks into a ring of pinned
  buffers and copy them on several streams (a CPU copy out of the page cache), while one thread
  maps the tail of the file, pins its pages in place with ``cudaHostRegister`` (read-only) a
  slice at a time and copies them with no CPU copy at all (the driver's pinning and the DMA
  engine). ``register_fraction`` splits the file between the two (bench/results/engine.md).
  Over a URL only the pinned ring runs, fed by HTTP range connections.
- Verification hashes each chunk on the thread that brought it, overlapped with its copy.

A digest mismatch, a short read or a range answered with other bytes raises
``ChunkMismatch`` naming the tensors in the bad chunk; nothing is returned half-loaded. An
expired URL during a load re-resolves once and starts again. Encrypted artifacts and artifacts
without a manifest load through tensorizer's reader (app.client.loading) and say so in
``LoadResult.path``.

torch is imported lazily (the base client installs without it).
"""

from __future__ import annotations

import bisect
import ctypes
import http.client
import json
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from app.client import layout as layouts
from app.client.api import (
    USER_AGENT,
    ChecksumMismatch,
    ConnectionFailed,
    RegistryClient,
    RegistryError,
    Resolution,
    SignatureExpired,
    error_from_response,
    parse_model_ref,
)
from app.client.cache import NodeCache
from app.client.layout import FileLayout, LayoutError

if TYPE_CHECKING:
    pass

BLOCK_BYTES = 64 << 20
DEFAULT_CONNECTIONS = 16
SLOT_ALIGN = 256
REGISTER_SLICE = 512 << 20
URL_RANGE_MAX = 1 << 30
HTTP_TIMEOUT = 120.0
VLLM_MARKER = ".vllm_tensorized_marker"
_CUDA_HOST_REGISTER_READ_ONLY = 8
_CUDA_HOST_REGISTER_PORTABLE = 1


class ChunkMismatch(ChecksumMismatch):
    """A chunk's bytes are not the ones the layout manifest recorded (or never arrived)."""

    code = "chunk_mismatch"

    def __init__(self, detail: str, *, tensors: list[str]) -> None:
        super().__init__(detail, status=None)
        self.tensors = tensors


@dataclass
class LoadResult:
    tensors: dict[str, Any]
    path: str  # "engine", or "tensorizer" (the fallback; ``reason`` says why)
    source: str  # "file" or "url"
    device: str
    verified: bool
    bytes: int
    seconds: float
    reason: str | None = None
    # Seconds per step, and "digest_on" ("device", "host" or "none") for CUDA engine loads.
    phases: dict[str, Any] = field(default_factory=dict)
    # The signing key's id when the artifact's signed manifest verified; None: unsigned.
    signed_by: str | None = None

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# Byte sources


class _FileSource:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)

    def reader(self) -> Callable[[int, memoryview], int]:
        fd = self.fd

        def read_into(offset: int, buffer: memoryview) -> int:
            got = 0
            while got < len(buffer):
                n = os.preadv(fd, [buffer[got:]], offset + got)
                if n <= 0:
                    break
                got += n
            return got

        return read_into

    def close(self) -> None:
        os.close(self.fd)


class _WrongRange(Exception):
    def __init__(self, start: int, end: int, what: str) -> None:
        super().__init__(what)
        self.start, self.end, self.what = start, end, what


def _shorter_file(served: str | None, offset: int, end: int, size: int) -> int | None:
    """Bytes a 206 carries when it answers ``offset``-``end`` of a file shorter than ``size``
    ("bytes OFFSET-LAST/TOTAL" with LAST < end and TOTAL < size); else None."""
    try:
        span, _, total = (served or "").removeprefix("bytes ").partition("/")
        first, _, last = span.partition("-")
        if int(first) == offset and int(last) < end and int(last) + 1 == int(total) < size:
            return int(last) - offset + 1
    except ValueError:
        pass
    return None


class _HTTPRangeReader:
    """One keep-alive HTTP/1.1 connection reading exact byte ranges of ``url``."""

    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectionFailed(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
        self.parts = parts
        self.size = size
        self.target = parts.path + (f"?{parts.query}" if parts.query else "")
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        kind = (
            http.client.HTTPSConnection
            if self.parts.scheme == "https"
            else http.client.HTTPConnection
        )
        return kind(self.parts.hostname or "", self.parts.port, timeout=HTTP_TIMEOUT)

    def __call__(
        self,
        offset: int,
        buffer: memoryview,
        each: Callable[[int, memoryview], None] | None = None,
        step: int = 0,
    ) -> int:
        """Read bytes [offset, offset + len(buffer)) into ``buffer``; returns the count read.
        With ``each``, every ``step`` bytes that landed are handed to it at once (so they are
        checked while the rest of the range is still arriving)."""
        end = offset + len(buffer) - 1
        headers = {"Range": f"bytes={offset}-{end}", "Accept-Encoding": "identity"}
        headers["User-Agent"] = USER_AGENT
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = self._connect()
            try:
                self.conn.request("GET", self.target, headers=headers)
                response = self.conn.getresponse()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    raise ConnectionFailed(f"range {offset}-{end}: {exc}") from exc
        if response.status == 416:
            response.read()
            return 0  # past the end: the file is shorter than the manifest says
        if response.status >= 300:
            body = response.read(64 * 1024)
            self.close()
            raise error_from_response(
                httpx.Response(response.status, headers=dict(response.getheaders()), content=body)
            )
        served = response.getheader("content-range")
        want = len(buffer)
        if response.status != 206 or served != f"bytes {offset}-{end}/{self.size}":
            shorter = _shorter_file(served, offset, end, self.size)
            if response.status != 206 or shorter is None:
                # A whole-file 200 or another range: bytes this load must not use.
                self.close()
                raise _WrongRange(
                    offset, end + 1, f"HTTP {response.status}, Content-Range {served!r}"
                )
            want = shorter  # the stored file is shorter than the manifest: a short read
        got = handed = 0
        try:
            while got < want:
                n = response.readinto(buffer[got:want])
                if not n:
                    break
                got += n
                while each is not None and got - handed >= step:
                    each(offset + handed, buffer[handed : handed + step])
                    handed += step
            if each is not None and got == len(buffer) and handed < got:
                each(offset + handed, buffer[handed:got])
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ConnectionFailed(f"range {offset}-{end}: {exc}") from exc
        if got < len(buffer) or response.will_close:
            self.close()
        return got

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# ---------------------------------------------------------------------------------------------
# Verification


def _verify_block(file: FileLayout, start: int, data: memoryview) -> None:
    """Check every chunk of ``data`` (file bytes from ``start``, a multiple of chunk_bytes)."""
    chunk = file.chunk_bytes
    for offset in range(0, len(data), chunk):
        index = (start + offset) // chunk
        piece = data[offset : offset + chunk]
        if layouts.chunk_digest(piece) != file.chunks[index]:
            raise _mismatch(file, index)


def _mismatch(file: FileLayout, index: int) -> ChunkMismatch:
    a, b = file.chunk_range(index)
    return ChunkMismatch(
        f"{file.describe(a, b)}: bytes differ from the layout manifest's BLAKE3 digest "
        "(storage corruption or a proxy answering with other bytes); nothing was loaded",
        tensors=file.tensors_in(a, b),
    )


def _short_read(file: FileLayout, start: int, want: int, got: int) -> ChunkMismatch:
    a, b = start + got, start + want
    return ChunkMismatch(
        f"{file.describe(a, b)}: only {got} of {want} bytes arrived (truncated file?); "
        "nothing was loaded",
        tensors=file.tensors_in(a, b),
    )


def _raise_short(file: FileLayout, start: int, data: memoryview, got: int, verify: bool) -> None:
    """A short read: bytes that did arrive but differ are the better diagnosis, so the whole
    chunks among them are checked first."""
    if verify:
        whole = got // file.chunk_bytes * file.chunk_bytes
        _verify_block(file, start, data[:whole])
    raise _short_read(file, start, len(data), got)


def _checked(file: FileLayout, read: Callable[..., int]) -> Callable[..., int]:
    def read_into(offset: int, buffer: memoryview, *more: Any) -> int:
        try:
            return read(offset, buffer, *more)
        except _WrongRange as exc:
            raise ChunkMismatch(
                f"{file.describe(exc.start, exc.end)}: the server answered the range with "
                f"{exc.what}; nothing was loaded",
                tensors=file.tensors_in(exc.start, exc.end),
            ) from None

    return read_into


def _blocks(size: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(size, s + block)) for s in range(0, size, block)]


def _block_size(file: FileLayout, block_bytes: int) -> int:
    return max(file.chunk_bytes, block_bytes // file.chunk_bytes * file.chunk_bytes)


# ---------------------------------------------------------------------------------------------
# Tensors out of one buffer


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _views(file: FileLayout, buffer: Any, *, aligned: bool, skip_marker: bool) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for t in file.tensors:
        if skip_marker and t.name == VLLM_MARKER:
            continue
        dtype = _torch_dtype(t.dtype)
        count = t.nbytes // layouts.ITEM_SIZES[t.dtype]
        if t.data_length == 0:
            out[t.name] = torch.zeros(t.shape, dtype=dtype)
            continue
        view = torch.frombuffer(buffer, dtype=dtype, count=count, offset=t.data_offset)
        if aligned and t.data_offset % view.element_size():
            view = view.clone()
        out[t.name] = view.view(t.shape)
    return out


# ---------------------------------------------------------------------------------------------
# CPU


def load_file_cpu(
    path: Path | str,
    file: FileLayout,
    *,
    verify: bool = True,
    threads: int | None = None,
    aligned: bool = False,
    skip_marker: bool = True,
) -> dict[str, Any]:
    """Zero-copy tensors over a private mmap of a local file, every chunk checked first."""
    path = Path(path)
    size = path.stat().st_size
    if size < file.size:
        raise _short_read(file, size, file.size - size, 0)
    if size > file.size:
        raise ChunkMismatch(
            f"{file.path}: {size} bytes on disk, the layout manifest says {file.size}", tensors=[]
        )
    with open(path, "rb") as fh:
        # Private (copy-on-write): tensors are writable, the cached file never changes.
        mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)

    if verify:
        view = memoryview(mapped)
        try:
            step = file.chunk_bytes * 4
            with ThreadPoolExecutor(max_workers=threads or _cores()) as pool:
                list(
                    pool.map(
                        lambda s: _verify_block(file, s, view[s : min(size, s + step)]),
                        range(0, size, step),
                    )
                )
        finally:
            view.release()
    return _views(file, mapped, aligned=aligned, skip_marker=skip_marker)


def load_url_cpu(
    url: str,
    file: FileLayout,
    *,
    verify: bool = True,
    connections: int = DEFAULT_CONNECTIONS,
    block_bytes: int = BLOCK_BYTES,
    aligned: bool = False,
    skip_marker: bool = True,
) -> dict[str, Any]:
    """Parallel range reads of ``url`` into one anonymous mapping, chunks checked as they land."""
    size = file.size
    mapped = mmap.mmap(-1, max(1, size))
    view = memoryview(mapped)
    # One long range per connection (fewer requests through the registry's signature check);
    # chunks are verified as they arrive within it.
    per_connection = -(-size // max(1, connections) // file.chunk_bytes) * file.chunk_bytes
    block = min(max(_block_size(file, block_bytes), per_connection), URL_RANGE_MAX)
    work: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
    for item in _blocks(size, block):
        work.put(item)
    failed = threading.Event()

    def worker() -> None:
        reader = _HTTPRangeReader(url, size)
        read = _checked(file, reader)
        try:
            while not failed.is_set():
                try:
                    start, end = work.get_nowait()
                except queue.Empty:
                    return
                target = view[start:end]
                if verify:
                    got = read(start, target, partial(_verify_block, file), file.chunk_bytes)
                else:
                    got = read(start, target)
                if got != end - start:
                    _raise_short(file, start, target, got, verify)
        except BaseException:
            failed.set()
            raise
        finally:
            reader.close()

    try:
        _run_workers(worker, min(connections, max(1, len(_blocks(size, block)))))
    finally:
        view.release()
    return _views(file, mapped, aligned=aligned, skip_marker=skip_marker)


def _run_workers(worker: Callable[[], None], count: int) -> None:
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="engine") as pool:
        futures = [pool.submit(worker) for _ in range(count)]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if isinstance(e, ChunkMismatch)), None) or next(
        (e for e in errors if e is not None), None
    )
    if first is not None:
        raise first


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------------------------------------
# CUDA


@dataclass
class _Plan:
    """Where each tensor lives in the one device allocation; sorted by file offset."""

    starts: list[int]
    ends: list[int]
    slots: list[int]
    total: int


def _plan(file: FileLayout) -> _Plan:
    tensors = sorted((t for t in file.tensors if t.data_length), key=lambda t: t.data_offset)
    starts, ends, slots = [], [], []
    cursor = 0
    for t in tensors:
        starts.append(t.data_offset)
        ends.append(t.data_offset + t.data_length)
        slots.append(cursor)
        cursor += (t.data_length + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN
    return _Plan(starts, ends, slots, max(cursor, SLOT_ALIGN))


def _segments(plan: _Plan, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(file offset, device offset, length) of each tensor's bytes inside [start, end)."""
    i = max(0, bisect.bisect_right(plan.starts, start) - 1)
    while i < len(plan.starts) and plan.starts[i] < end:
        a, b = max(start, plan.starts[i]), min(end, plan.ends[i])
        if a < b:
            yield a, plan.slots[i] + (a - plan.starts[i]), b - a
        i += 1


def _host_view(address: int, length: int) -> Any:
    """A CPU uint8 tensor over raw memory (pinned or registered)."""
    import torch

    return torch.frombuffer((ctypes.c_char * length).from_address(address), dtype=torch.uint8)


def _memview(address: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


class _PinnedRing:
    """``count`` pinned host buffers of ``size`` bytes, each with a device staging buffer of the
    same size when ``device`` is given (the bytes go host → staging, are hashed there, then
    scattered to the tensors); each handed back with the event of the last copy still reading
    it, waited for before the buffer is refilled."""

    def __init__(self, count: int, size: int, device: Any = None) -> None:
        import torch

        self.free: queue.SimpleQueue[tuple[Any, Any, Any]] = queue.SimpleQueue()
        for _ in range(count):
            host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            staged = None if device is None else torch.empty(size, dtype=torch.uint8, device=device)
            self.free.put((host, staged, None))

    def take(self) -> tuple[Any, Any]:
        buffer, staged, event = self.free.get()
        if event is not None:
            event.synchronize()
        return buffer, staged

    def give(self, buffer: Any, staged: Any, event: Any) -> None:
        self.free.put((buffer, staged, event))


_rings: dict[tuple[int, int, str | None], _PinnedRing] = {}
_rings_lock = threading.Lock()


def _ring(count: int, size: int, device: Any = None) -> _PinnedRing:
    # Pinning host memory is slow (≈ 0.3 s per GB): a process keeps its ring between loads.
    key = (count, size, None if device is None else str(device))
    with _rings_lock:
        ring = _rings.get(key)
        if ring is None:
            ring = _rings[key] = _PinnedRing(count, size, device)
        return ring


_warm: set[tuple[str, int]] = set()


def _device_digests(file: FileLayout, device: Any, digest_on: str) -> Any:
    """The on-device BLAKE3 of ``file``'s chunks (app.client.gpu_blake3), or None when the
    host hashes them: ``digest_on`` "host", no Triton, or a chunk size it cannot hash."""
    if digest_on == "host":
        return None
    try:
        from app.client import gpu_blake3
    except ImportError:
        if digest_on == "device":
            raise
        return None
    if not gpu_blake3.supported(file.chunk_bytes):
        if digest_on == "device":
            raise ValueError(f"chunk_bytes {file.chunk_bytes} cannot be hashed on the device")
        return None
    key = (str(device), file.chunk_bytes)
    try:
        with _rings_lock:
            if key not in _warm:
                gpu_blake3.warm_up(device, file.chunk_bytes)
                _warm.add(key)
        return gpu_blake3.DeviceDigests(file, device)
    except Exception:
        # Triton present but unable to build for this device (no compiler, old GPU): the
        # host threads hash instead; "device" asked for it explicitly and fails.
        if digest_on == "device":
            raise
        return None


_libcudart: Any = None


def _cudart() -> Any:
    """The CUDA runtime torch loaded, called through ctypes: a ctypes call releases the GIL,
    so pinning (≈ 25 ms per GB, serialised in the driver) never stalls the reader threads,
    whose Python steps between preadv calls need the GIL (torch's own binding holds it)."""
    global _libcudart
    if _libcudart is not None:
        return _libcudart
    import glob

    import torch

    torch.cuda.init()
    candidates = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]
    roots = {os.path.dirname(os.path.dirname(torch.__file__))}
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "torch", "lib", "libcudart*.so*")))
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostRegister.restype = ctypes.c_int
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostUnregister.restype = ctypes.c_int
        lib.engine_source = name  # type: ignore[attr-defined]
        _libcudart = lib
        return lib
    _libcudart = torch.cuda.cudart()  # no shared library found: torch's binding (holds the GIL)
    return _libcudart


class _Registered:
    """A read-only shared mapping of [start, end) of a file, pinned in slices as it is used."""

    def __init__(self, fd: int, start: int, end: int) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        page = mmap.PAGESIZE
        self.map_start = start // page * page
        self.length = end - self.map_start
        address = self.libc.mmap(
            None, self.length, mmap.PROT_READ, mmap.MAP_SHARED, fd, self.map_start
        )
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        self.base = int(address)
        self.pinned: list[tuple[int, int]] = []

    def address(self, offset: int) -> int:
        return self.base + (offset - self.map_start)

    def pin(self, start: int, end: int) -> None:
        """Pin [start, end) (file offsets; page-aligned by the caller except at the ends)."""
        page = mmap.PAGESIZE
        a = self.address(start // page * page) if start > self.map_start else self.base
        b = self.address(min(self.map_start + self.length, (end + page - 1) // page * page))
        err = _cudart().cudaHostRegister(
            a, b - a, _CUDA_HOST_REGISTER_READ_ONLY | _CUDA_HOST_REGISTER_PORTABLE
        )
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {err}")
        self.pinned.append((a, b - a))

    def close(self) -> None:
        for a, _ in self.pinned:
            _cudart().cudaHostUnregister(a)
        self.pinned.clear()
        self.libc.munmap(self.base, self.length)


def load_cuda(
    file: FileLayout,
    *,
    path: Path | str | None = None,
    url: str | None = None,
    device: Any = "cuda",
    verify: bool = True,
    readers: int = 16,
    block_bytes: int = BLOCK_BYTES,
    streams: int = 4,
    ring_buffers: int | None = None,
    register_fraction: float = 0.0,
    hash_threads: int = 4,
    digest_on: str = "auto",
    skip_marker: bool = True,
    phases: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One file onto a CUDA device: one allocation, tensors as views of aligned slots.

    ``digest_on``: where chunk digests are checked when ``verify``: "device" (BLAKE3 on the
    GPU over the staged bytes, app.client.gpu_blake3), "host" (on ``hash_threads`` CPU
    threads), or "auto" (the device when Triton is there). ``phases["digest_on"]`` says which.
    """
    import torch

    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    t0 = time.perf_counter()
    plan = _plan(file)
    dest = torch.empty(plan.total, dtype=torch.uint8, device=device)
    block = _block_size(file, block_bytes)
    size = file.size
    source = _FileSource(Path(path)) if path is not None else None
    if source is None and url is None:
        raise ValueError("load_cuda needs a path or a url")
    if source is not None and os.fstat(source.fd).st_size < size:
        actual = os.fstat(source.fd).st_size
        source.close()
        raise _short_read(file, 0, size, actual)
    # The registered tail starts on a block boundary; the ring reads everything before it.
    cut = size
    if source is not None and register_fraction > 0:
        cut = int(size * (1 - register_fraction)) // block * block
    ring_blocks = _blocks(cut, block)
    digests = _device_digests(file, device, digest_on) if verify else None
    tail = digests.host_tail() if digests is not None else None
    ring = _ring(ring_buffers or max(2 * readers, 8), block, device if digests else None)
    stream_pool = [torch.cuda.Stream(device) for _ in range(max(1, streams))]
    work: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
    for n, (a, b) in enumerate(ring_blocks):
        work.put((n, a, b))
    failed = threading.Event()
    done_events: list[Any] = []
    events_lock = threading.Lock()
    if phases is not None:
        phases["allocate_s"] = time.perf_counter() - t0

    def scatter(host: Any, start: int, end: int, stream: Any, staged: Any = None) -> Any:
        """Copy file bytes [start, end) from ``host`` to their tensors' slots; with a device
        ``staged`` buffer: host → staged, hash the chunks there, then staged → slots."""
        with torch.cuda.stream(stream):
            source = host
            if staged is not None and digests is not None:
                staged[: end - start].copy_(host[: end - start], non_blocking=True)
                digests.hash_block(staged, start, end)
                source = staged
            for a, slot, length in _segments(plan, start, end):
                dest[slot : slot + length].copy_(
                    source[a - start : a - start + length], non_blocking=True
                )
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def host_checks(start: int, view: memoryview) -> None:
        """The chunks the device does not hash: all of them, or the shorter last one."""
        if digests is None:
            _verify_block(file, start, view)
        elif tail is not None and start <= tail[0] < start + len(view):
            _verify_block(file, tail[0], view[tail[0] - start :])

    def reader_worker() -> None:
        torch.cuda.set_device(device)
        http_reader = None if source is not None else _HTTPRangeReader(url or "", size)
        read = _checked(file, source.reader() if source is not None else http_reader)  # type: ignore[arg-type]
        try:
            while not failed.is_set():
                try:
                    n, start, end = work.get_nowait()
                except queue.Empty:
                    return
                buffer, staged = ring.take()
                event = None
                try:
                    view = _memview(buffer.data_ptr(), end - start)
                    got = read(start, view)
                    if got != end - start:
                        _raise_short(file, start, view, got, verify)
                    stream = stream_pool[n % len(stream_pool)]
                    event = scatter(buffer, start, end, stream, staged)
                    if verify:
                        host_checks(start, view)
                finally:
                    ring.give(buffer, staged, event)
                if event is not None:
                    with events_lock:
                        done_events.append(event)
        except BaseException:
            failed.set()
            raise
        finally:
            if http_reader is not None:
                http_reader.close()

    registered: _Registered | None = None
    pinning = [0.0]

    def register_worker() -> None:
        nonlocal registered
        assert source is not None
        torch.cuda.set_device(device)
        registered = _Registered(source.fd, cut, size)
        stream = torch.cuda.Stream(device)
        pending = []
        # Device staging for on-device digests: two slices, each reused after its scatter.
        staging: list[tuple[Any, Any]] = (
            [
                (torch.empty(REGISTER_SLICE, dtype=torch.uint8, device=device), None)
                for _ in range(2)
            ]
            if digests is not None
            else []
        )
        with ThreadPoolExecutor(max_workers=max(1, hash_threads)) as hashers:
            try:
                for k, start in enumerate(range(cut, size, REGISTER_SLICE)):
                    if failed.is_set():
                        return
                    end = min(size, start + REGISTER_SLICE)
                    pin_started = time.perf_counter()
                    registered.pin(start, end)
                    pinning[0] += time.perf_counter() - pin_started
                    host = _host_view(registered.address(start), end - start)
                    staged = None
                    if staging:
                        staged, previous = staging[k % 2]
                        if previous is not None:
                            previous.synchronize()
                    event = scatter(host, start, end, stream, staged)
                    if staging:
                        staging[k % 2] = (staged, event)
                    with events_lock:
                        done_events.append(event)
                    if verify and digests is not None:
                        host_checks(start, _memview(registered.address(start), end - start))
                    elif verify:
                        view = _memview(registered.address(start), end - start)
                        step = file.chunk_bytes * 2
                        pending += [
                            hashers.submit(
                                _verify_block, file, s, view[s - start : min(end, s + step) - start]
                            )
                            for s in range(start, end, step)
                        ]
                for f in pending:
                    f.result()
            except BaseException:
                failed.set()
                raise

    try:
        count = min(readers, max(1, len(ring_blocks)))
        jobs: list[Callable[[], None]] = [reader_worker] * (count if ring_blocks else 0)
        if cut < size:
            jobs.append(register_worker)
        with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="load") as pool:
            futures = [pool.submit(j) for j in jobs]
            errors = [f.exception() for f in futures]
        first = next((e for e in errors if isinstance(e, ChunkMismatch)), None) or next(
            (e for e in errors if e is not None), None
        )
        if first is not None:
            raise first
        if phases is not None:
            phases["issued_s"] = time.perf_counter() - t0
        for event in done_events:
            event.synchronize()
        if phases is not None:
            phases["copied_s"] = time.perf_counter() - t0
        if digests is not None:
            bad = digests.mismatches()
            if bad:
                raise _mismatch(file, bad[0])
        if phases is not None:
            phases["on_device_s"] = time.perf_counter() - t0
            phases["digest_on"] = "device" if digests is not None else "host" if verify else "none"
            if cut < size:
                phases["pinning_s"] = pinning[0]
        if registered is not None:
            # Unpinning takes ~5-8 ms per GB and nothing waits for it: off the load's path.
            _release_later(registered, source)
            registered = source = None
    except BaseException:
        # Copies may still be writing into ``dest``: let them finish before its memory is reused.
        torch.cuda.synchronize(device)
        del dest
        raise
    finally:
        if registered is not None:
            registered.close()
        if source is not None:
            source.close()
    if phases is not None:
        phases["returned_s"] = time.perf_counter() - t0
    return _device_views(file, plan, dest, skip_marker=skip_marker)


_releasing: list[threading.Thread] = []


def _release_later(registered: _Registered, source: _FileSource | None) -> None:
    def release() -> None:
        registered.close()
        if source is not None:
            source.close()

    thread = threading.Thread(target=release, name="engine-unpin", daemon=True)
    thread.start()
    _releasing.append(thread)


def wait_released() -> float:
    """Wait for pinned file pages of earlier loads to be released; returns the seconds waited."""
    t = time.perf_counter()
    while _releasing:
        _releasing.pop().join()
    return time.perf_counter() - t


def _device_views(file: FileLayout, plan: _Plan, dest: Any, *, skip_marker: bool) -> dict[str, Any]:
    import torch

    slot_of = dict(zip(plan.starts, plan.slots, strict=True))
    out: dict[str, Any] = {}
    for t in file.tensors:
        if skip_marker and t.name == VLLM_MARKER:
            continue
        dtype = _torch_dtype(t.dtype)
        if t.data_length == 0:
            out[t.name] = torch.zeros(t.shape, dtype=dtype, device=dest.device)
            continue
        slot = slot_of[t.data_offset]
        out[t.name] = dest[slot : slot + t.data_length].view(dtype).view(t.shape)
    return out


# ---------------------------------------------------------------------------------------------
# Artifacts


def fetch_layout(client: RegistryClient, resolution: Resolution) -> layouts.ArtifactLayout | None:
    """The artifact's layout manifest, or None for an artifact published without one."""
    entry = next((f for f in resolution.files if f.path == layouts.LAYOUT_FILE), None)
    if entry is None:
        return None
    if entry.size > 64 << 20:
        raise LayoutError("bad_layout", f"layout manifest of {entry.size} bytes is implausible")
    try:
        # Signed URLs carry their own auth: the bearer token never goes to a blob URL.
        response = client.anonymous.get(entry.url, headers={"Accept-Encoding": "identity"})
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"layout manifest: {exc}") from exc
    if response.status_code >= 400:
        raise error_from_response(response)
    import hashlib

    if hashlib.sha256(response.content).hexdigest() != entry.sha256:
        raise ChecksumMismatch("the layout manifest's bytes do not match its sha256", status=None)
    return layouts.loads(response.content)


def rank_file(resolution: Resolution, rank: int) -> str:
    weights = sorted(f.path for f in resolution.files if f.kind == "weights")
    if not 0 <= rank < len(weights):
        resolution.rank_uri(rank)  # raises invalid_rank
    return weights[rank]


def load_artifact(
    model: str | Resolution,
    ref: str | None = None,
    *,
    client: RegistryClient | None = None,
    rank: int = 0,
    device: Any = "cpu",
    verify: bool = True,
    cache: NodeCache | None = None,
    connections: int | None = None,
    readers: int | None = None,
    register_fraction: float | None = None,
    trusted_keys: list[str] | None = None,
    require_signed: bool | None = None,
    **filters: Any,
) -> LoadResult:
    """Resolve (unless given a Resolution), then load rank ``rank``'s file onto ``device``.

    First the artifact's signed manifest is checked (app.client.trust: signature by a trusted
    key, this artifact, exactly these files); every byte is then checked against it while it
    loads. Nothing is returned when any check fails.

    Reads the node cache's copy when it holds the file (``cache``, default the standard one),
    else the signed URL. Falls back to tensorizer's reader for encrypted artifacts and ones
    without a layout manifest; ``LoadResult.path`` and ``reason`` say which and why.
    """
    owned = client is None
    client = client or RegistryClient()
    try:
        if isinstance(model, Resolution):
            resolution = model
        else:
            name, parsed = parse_model_ref(model)
            # What the node is, so the registry's engine advice fits it.
            filters.setdefault("gpu", str(device).startswith("cuda"))
            filters.setdefault("cpu_count", _cores())
            resolution = client.resolve(name, ref or parsed, **filters)
        if resolution.params and resolution.expires_within(30.0):
            resolution = client.reresolve(resolution)
        for attempt in (1, 2):
            try:
                return _load_resolved(
                    client,
                    resolution,
                    rank=rank,
                    device=device,
                    verify=verify,
                    cache=cache if cache is not None else NodeCache(),
                    connections=connections,
                    readers=readers,
                    register_fraction=register_fraction,
                    trusted_keys=trusted_keys,
                    require_signed=require_signed,
                )
            except SignatureExpired:
                if attempt == 2 or not resolution.params:
                    raise
                resolution = client.reresolve(resolution)
        raise AssertionError("unreachable")
    finally:
        if owned:
            client.close()


def _advice(resolution: Resolution) -> dict[str, Any]:
    return dict(resolution.data.get("engine") or {})


def _load_resolved(
    client: RegistryClient,
    resolution: Resolution,
    *,
    rank: int,
    device: Any,
    verify: bool,
    cache: NodeCache,
    connections: int | None,
    readers: int | None,
    register_fraction: float | None,
    trusted_keys: list[str] | None = None,
    require_signed: bool | None = None,
) -> LoadResult:
    from app.client.trust import verify_resolution

    t0 = time.perf_counter()
    signed = verify_resolution(client, resolution, trusted=trusted_keys, require=require_signed)
    signed_by = signed.key_id if signed is not None else None
    phases: dict[str, Any] = {"signature": time.perf_counter() - t0}
    reason = None
    manifest = None
    if resolution.encrypted:
        reason = "encrypted artifact: tensorizer decrypts it"
    else:
        manifest = fetch_layout(client, resolution)
        if manifest is None:
            reason = "the artifact has no layout manifest (publish or backfill one)"
    if manifest is None:
        from app.client.loading import load_state_dict

        # tensorizer checks only its own per-tensor hashes; the file first goes through the
        # node cache, which keeps a download only if its sha256 is the resolve answer's (the
        # one the signed manifest binds), so altered bytes fail here, before any tensor.
        entry = next(f for f in resolution.files if f.path == rank_file(resolution, rank))
        fetched, _ = cache.fetch(
            client.anonymous,
            entry.url,
            sha256=entry.sha256,
            size=entry.size,
            compatibility_key=resolution.data.get("compatibility_key"),
        )
        phases["fetch"] = time.perf_counter() - t0 - phases["signature"]
        tensors = load_state_dict(
            resolution,
            client=client,
            rank=rank,
            device=device,
            verify_hash=verify,
            local_file=fetched,
            trusted_keys=trusted_keys,
            require_signed=require_signed,
        )
        if str(device).startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        size = sum(f.size for f in resolution.files if f.path == rank_file(resolution, rank))
        return LoadResult(
            tensors=tensors,
            path="tensorizer",
            source="file",
            device=str(device),
            verified=verify,
            bytes=size,
            seconds=time.perf_counter() - t0,
            reason=reason,
            phases=phases,
            signed_by=signed_by,
        )
    path = rank_file(resolution, rank)
    file = manifest.file(path)
    entry = next(f for f in resolution.files if f.path == path)
    if entry.sha256 != file.sha256 or entry.size != file.size:
        raise LayoutError("bad_layout", f"the layout manifest describes another {path}")
    advice = _advice(resolution)
    # A node-cache file serves only the compatibility key it was fetched for (fail closed).
    compatible = cache.contains(
        entry.sha256, entry.size, compatibility_key=resolution.data.get("compatibility_key")
    )
    local = cache.path(entry.sha256) if compatible else None
    if str(device).startswith("cuda"):
        tensors = load_cuda(
            file,
            path=local,
            url=None if local is not None else entry.url,
            device=device,
            verify=verify,
            readers=int(readers or connections or advice.get("connections") or 16),
            block_bytes=int(advice.get("block_bytes") or BLOCK_BYTES),
            register_fraction=float(
                register_fraction
                if register_fraction is not None
                else advice.get("register_fraction", 0.0)
            ),
            phases=phases,
        )
    elif local is not None:
        tensors = load_file_cpu(local, file, verify=verify)
    else:
        tensors = load_url_cpu(
            entry.url,
            file,
            verify=verify,
            connections=int(connections or advice.get("connections") or DEFAULT_CONNECTIONS),
            block_bytes=int(advice.get("block_bytes") or BLOCK_BYTES),
        )
    return LoadResult(
        tensors=tensors,
        path="engine",
        source="file" if local is not None else "url",
        device=str(device),
        verified=verify,
        bytes=file.size,
        seconds=time.perf_counter() - t0,
        phases=phases,
        signed_by=signed_by,
    )


def load_into_module(module: Any, tensors: dict[str, Any], *, strict: bool = True) -> Any:
    """Copy loaded tensors into ``module``'s parameters and buffers in place (same names)."""
    import torch

    state = module.state_dict(keep_vars=True)
    missing = [name for name in state if name not in tensors]
    if strict and missing:
        raise RegistryError(
            f"the artifact lacks {len(missing)} of the module's tensors: {missing[:3]}",
            code="tensors_missing",
        )
    with torch.no_grad():
        for name, target in state.items():
            if name in tensors:
                target.data.copy_(tensors[name])
    return module


def result_json(result: LoadResult) -> str:
    return json.dumps(
        {
            "path": result.path,
            "source": result.source,
            "device": result.device,
            "verified": result.verified,
            "bytes": result.bytes,
            "seconds": round(result.seconds, 4),
            "gbps": round(result.gbps, 3),
            "reason": result.reason,
            "signed_by": result.signed_by,
            "tensors": len(result.tensors),
            "phases": {
                k: round(v, 4) if isinstance(v, float) else v for k, v in result.phases.items()
            },
        }
    )
