"""BLAKE3 of a layout manifest's chunks, computed on the CUDA device the bytes were copied to.

The load engine's chunk digests (app.client.layout: BLAKE3 of every ``chunk_bytes`` slice of a
file) cost 16 host cores more than they have while the same cores copy out of the page cache
(bench/results/engine.md). The bytes reach the device anyway, and BLAKE3 is a tree of
independent 1 KiB leaves: a GPU hashes 10 GB in milliseconds. So the engine copies each block
of file bytes into a device staging buffer, launches ``_leaf_kernel`` on it (on the copy's
stream, overlapped with the other copies), scatters the staging buffer into the tensors' slots
and, after the last copy, reduces the subtree values to one root per chunk and compares them
with the manifest's digests on the device. A mismatch is found on exactly the bytes the
tensors hold.

The digest is standard BLAKE3 (unkeyed, 32-byte output): every chunk of ``chunk_bytes`` =
2**k KiB is hashed as its own BLAKE3 input, so a leaf's counter is its 1 KiB index inside the
chunk. ``chunk_bytes`` must be a power of two of at least ``LEAVES`` KiB; a shorter last chunk
of a file is hashed on the host (``DeviceDigests.host_tail``). Tests compare this code with the
``blake3`` package through Triton's interpreter (``TRITON_INTERPRET=1``), so it runs on CPU
machines too; real loads use it only on CUDA.

Importing this module imports Triton; the engine imports it only for CUDA loads.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

KIB = 1024
LEAVES = 64  # 1 KiB leaves per program: a 64 KiB subtree, reduced in registers
_LEVELS = 6  # log2(LEAVES)
CHUNK_START, CHUNK_END, PARENT, ROOT = 1, 2, 4, 8


def supported(chunk_bytes: int) -> bool:
    leaves = chunk_bytes // KIB
    return chunk_bytes % KIB == 0 and leaves >= LEAVES and leaves & (leaves - 1) == 0


@triton.jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@triton.jit
def _g(a, b, c, d, mx, my):
    a = a + b + mx
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = a + b + my
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _compress(
    c0, c1, c2, c3, c4, c5, c6, c7,
    m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
    counter, flags,
):  # fmt: skip
    """One BLAKE3 compression of a 64-byte block; returns the 8-word chaining value.

    The seven rounds are a loop, not unrolled: fully unrolled, the leaf kernel took minutes to
    compile."""
    zero = counter * 0
    v0, v1, v2, v3, v4, v5, v6, v7 = c0, c1, c2, c3, c4, c5, c6, c7
    v8 = zero + 0x6A09E667
    v9 = zero + 0xBB67AE85
    v10 = zero + 0x3C6EF372
    v11 = zero + 0xA54FF53A
    v12 = counter
    v13 = zero
    v14 = zero + 64
    v15 = zero + flags
    for _ in range(7):
        v0, v4, v8, v12 = _g(v0, v4, v8, v12, m0, m1)
        v1, v5, v9, v13 = _g(v1, v5, v9, v13, m2, m3)
        v2, v6, v10, v14 = _g(v2, v6, v10, v14, m4, m5)
        v3, v7, v11, v15 = _g(v3, v7, v11, v15, m6, m7)
        v0, v5, v10, v15 = _g(v0, v5, v10, v15, m8, m9)
        v1, v6, v11, v12 = _g(v1, v6, v11, v12, m10, m11)
        v2, v7, v8, v13 = _g(v2, v7, v8, v13, m12, m13)
        v3, v4, v9, v14 = _g(v3, v4, v9, v14, m14, m15)
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = (
            m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8
        )  # fmt: skip
    return v0 ^ v8, v1 ^ v9, v2 ^ v10, v3 ^ v11, v4 ^ v12, v5 ^ v13, v6 ^ v14, v7 ^ v15


@triton.jit
def _iv(zero):
    return (
        zero + 0x6A09E667, zero + 0xBB67AE85, zero + 0x3C6EF372, zero + 0xA54FF53A,
        zero + 0x510E527F, zero + 0x9B05688C, zero + 0x1F83D9AB, zero + 0x5BE0CD19,
    )  # fmt: skip


@triton.jit
def _word(base, i: tl.constexpr):
    return tl.load(base + i).to(tl.uint32, bitcast=True)


@triton.jit
def _half(x, n: tl.constexpr):
    """Even and odd lanes of ``x`` (``2 * n`` lanes): the left and right children."""
    return tl.split(tl.reshape(x, [n, 2]))


@triton.jit
def _leaf_kernel(
    data,  # int32 words of whole chunks, back to back
    out,  # int32 [programs, 8]: each program's subtree value (a chunk root when SUBS == 1)
    SUBS: tl.constexpr,  # programs per chunk
    LEAVES: tl.constexpr,
    LEVELS: tl.constexpr,
):
    pid = tl.program_id(0)
    lane = tl.arange(0, LEAVES)
    counter = ((pid % SUBS) * LEAVES + lane).to(tl.uint32)
    base = data + (pid.to(tl.int64) * LEAVES + lane) * 256
    zero = counter * 0
    c0, c1, c2, c3, c4, c5, c6, c7 = _iv(zero)
    for b in range(16):
        p = base + b * 16
        block = zero + b
        flags = (block == 0).to(tl.uint32) | ((block == 15).to(tl.uint32) * 2)
        c0, c1, c2, c3, c4, c5, c6, c7 = _compress(
            c0, c1, c2, c3, c4, c5, c6, c7,
            _word(p, 0), _word(p, 1), _word(p, 2), _word(p, 3),
            _word(p, 4), _word(p, 5), _word(p, 6), _word(p, 7),
            _word(p, 8), _word(p, 9), _word(p, 10), _word(p, 11),
            _word(p, 12), _word(p, 13), _word(p, 14), _word(p, 15),
            counter, flags,
        )  # fmt: skip
    for level in tl.static_range(LEVELS):
        l0, r0 = _half(c0, LEAVES >> (level + 1))
        l1, r1 = _half(c1, LEAVES >> (level + 1))
        l2, r2 = _half(c2, LEAVES >> (level + 1))
        l3, r3 = _half(c3, LEAVES >> (level + 1))
        l4, r4 = _half(c4, LEAVES >> (level + 1))
        l5, r5 = _half(c5, LEAVES >> (level + 1))
        l6, r6 = _half(c6, LEAVES >> (level + 1))
        l7, r7 = _half(c7, LEAVES >> (level + 1))
        z = l0 * 0
        i0, i1, i2, i3, i4, i5, i6, i7 = _iv(z)
        c0, c1, c2, c3, c4, c5, c6, c7 = _compress(
            i0, i1, i2, i3, i4, i5, i6, i7,
            l0, l1, l2, l3, l4, l5, l6, l7, r0, r1, r2, r3, r4, r5, r6, r7,
            z, 4 | (8 if SUBS == 1 and level == LEVELS - 1 else 0),
        )  # fmt: skip
    o = out + pid.to(tl.int64) * 8 + tl.arange(0, 1)
    tl.store(o + 0, c0.to(tl.int32, bitcast=True))
    tl.store(o + 1, c1.to(tl.int32, bitcast=True))
    tl.store(o + 2, c2.to(tl.int32, bitcast=True))
    tl.store(o + 3, c3.to(tl.int32, bitcast=True))
    tl.store(o + 4, c4.to(tl.int32, bitcast=True))
    tl.store(o + 5, c5.to(tl.int32, bitcast=True))
    tl.store(o + 6, c6.to(tl.int32, bitcast=True))
    tl.store(o + 7, c7.to(tl.int32, bitcast=True))


# ``n`` changes with every file size: not specialised, so the variants warm_up compiled serve.
@triton.jit(do_not_specialize=["n"])
def _parent_kernel(src, dst, n, IS_ROOT: tl.constexpr, BLOCK: tl.constexpr):
    """One tree level: parent j of children 2j and 2j+1 (int32 [2n, 8] -> [n, 8])."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = j < n
    s = src + j.to(tl.int64) * 16
    zero = (j * 0).to(tl.uint32)
    i0, i1, i2, i3, i4, i5, i6, i7 = _iv(zero)
    c0, c1, c2, c3, c4, c5, c6, c7 = _compress(
        i0, i1, i2, i3, i4, i5, i6, i7,
        _masked(s, 0, mask), _masked(s, 1, mask), _masked(s, 2, mask), _masked(s, 3, mask),
        _masked(s, 4, mask), _masked(s, 5, mask), _masked(s, 6, mask), _masked(s, 7, mask),
        _masked(s, 8, mask), _masked(s, 9, mask), _masked(s, 10, mask), _masked(s, 11, mask),
        _masked(s, 12, mask), _masked(s, 13, mask), _masked(s, 14, mask), _masked(s, 15, mask),
        zero, 4 | (8 if IS_ROOT else 0),
    )  # fmt: skip
    d = dst + j.to(tl.int64) * 8
    tl.store(d + 0, c0.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 1, c1.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 2, c2.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 3, c3.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 4, c4.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 5, c5.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 6, c6.to(tl.int32, bitcast=True), mask=mask)
    tl.store(d + 7, c7.to(tl.int32, bitcast=True), mask=mask)


@triton.jit
def _masked(base, i: tl.constexpr, mask):
    return tl.load(base + i, mask=mask, other=0).to(tl.uint32, bitcast=True)


class DeviceDigests:
    """The digests of one file's whole chunks, computed block by block on ``device``."""

    def __init__(self, file: Any, device: Any) -> None:
        import torch

        if not supported(file.chunk_bytes):
            raise ValueError(f"chunk_bytes {file.chunk_bytes} cannot be hashed on the device")
        self.file = file
        self.chunk = file.chunk_bytes
        self.whole = file.size // self.chunk  # chunks hashed here; a shorter last one on the host
        self.subs = self.chunk // (LEAVES * KIB)
        rows = max(1, self.whole * self.subs)
        self.subtrees = torch.empty((rows, 8), dtype=torch.int32, device=device)
        raw = bytes.fromhex("".join(file.chunks[: self.whole]))
        self.expected = (
            torch.frombuffer(bytearray(raw), dtype=torch.int32).view(-1, 8).to(device)
            if raw
            else None
        )

    def hash_block(self, staged: Any, start: int, end: int) -> None:
        """Launch the leaves of the whole chunks of file bytes [start, end) held by ``staged``
        (a device uint8 tensor, ``start`` a multiple of chunk_bytes) on the current stream."""
        import torch

        first = start // self.chunk
        last = min(end // self.chunk, self.whole)
        if last <= first:
            return
        words = staged[: (last - first) * self.chunk].view(dtype=torch.int32)
        out = self.subtrees[first * self.subs : last * self.subs]
        grid = ((last - first) * self.subs,)
        _leaf_kernel[grid](words, out, SUBS=self.subs, LEAVES=LEAVES, LEVELS=_LEVELS, num_warps=2)

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
            block = 128
            _parent_kernel[(triton.cdiv(n, block),)](
                level, parents, n, IS_ROOT=n == self.whole, BLOCK=block, num_warps=4
            )
            level = parents
        bad = (level != self.expected).any(dim=1).nonzero().flatten()
        return [int(i) for i in bad.tolist()]


def warm_up(device: Any, chunk_bytes: int) -> None:
    """Compile the kernels for ``chunk_bytes`` once (Triton also caches them on disk) before
    threads launch them."""
    import torch

    from app.client.layout import FileLayout

    chunk = chunk_bytes
    data = torch.zeros(chunk, dtype=torch.uint8, device=device)
    probe = FileLayout("warm-up", chunk, "", 1, False, chunk, ("00" * 32,), ())
    digests = DeviceDigests(probe, device)
    digests.hash_block(data, 0, chunk)
    digests.mismatches()
