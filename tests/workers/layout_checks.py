"""Check a layout manifest against tensorizer's own reader (shared by the pipeline and
backfill tests)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from tensor_registry.formats import layout
from tensor_registry.formats.layout import FileLayout


def assert_layout_matches(path: Path, entry: FileLayout) -> None:
    from tensorizer import DecryptionParams, TensorDeserializer

    data = path.read_bytes()
    assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    for index, digest in enumerate(entry.chunks):
        a, b = entry.chunk_range(index)
        assert layout.chunk_digest(data[a:b]) == digest, index
    # Any key opens an encrypted file's index (it is stored in the clear); data stays unread.
    encryption = DecryptionParams.from_key(os.urandom(32)) if entry.encrypted else None
    with TensorDeserializer(
        str(path), device="cpu", lazy_load=True, encryption=encryption
    ) as reader:
        index = {name.normalize_(): e for name, e in reader._metadata.items()}
        ours = {t.name: t for t in entry.tensors}
        assert set(ours) == set(index)
        for name, t in ours.items():
            found = index[name]
            assert (t.data_offset, t.data_length) == (found.data_offset, found.data_length), name
            assert t.shape == tuple(found.shape), name
        if entry.encrypted:
            return
        for name, tensor in reader.items():
            t = ours[name]
            assert t.dtype == str(tensor.dtype).removeprefix("torch."), name
            raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert data[t.data_offset : t.data_offset + t.data_length] == raw, name
