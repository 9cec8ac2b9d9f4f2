"""The layout manifest of an artifact: where every tensor's bytes lie, and a digest per chunk.

A loader that has the manifest needs no tensorizer parsing: for every weights file it names
each tensor (name, dtype, shape, data offset and length) and carries a BLAKE3 digest of every
``chunk_bytes`` slice of the file, so bytes can be checked as they arrive, in any order, on
many cores, and a bad chunk names the tensors it touches. The per-file sha256 stays the
identity of the file (the node cache keys on it); the chunk digests are what loads verify.

Format facts taken from reading tensorizer 2.12's ``serialization.py`` (no code copied):

- a file starts with the magic ``|TZR|``, a u32 data version, 32 bytes of feature flags
  (bit 0 encrypted, bit 1 versioned index entries), u64 tensor size, 8 unused bytes and a
  u64 tensor count (all little-endian);
- then the index: a u64 length and that many bytes of entries. An entry is [u32 version if
  versioned], u16 name length + name (UTF-8, or ``\\x1e`` + a JSON array for nested paths),
  u8 tensor type (0 param, 1 buffer, 2 state dict), u8 dtype length + dtype (a numpy dtype
  string, or ``<V2\\0torch.bfloat16`` for dtypes numpy lacks), u8 rank + rank * u32 (u64 for
  entry version ≥ 5), then u64 header offset, u64 data offset, u64 data length;
- a tensor's bytes are ``[data_offset, data_offset + data_length)``, stored raw (C order,
  little-endian) unless the file is encrypted (version 3, or the encrypted flag), where they
  are ciphertext. ``data_length`` 0 is a meta tensor: zeros of its shape.

Why BLAKE3 (measured; bench/RESULTS.md): it is cryptographic (a proxy or a storage
fault cannot forge a chunk), runs 5.8 GB/s per core on the 2-core VM and scales with threads
(the binding releases the GIL), so 16 cores hash faster than they can copy out of the page
cache; sha256 runs 1.5 GB/s per core, xxh3 is faster still but not cryptographic.

Torch-free: the client, the worker and the verify job all import this module.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

LAYOUT_FILE = "tensors.layout.json"
LAYOUT_FORMAT = "tensor-registry-layout"
LAYOUT_VERSION = 1
DIGEST_ALGORITHM = "blake3"
CHUNK_BYTES = 8 << 20
MAGIC = b"|TZR|"
ENCRYPTION_DATA_VERSION = 3
FLAGS_DATA_VERSION = 4
_FLAG_ENCRYPTED = 1
_FLAG_VERSIONED = 2
_FILE_HEADER = struct.Struct("<I32sQ8xQ")
_LOCATION = struct.Struct("<QQQ")
# Bounds for what a manifest or a header may claim (a manifest is input to the client).
MAX_TENSORS = 1 << 20
MAX_INDEX_BYTES = 1 << 30
MAX_NAME_BYTES = 1 << 16
MAX_RANK = 255
_READ_BLOCK = 16 << 20

# tensorizer stores numpy dtype strings; torch-only dtypes travel as "<Vn\0torch.NAME".
_NUMPY_DTYPES = {
    "<f2": "float16",
    "<f4": "float32",
    "<f8": "float64",
    "<c8": "complex64",
    "<c16": "complex128",
    "|i1": "int8",
    "<i2": "int16",
    "<i4": "int32",
    "<i8": "int64",
    "|u1": "uint8",
    "<u2": "uint16",
    "<u4": "uint32",
    "<u8": "uint64",
    "|b1": "bool",
}
ITEM_SIZES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
KINDS = {0: "param", 1: "buffer", 2: "state_dict"}


class LayoutError(ValueError):
    """A tensorizer header or a layout manifest that cannot be used."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class TensorLayout:
    name: str
    dtype: str  # torch dtype name: bfloat16, float16, …
    shape: tuple[int, ...]
    data_offset: int
    data_length: int  # 0: a meta tensor (zeros)
    kind: str = "param"
    header_offset: int = 0

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * ITEM_SIZES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "kind": self.kind,
            "header_offset": self.header_offset,
            "data_offset": self.data_offset,
            "data_length": self.data_length,
        }


@dataclass(frozen=True)
class TensorizerHeader:
    data_version: int
    encrypted: bool
    index_end: int  # first byte after the index
    tensors: tuple[TensorLayout, ...]


@dataclass(frozen=True)
class FileLayout:
    path: str
    size: int
    sha256: str
    data_version: int
    encrypted: bool
    chunk_bytes: int
    chunks: tuple[str, ...]  # hex BLAKE3 of [i * chunk_bytes, (i + 1) * chunk_bytes)
    tensors: tuple[TensorLayout, ...]

    def chunk_range(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_bytes
        return start, min(self.size, start + self.chunk_bytes)

    def tensors_in(self, start: int, end: int) -> list[str]:
        """Names of the tensors whose bytes overlap [start, end)."""
        return [
            t.name
            for t in self.tensors
            if t.data_length and t.data_offset < end and start < t.data_offset + t.data_length
        ]

    def describe(self, start: int, end: int) -> str:
        names = self.tensors_in(start, end)
        if not names:
            return f"{self.path} bytes {start}-{end - 1} (tensorizer header/index)"
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        return f"{self.path} bytes {start}-{end - 1} (tensor {shown})"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "tensorizer_data_version": self.data_version,
            "encrypted": self.encrypted,
            "digest": {
                "algorithm": DIGEST_ALGORITHM,
                "chunk_bytes": self.chunk_bytes,
                "chunks": list(self.chunks),
            },
            "tensors": [t.to_json() for t in self.tensors],
        }


@dataclass(frozen=True)
class ArtifactLayout:
    files: tuple[FileLayout, ...] = field(default_factory=tuple)

    def file(self, path: str) -> FileLayout:
        for f in self.files:
            if f.path == path:
                return f
        raise LayoutError("layout_missing_file", f"the layout manifest has no entry for {path}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LAYOUT_FORMAT,
            "version": LAYOUT_VERSION,
            "files": [f.to_json() for f in self.files],
        }

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------
# Parsing tensorizer's header


def dtype_name(stored: str) -> str:
    numpy_part, sep, torch_part = stored.partition("\0")
    name = torch_part.removeprefix("torch.") if sep else _NUMPY_DTYPES.get(numpy_part, "")
    if name not in ITEM_SIZES:
        raise LayoutError("unsupported_dtype", f"tensor dtype {stored!r} is not supported")
    return name


def _tensor_name(raw: bytes) -> str:
    if raw[:1] == b"\x1e":
        # A nested path (a JSON array of keys and indices): joined with dots, as state dicts are.
        try:
            parts = json.loads(raw[1:])
        except ValueError as exc:
            raise LayoutError("corrupt", f"bad nested tensor name: {exc}") from None
        if not isinstance(parts, list):
            raise LayoutError("corrupt", "bad nested tensor name")
        return ".".join(str(p) for p in parts)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise LayoutError("corrupt", "a tensor name is not UTF-8") from None


def parse_header(read_at: Callable[[int, int], bytes], size: int) -> TensorizerHeader:
    """Parse a tensorizer file's header and index; ``read_at(offset, length)`` reads bytes."""
    head = read_at(0, len(MAGIC) + _FILE_HEADER.size + 8)
    if head[: len(MAGIC)] != MAGIC:
        raise LayoutError("not_tensorizer", "not a tensorizer file (bad magic bytes)")
    if len(head) < len(MAGIC) + _FILE_HEADER.size + 8:
        raise LayoutError("truncated", "the file ends inside its tensorizer header")
    version, flag_bytes, _tensor_size, count = _FILE_HEADER.unpack_from(head, len(MAGIC))
    flags = int.from_bytes(flag_bytes, "little") if version >= FLAGS_DATA_VERSION else 0
    encrypted = version == ENCRYPTION_DATA_VERSION or bool(flags & _FLAG_ENCRYPTED)
    versioned = bool(flags & _FLAG_VERSIONED)
    (index_len,) = struct.unpack_from("<Q", head, len(MAGIC) + _FILE_HEADER.size)
    index_start = len(head)
    if count > MAX_TENSORS or index_len > MAX_INDEX_BYTES or index_start + index_len > size:
        raise LayoutError(
            "corrupt", f"implausible tensorizer index: {count} tensors in {index_len} bytes"
        )
    index = read_at(index_start, index_len)
    if len(index) < index_len:
        raise LayoutError("truncated", "the file ends inside its tensor index")
    tensors: list[TensorLayout] = []
    pos = 0
    try:
        for _ in range(count):
            long_shape = False
            if versioned:
                (entry_version,) = struct.unpack_from("<I", index, pos)
                pos += 4
                long_shape = entry_version >= 5
            (name_len,) = struct.unpack_from("<H", index, pos)
            pos += 2
            name = _tensor_name(bytes(index[pos : pos + name_len]))
            pos += name_len
            kind = KINDS.get(index[pos], "state_dict")
            dtype_len = index[pos + 1]
            pos += 2
            stored_dtype = bytes(index[pos : pos + dtype_len]).decode("utf-8")
            pos += dtype_len
            rank = index[pos]
            pos += 1
            width = "Q" if long_shape else "I"
            shape = struct.unpack_from(f"<{rank}{width}", index, pos)
            pos += rank * (8 if long_shape else 4)
            header_offset, data_offset, data_length = _LOCATION.unpack_from(index, pos)
            pos += _LOCATION.size
            tensors.append(
                TensorLayout(
                    name=name,
                    dtype=dtype_name(stored_dtype),
                    shape=tuple(int(d) for d in shape),
                    data_offset=int(data_offset),
                    data_length=int(data_length),
                    kind=kind,
                    header_offset=int(header_offset),
                )
            )
    except (struct.error, IndexError, UnicodeDecodeError):
        raise LayoutError("corrupt", "the tensorizer index is cut short or malformed") from None
    return TensorizerHeader(
        data_version=int(version),
        encrypted=encrypted,
        index_end=index_start + index_len,
        tensors=tuple(tensors),
    )


def check_tensors(tensors: Iterable[TensorLayout], size: int, *, encrypted: bool) -> None:
    """Every tensor's bytes lie inside the file and, unencrypted, are as long as its shape."""
    for t in tensors:
        if t.data_offset + t.data_length > size:
            raise LayoutError(
                "truncated",
                f"tensor {t.name} needs bytes up to {t.data_offset + t.data_length:,}, "
                f"the file has {size:,}",
            )
        if not encrypted and t.data_length and t.data_length != t.nbytes:
            raise LayoutError(
                "corrupt",
                f"tensor {t.name}: {t.data_length} bytes stored, its shape needs {t.nbytes}",
            )


# ---------------------------------------------------------------------------------------------
# Digests


def chunk_digest(data: Any) -> str:
    return str(chunk_hasher(data).hexdigest())


def chunk_hasher(data: Any = b"") -> Any:
    """A chunk digest's hasher, fed piece by piece (``update``); ``hexdigest()`` equals
    ``chunk_digest`` of all the pieces together."""
    import blake3

    return blake3.blake3(data)


def _stream_reader(stream: BinaryIO) -> Callable[[int, memoryview], int]:
    def read_into(offset: int, buffer: memoryview) -> int:
        stream.seek(offset)
        got = 0
        while got < len(buffer):
            n = stream.readinto(buffer[got:])  # type: ignore[attr-defined]
            if not n:
                break
            got += n
        return got

    return read_into


def build_file_layout(
    stream: BinaryIO,
    path: str,
    *,
    size: int,
    sha256: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    threads: int = 4,
) -> FileLayout:
    """The layout of one tensorizer file read from a seekable binary stream. With ``sha256``
    given (the storage sink computed it) the file is read once, for the chunk digests."""
    read_into = _stream_reader(stream)

    def read_at(offset: int, length: int) -> bytes:
        buffer = bytearray(length)
        got = read_into(offset, memoryview(buffer))
        return bytes(buffer[:got])

    header = parse_header(read_at, size)
    check_tensors(header.tensors, size, encrypted=header.encrypted)
    chunks, whole = digest_chunks(read_into, size, chunk_bytes, threads, sha256 is None)
    if sha256 is not None:
        whole = sha256.lower()
    assert whole is not None
    return FileLayout(
        path=path,
        size=size,
        sha256=whole,
        data_version=header.data_version,
        encrypted=header.encrypted,
        chunk_bytes=chunk_bytes,
        chunks=tuple(chunks),
        tensors=header.tensors,
    )


def digest_chunks(
    read_into: Callable[[int, memoryview], int],
    size: int,
    chunk_bytes: int,
    threads: int,
    sha256: bool,
) -> tuple[list[str], str | None]:
    """BLAKE3 of every ``chunk_bytes`` slice of ``size`` bytes read in order by
    ``read_into(offset, buffer)``, hashed on ``threads`` threads (in chunk order); plus the
    sha256 of the whole if asked."""
    whole = hashlib.sha256() if sha256 else None
    digests: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="layout") as pool:
        futures = []
        for start in range(0, size, chunk_bytes):
            length = min(chunk_bytes, size - start)
            buffer = bytearray(length)
            got = read_into(start, memoryview(buffer))
            if got != length:
                raise LayoutError(
                    "truncated", f"read {got} bytes at offset {start}, expected {length}"
                )
            if whole is not None:
                whole.update(buffer)
            futures.append(pool.submit(chunk_digest, buffer))
            # Bound memory: wait for the oldest outstanding chunks (results stay in order).
            outstanding = [f for f in futures[-4 * threads :] if not f.done()]
            if len(outstanding) > 2 * threads:
                outstanding[0].result()
        digests = [f.result() for f in futures]
    return digests, (whole.hexdigest() if whole is not None else None)


# ---------------------------------------------------------------------------------------------
# Reading a manifest back (it arrives over HTTP: everything is checked and bounded)


def _int(value: Any, what: str, *, low: int = 0, high: int = 1 << 62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise LayoutError("bad_layout", f"layout manifest: {what} is not a valid integer")
    return value


def _file_from_json(raw: Any) -> FileLayout:
    if not isinstance(raw, dict):
        raise LayoutError("bad_layout", "layout manifest: a file entry is not an object")
    path, sha256 = raw.get("path"), raw.get("sha256")
    if not isinstance(path, str) or not isinstance(sha256, str) or len(sha256) != 64:
        raise LayoutError("bad_layout", "layout manifest: a file has no path or sha256")
    size = _int(raw.get("size"), f"{path} size")
    digest = raw.get("digest")
    if not isinstance(digest, dict) or digest.get("algorithm") != DIGEST_ALGORITHM:
        raise LayoutError("bad_layout", f"layout manifest: {path} has no {DIGEST_ALGORITHM}")
    chunk_bytes = _int(digest.get("chunk_bytes"), "chunk_bytes", low=4096, high=1 << 30)
    chunks = digest.get("chunks")
    expected = (size + chunk_bytes - 1) // chunk_bytes
    if (
        not isinstance(chunks, list)
        or len(chunks) != expected
        or not all(isinstance(c, str) and len(c) == 64 for c in chunks)
    ):
        raise LayoutError("bad_layout", f"layout manifest: {path} needs {expected} chunk digests")
    entries = raw.get("tensors")
    if not isinstance(entries, list) or len(entries) > MAX_TENSORS:
        raise LayoutError("bad_layout", f"layout manifest: {path} has no tensor list")
    tensors = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise LayoutError("bad_layout", f"layout manifest: {path} has a bad tensor entry")
        shape = entry.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            raise LayoutError("bad_layout", f"layout manifest: {entry['name']} has a bad shape")
        dtype = entry.get("dtype")
        if dtype not in ITEM_SIZES:
            raise LayoutError("bad_layout", f"layout manifest: {entry['name']} dtype {dtype!r}")
        tensors.append(
            TensorLayout(
                name=entry["name"],
                dtype=str(dtype),
                shape=tuple(_int(d, "a dimension") for d in shape),
                data_offset=_int(entry.get("data_offset"), "data_offset"),
                data_length=_int(entry.get("data_length"), "data_length"),
                kind=str(entry.get("kind", "param")),
                header_offset=_int(entry.get("header_offset", 0), "header_offset"),
            )
        )
    encrypted = bool(raw.get("encrypted"))
    check_tensors(tensors, size, encrypted=encrypted)
    return FileLayout(
        path=path,
        size=size,
        sha256=sha256.lower(),
        data_version=_int(raw.get("tensorizer_data_version", 0), "data version"),
        encrypted=encrypted,
        chunk_bytes=chunk_bytes,
        chunks=tuple(c.lower() for c in chunks),
        tensors=tuple(tensors),
    )


def loads(data: bytes | str) -> ArtifactLayout:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise LayoutError("bad_layout", f"layout manifest is not JSON: {exc}") from None
    if (
        not isinstance(raw, dict)
        or raw.get("format") != LAYOUT_FORMAT
        or raw.get("version") != LAYOUT_VERSION
    ):
        raise LayoutError("bad_layout", "not a tensor-registry layout manifest (version 1)")
    files = raw.get("files")
    if not isinstance(files, list):
        raise LayoutError("bad_layout", "layout manifest has no files")
    return ArtifactLayout(files=tuple(_file_from_json(f) for f in files))


def is_weights(path: str) -> bool:
    return path.endswith(".tensors")
