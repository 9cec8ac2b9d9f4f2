"""Inspect, verify and load tensorizer files, including ones produced outside the registry.

Everything goes through `tensorizer.TensorDeserializer`. Two things its public API lacks are
taken from it directly and pinned by tests: the per-tensor index (`_metadata`: dtype, shape and
offsets without reading data) and reading the index of an encrypted file without its key, which
tensorizer refuses at construction even though the index is stored in the clear. For the
latter the file is opened with a throwaway key: the index is read, no data is decrypted.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from tensorizer import TensorDeserializer

VLLM_MARKER = ".vllm_tensorized_marker"
# verify_tensors reads this much tensor data per pass, so memory stays bounded for any file.
VERIFY_BATCH_BYTES = 256 << 20


class ReadableStream(Protocol):
    """A seekable binary stream holding a tensorizer file from offset 0."""

    def read(self, size: int = ..., /) -> bytes | None: ...

    def seek(self, offset: int, whence: int = ..., /) -> int: ...

    def tell(self) -> int: ...


Source = str | os.PathLike[str] | ReadableStream


class TensorFileError(Exception):
    """A tensorizer file is unreadable or fails verification.

    Codes: ``not_found``, ``not_tensorizer``, ``corrupt``, ``truncated``, ``hash_mismatch``,
    ``encryption_key_required`` (encrypted file, no key), ``not_encrypted`` (key given for a
    plain file), ``invalid_key`` (not 32 bytes), ``decryption_failed`` (wrong key, or encrypted
    data altered).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    kind: str


@dataclass(frozen=True)
class TensorFileInfo:
    tensors: tuple[TensorInfo, ...]
    total_bytes: int
    has_vllm_marker: bool
    encrypted: bool

    @property
    def count(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def dtypes(self) -> list[str]:
        return sorted({t.dtype for t in self.tensors})


class _BorrowedStream(io.RawIOBase):
    """A caller's stream lent to tensorizer, which closes what it reads; this does not."""

    def __init__(self, stream: ReadableStream) -> None:
        super().__init__()
        self._stream = stream

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        # tensorizer does not retry short reads, so fill the buffer unless the stream ends.
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < view.nbytes:
            data = self._stream.read(view.nbytes - filled)
            if not data:
                break
            view[filled : filled + len(data)] = data
            filled += len(data)
        return filled

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._stream.seek(offset, whence)
        return self._stream.tell() if position is None else position

    def tell(self) -> int:
        return self._stream.tell()


def _file_size(source: Source) -> int:
    if isinstance(source, str | os.PathLike):
        try:
            return Path(source).stat().st_size
        except OSError as exc:
            raise TensorFileError(
                "not_found", f"cannot open {Path(source).name}: {exc.strerror}"
            ) from None
    return int(source.seek(0, io.SEEK_END))


def _new_reader(source: Source) -> Any:
    """A fresh reader at offset 0 for one deserializer, which closes it when done. Paths are
    opened here (tensorizer can reopen them for parallel reads); caller streams are borrowed."""
    if isinstance(source, str | os.PathLike):
        try:
            return Path(source).open("rb")
        except OSError as exc:
            raise TensorFileError(
                "not_found", f"cannot open {Path(source).name}: {exc.strerror}"
            ) from None
    source.seek(0)
    return _BorrowedStream(source)


def _open(source: Source, encryption_key: bytes | None, **kwargs: Any) -> TensorDeserializer:
    """A lazy deserializer: the header and index are read and checked, no tensor data yet."""
    from tensorizer import CryptographyError, DecryptionParams, TensorDeserializer
    from tensorizer.serialization import TENSORIZER_MAGIC

    if encryption_key is not None and len(encryption_key) != 32:
        raise TensorFileError("invalid_key", "a tensorizer key is exactly 32 bytes")
    reader = _new_reader(source)
    if isinstance(reader, _BorrowedStream):
        kwargs["num_readers"] = 1  # a borrowed stream cannot be reopened for parallel reads
    try:
        if reader.read(len(TENSORIZER_MAGIC)) != TENSORIZER_MAGIC:
            raise TensorFileError("not_tensorizer", "not a tensorizer file (bad magic bytes)")
        reader.seek(0)
        encryption = None if encryption_key is None else DecryptionParams.from_key(encryption_key)
        return TensorDeserializer(
            reader,
            encryption=encryption,
            lazy_load=True,
            device=kwargs.pop("device", "cpu"),
            **kwargs,
        )
    except CryptographyError:
        reader.close()
        if encryption_key is None:
            raise TensorFileError(
                "encryption_key_required", "the file is encrypted; its key is needed"
            ) from None
        raise TensorFileError(
            "not_encrypted", "a key was given but the file is not encrypted"
        ) from None
    except TensorFileError:
        reader.close()
        raise
    except Exception as exc:
        reader.close()
        raise TensorFileError("corrupt", f"cannot read the tensorizer header: {exc}") from None


def _entries(deserializer: TensorDeserializer) -> dict[Any, Any]:
    entries = getattr(deserializer, "_metadata", None)
    if not isinstance(entries, dict):
        raise RuntimeError("this tensorizer version no longer exposes its tensor index")
    return entries


def _dtype_name(stored: str) -> str:
    """`<f2` → float16; opaque `<V2\\0torch.bfloat16` → bfloat16."""
    import numpy
    import torch

    numpy_dtype, _, torch_name = stored.partition("\0")
    if torch_name:
        return torch_name.removeprefix("torch.")
    try:
        return str(torch.from_numpy(numpy.empty(0, dtype=numpy_dtype)).dtype).removeprefix("torch.")
    except (TypeError, ValueError):
        return numpy_dtype


def _check_length(entries: dict[Any, Any], size: int) -> None:
    # Every entry records where its data ends; tensorizer itself would read short silently.
    expected = max((e.data_offset + e.data_length for e in entries.values()), default=0)
    if size < expected:
        raise TensorFileError(
            "truncated", f"file has {size:,} bytes but its index needs {expected:,}"
        )


def inspect_tensors(source: Source, *, encryption_key: bytes | None = None) -> TensorFileInfo:
    """Names, dtypes, shapes and sizes from the index alone; no tensor data is read and no key
    is needed, even for encrypted files (the index is stored in the clear)."""
    from tensorizer.serialization import TensorType

    size = _file_size(source)
    encrypted = False
    try:
        deserializer = _open(source, None)
    except TensorFileError as exc:
        if exc.code != "encryption_key_required":
            raise
        encrypted = True
        # Any 32-byte key opens the index; it would only be used to decrypt data.
        deserializer = _open(source, encryption_key or bytes(32))
    with contextlib.closing(deserializer):
        entries = _entries(deserializer)
        _check_length(entries, size)
        kinds = {TensorType.PARAM: "param", TensorType.BUFFER: "buffer"}
        tensors = tuple(
            TensorInfo(
                name=path.normalize_(),
                dtype=_dtype_name(entry.dtype),
                shape=tuple(int(d) for d in entry.shape),
                nbytes=int(entry.deserialized_length),
                kind=kinds.get(entry.type, "state_dict"),
            )
            for path, entry in entries.items()
        )
    names = {t.name for t in tensors}
    return TensorFileInfo(
        tensors=tensors,
        total_bytes=sum(t.nbytes for t in tensors),
        has_vllm_marker=VLLM_MARKER in names,
        encrypted=encrypted,
    )


def _data_error(exc: Exception, encryption_key: bytes | None) -> TensorFileError:
    from tensorizer import CryptographyError
    from tensorizer.serialization import HashMismatchError

    if isinstance(exc, TensorFileError):
        return exc
    if isinstance(exc, HashMismatchError):
        return TensorFileError("hash_mismatch", str(exc))
    if isinstance(exc, CryptographyError):
        if encryption_key is None:
            return TensorFileError("encryption_key_required", "the file is encrypted")
        return TensorFileError(
            "decryption_failed", "decryption failed: wrong key, or the encrypted data was altered"
        )
    return TensorFileError("corrupt", f"{type(exc).__name__}: {exc}")


def verify_tensors(
    source: Source,
    *,
    encryption_key: bytes | None = None,
    num_readers: int | None = None,
    batch_bytes: int = VERIFY_BATCH_BYTES,
) -> None:
    """Read every tensor and check tensorizer's stored CRC32/SHA-256 of header and data (and,
    for encrypted files, each chunk's Poly1305 MAC). Raises `TensorFileError` on any mismatch,
    truncation, corruption or wrong key. Reads in batches of about `batch_bytes`, so memory
    stays bounded whatever the file size."""
    size = _file_size(source)
    with contextlib.closing(_open(source, encryption_key)) as index:
        entries = _entries(index)
        _check_length(entries, size)
        batches: list[set[str]] = [set()]
        batch_size = 0
        for path, entry in entries.items():
            if batches[-1] and batch_size + entry.data_length > batch_bytes:
                batches.append(set())
                batch_size = 0
            batches[-1].add(path.normalize_())
            batch_size += entry.data_length
    for batch in batches:
        # A deserializer keeps what it has read until closed, hence one per batch.
        deserializer = _open(
            source, encryption_key, num_readers=num_readers, filter_func=batch.__contains__
        )
        with contextlib.closing(deserializer):
            try:
                for _ in deserializer.read_tensors(verify_hash=True):
                    pass
            except Exception as exc:
                raise _data_error(exc, encryption_key) from None


def load_state_dict(
    source: Source,
    *,
    device: str = "cpu",
    encryption_key: bytes | None = None,
    num_readers: int | None = None,
    verify_hash: bool = False,
) -> dict[str, torch.Tensor]:
    """All tensors of a file as plain tensors keyed by their stored names."""
    size = _file_size(source)
    deserializer = _open(source, encryption_key, device=device, num_readers=num_readers)
    with contextlib.closing(deserializer):
        _check_length(_entries(deserializer), size)
        try:
            return {
                name: tensor.detach()
                for _, _, name, tensor in deserializer.read_tensors(verify_hash=verify_hash)
            }
        except Exception as exc:
            raise _data_error(exc, encryption_key) from None
