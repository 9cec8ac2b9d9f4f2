"""BLAKE3 of a layout manifest's chunks, computed on the CUDA device the bytes were copied to.

The load engine's chunk digests (tensor_registry.formats.layout: BLAKE3 of every ``chunk_bytes``
slice of a file) cost 16 host cores more than they have while the same cores copy out of the page
cache (bench/RESULTS.md). The bytes reach the device anyway, and BLAKE3 is a tree of
independent 1 KiB leaves: a GPU hashes 10 GB in milliseconds. So the engine copies each block
of file bytes into a device staging buffer, launches the ``leaves`` kernel on it (on the copy's
stream, overlapped with the other copies), scatters the staging buffer into the tensors' slots
and, after the last copy, reduces the subtree values to one root per chunk (``parents``) and
compares them with the manifest's digests on the device. A mismatch is found on exactly the
bytes the tensors hold.

The digest is standard BLAKE3 (unkeyed, 32-byte output): every chunk of ``chunk_bytes`` =
2**k KiB is hashed as its own BLAKE3 input, so a leaf's counter is its 1 KiB index inside the
chunk. ``chunk_bytes`` must be a power of two of at least ``LEAVES`` KiB; a shorter last chunk
of a file is hashed on the host (``DeviceDigests.host_tail``).

The kernels are CUDA C (blake3_kernels.cu) built by tensor_registry.engine.kernels: NVRTC for the
device, the host C compiler for CPU tensors, which is how the tests compare them with the
``blake3`` package on machines without a GPU.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry.engine import kernels

if TYPE_CHECKING:
    from tensor_registry.formats.layout import FileLayout

KIB = 1024
SUBTREE_BYTES = 32  # one row of ``subtrees``: eight 32-bit words
SOURCE = Path(__file__).with_name("blake3_kernels.cu")
# 1 KiB leaves per thread of the ``leaves`` kernel: the source's own #define, read from it.
LEAVES = int(re.search(r"#define LEAVES (\d+)", SOURCE.read_text())[1])  # type: ignore[index]


def supported(chunk_bytes: int) -> bool:
    leaves = chunk_bytes // KIB
    return chunk_bytes % KIB == 0 and leaves >= LEAVES and leaves & (leaves - 1) == 0


class DeviceDigests:
    """The digests of one file's whole chunks, computed block by block on ``device``."""

    def __init__(self, file: Any, device: Any) -> None:
        import torch

        if not supported(file.chunk_bytes):
            raise ValueError(f"chunk_bytes {file.chunk_bytes} cannot be hashed on the device")
        self.kernels = kernels.module(SOURCE, device)
        self.file = file
        self.chunk = file.chunk_bytes
        self.whole = file.size // self.chunk  # chunks hashed here; a shorter last one on the host
        self.subs = self.chunk // (LEAVES * KIB)
        rows = max(1, self.whole * self.subs)
        self.subtrees = torch.empty((rows, 8), dtype=torch.int32, device=device)
        self.subtrees_base = self.subtrees.data_ptr()
        raw = bytes.fromhex("".join(file.chunks[: self.whole]))
        self.expected = (
            torch.frombuffer(bytearray(raw), dtype=torch.int32).view(-1, 8).to(device)
            if raw
            else None
        )

    def hash_block(self, staged: Any, start: int, end: int, *, stream: int | None = None) -> None:
        """Launch the leaves of the whole chunks of file bytes [start, end) held by ``staged``
        (a device uint8 tensor or its address, ``start`` a multiple of chunk_bytes) on
        ``stream`` (a handle; None: torch's current stream)."""
        first = start // self.chunk
        last = min(end // self.chunk, self.whole)
        if last <= first:
            return
        address = staged if isinstance(staged, int) else staged.data_ptr()
        if address % 16:
            raise ValueError("the staged bytes must start on 16 bytes")
        out = self.subtrees_base + first * self.subs * SUBTREE_BYTES
        self.kernels.launch(
            "leaves", (last - first) * self.subs, "ppu", address, out, self.subs, stream=stream
        )

    def host_tail(self) -> tuple[int, int] | None:
        """File bytes [start, end) of the shorter last chunk, which the caller hashes itself."""
        start = self.whole * self.chunk
        return (start, self.file.size) if start < self.file.size else None

    def mismatches(self) -> list[int]:
        """Indices of the whole chunks whose bytes differ (after every ``hash_block`` copy has
        finished: the caller synchronizes first)."""
        import torch

        if self.expected is None:
            return []
        level, n = self.subtrees, self.whole * self.subs
        while n > self.whole:
            n //= 2
            parents = torch.empty((n, 8), dtype=torch.int32, device=level.device)
            self.kernels.launch("parents", n, "ppu", level, parents, int(n == self.whole))
            level = parents
        bad = (level != self.expected).any(dim=1).nonzero().flatten()
        return [int(i) for i in bad.tolist()]


def warm_up(device: Any, chunk_bytes: int) -> None:
    """Build or load the kernels (NVRTC's cubin is cached on disk) and run them once before
    threads launch them."""
    import torch

    from tensor_registry.formats.layout import FileLayout

    chunk = chunk_bytes
    data = torch.zeros(chunk, dtype=torch.uint8, device=device)
    probe = FileLayout("warm-up", chunk, "", 1, False, chunk, ("00" * 32,), ())
    digests = DeviceDigests(probe, device)
    digests.hash_block(data, 0, chunk)
    digests.mismatches()


_warm: set[tuple[str, int]] = set()  # (device, chunk_bytes) whose kernels ran here
_warm_lock = threading.Lock()
# "auto" digests go to the device once its kernels ran in this process, or for a file this big:
# loading the cached cubin and the staging cost a fresh process ≈ 0.05-0.09 s, which host digests
# of a small file do not (1.35 GB node-cache first load: 0.17 s on the device, 0.13 s on the
# host), while from a few GB on the device wins (9.93 GB: 0.38 s against 0.66 s;
# bench/RESULTS.md).
DEVICE_DIGESTS_FROM = 2 * 10**9


def device_digests(file: FileLayout, device: Any, digest_on: str) -> Any:
    """The on-device BLAKE3 of ``file``'s chunks (this module), or None when
    the host hashes them: ``digest_on`` "host", a chunk size the kernels cannot hash, or ("auto") a
    small file in a process whose kernels have not run yet, or kernels that cannot be built
    here (no NVRTC, no driver). NVRTC builds them once per machine (0.1-0.8 s; the cubin is
    cached on disk); loading the cached cubin takes a fresh process ≈ 0.05 s."""
    if digest_on == "host":
        return None
    if not supported(file.chunk_bytes):
        if digest_on == "device":
            raise ValueError(f"chunk_bytes {file.chunk_bytes} cannot be hashed on the device")
        return None
    key = (str(device), file.chunk_bytes)
    if digest_on == "auto" and key not in _warm and file.size < DEVICE_DIGESTS_FROM:
        return None  # starting the kernels would cost this first load more than host digests
    try:
        with _warm_lock:
            if key not in _warm:
                warm_up(device, file.chunk_bytes)
                _warm.add(key)
        return DeviceDigests(file, device)
    except Exception:
        # No NVRTC or driver library, or a device it cannot build for: the host threads
        # hash instead; "device" asked for it explicitly and fails.
        if digest_on == "device":
            raise
        return None
