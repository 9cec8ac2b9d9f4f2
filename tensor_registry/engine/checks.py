"""Verification: every chunk's BLAKE3 against the layout manifest, and what a failure says.

A digest mismatch, a short read or a range answered with other bytes raises ``ChunkMismatch``
naming the tensors in the bad chunk (the file offsets they cover, from the manifest), so the
load returns nothing half-loaded and the message says which weights were affected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tensor_registry.api.client import ChecksumMismatch
from tensor_registry.engine.sources import WrongRange
from tensor_registry.formats import layout as layouts
from tensor_registry.formats.layout import FileLayout

T = TypeVar("T")


class ChunkMismatch(ChecksumMismatch):
    """A chunk's bytes are not the ones the layout manifest recorded (or never arrived)."""

    code = "chunk_mismatch"

    def __init__(self, detail: str, *, tensors: list[str]) -> None:
        super().__init__(detail, status=None)
        self.tensors = tensors


def verify_block(file: FileLayout, start: int, data: memoryview) -> None:
    """Check every chunk of ``data`` (file bytes from ``start``, a multiple of chunk_bytes)."""
    chunk = file.chunk_bytes
    for offset in range(0, len(data), chunk):
        index = (start + offset) // chunk
        piece = data[offset : offset + chunk]
        if layouts.chunk_digest(piece) != file.chunks[index]:
            raise mismatch_error(file, index)


class ChunksAsTheyLand:
    """Checks the chunks of a range from ``start`` (a chunk boundary) as its bytes land:
    ``__call__(file offset, bytes)`` takes the pieces in order, of any size, hashes each at
    once (while it is still in the CPU's cache) and compares a chunk's digest as soon as its
    last byte is in. ``checked``: where the chunks compared so far end."""

    def __init__(self, file: FileLayout, start: int) -> None:
        if start % file.chunk_bytes:
            raise ValueError(f"a range checked as it lands starts at a chunk, not at {start}")
        self.file = file
        self.index = start // file.chunk_bytes
        self.at = self.checked = start
        self.end = file.chunk_range(self.index)[1]
        self.hasher = layouts.chunk_hasher()

    def __call__(self, offset: int, data: memoryview) -> None:
        if offset != self.at or offset + len(data) > self.file.size:
            raise ValueError(f"{len(data)} bytes at {offset}: expected the piece at {self.at}")
        while data:
            take = min(len(data), self.end - self.at)
            self.hasher.update(data[:take])
            self.at += take
            data = data[take:]
            if self.at == self.end:
                if self.hasher.hexdigest() != self.file.chunks[self.index]:
                    raise mismatch_error(self.file, self.index)
                self.checked = self.at
                self.index += 1
                self.end = min(self.file.size, self.at + self.file.chunk_bytes)
                self.hasher = layouts.chunk_hasher()


def mismatch_error(file: FileLayout, index: int) -> ChunkMismatch:
    a, b = file.chunk_range(index)
    return ChunkMismatch(
        f"{file.describe(a, b)}: bytes differ from the layout manifest's BLAKE3 digest "
        "(storage corruption or a proxy answering with other bytes); nothing was loaded",
        tensors=file.tensors_in(a, b),
    )


def short_read_error(file: FileLayout, start: int, want: int, got: int) -> ChunkMismatch:
    a, b = start + got, start + want
    return ChunkMismatch(
        f"{file.describe(a, b)}: only {got} of {want} bytes arrived (truncated file?); "
        "nothing was loaded",
        tensors=file.tensors_in(a, b),
    )


def raise_short(file: FileLayout, start: int, data: memoryview, got: int, verify: bool) -> None:
    """A short read: bytes that did arrive but differ are the better diagnosis, so the whole
    chunks among them are checked first."""
    if verify:
        whole = got // file.chunk_bytes * file.chunk_bytes
        verify_block(file, start, data[:whole])
    raise short_read_error(file, start, len(data), got)


def checked_reads(file: FileLayout, read: Callable[..., T]) -> Callable[..., T]:
    """``read`` (a range read, or opening a span) with a range the server answered wrongly
    turned into a ``ChunkMismatch`` naming the tensors it held."""

    def read_into(offset: int, buffer: Any, *more: Any) -> T:
        try:
            return read(offset, buffer, *more)
        except WrongRange as exc:
            raise ChunkMismatch(
                f"{file.describe(exc.start, exc.end)}: the server answered the range with "
                f"{exc.what}; nothing was loaded",
                tensors=file.tensors_in(exc.start, exc.end),
            ) from None

    return read_into
