"""The layout manifest against tensorizer's own reader: names, dtypes, shapes and the bytes at
every recorded offset, for hf modules, vLLM-style files with the marker, long names, every
dtype the registry writes, and encrypted files (index only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tensorizer import TensorDeserializer

from harness.artifacts import write_tensors
from tensor_registry.formats import layout
from tensor_registry.formats.layout import LayoutError


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return {
        "model.embed_tokens.weight": torch.randn(300, 17).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 33).to(torch.float16),
        "lm_head.weight": torch.randn(129, 7),
        "ids": torch.arange(11),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        ".vllm_tensorized_marker": torch.zeros(0),
        "x" * 300: torch.ones(5, dtype=torch.int32),
    }


def _layout(path: Path, chunk: int = 4096) -> layout.FileLayout:
    with path.open("rb") as fh:
        return layout.build_file_layout(fh, path.name, size=path.stat().st_size, chunk_bytes=chunk)


def test_manifest_matches_what_tensorizer_reads(tmp_path: Path) -> None:
    path = tmp_path / "model.tensors"
    state = _state()
    write_tensors(path, state)
    manifest = _layout(path)
    data = path.read_bytes()
    assert not manifest.encrypted and manifest.size == len(data)
    import hashlib

    assert manifest.sha256 == hashlib.sha256(data).hexdigest()
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as reader:
        ours = {t.name: t for t in manifest.tensors}
        assert set(ours) == {k.normalize_() for k in reader._metadata} == set(state)
        for name, tensor in reader.items():
            entry = ours[name]
            assert entry.dtype == str(tensor.dtype).removeprefix("torch.")
            assert entry.shape == tuple(tensor.shape)
            stored = data[entry.data_offset : entry.data_offset + entry.data_length]
            assert stored == tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    # Every chunk digest is BLAKE3 of that slice of the file.
    for index, digest in enumerate(manifest.chunks):
        a, b = manifest.chunk_range(index)
        assert layout.chunk_digest(data[a:b]) == digest


def test_manifest_round_trips_and_is_checked_when_read(tmp_path: Path) -> None:
    path = tmp_path / "model.tensors"
    write_tensors(path, _state())
    manifest = layout.ArtifactLayout(files=(_layout(path),))
    assert layout.loads(manifest.dumps()) == manifest
    raw = json.loads(manifest.dumps())
    raw["files"][0]["digest"]["chunks"].pop()
    with pytest.raises(LayoutError, match="chunk digests"):
        layout.loads(json.dumps(raw))
    raw = json.loads(manifest.dumps())
    raw["files"][0]["tensors"][0]["data_offset"] = raw["files"][0]["size"]
    with pytest.raises(LayoutError) as caught:
        layout.loads(json.dumps(raw))
    assert caught.value.code == "truncated"
    with pytest.raises(LayoutError):
        layout.loads(b'{"format": "something-else", "version": 1}')


def test_encrypted_files_have_an_index_but_ciphertext_data(tmp_path: Path) -> None:
    path = tmp_path / "model.tensors"
    state = {"w": torch.randn(64, 64)}
    write_tensors(path, state, key=os.urandom(32))
    manifest = _layout(path)
    assert manifest.encrypted
    (entry,) = manifest.tensors
    assert (entry.name, entry.dtype, entry.shape) == ("w", "float32", (64, 64))
    stored = path.read_bytes()[entry.data_offset : entry.data_offset + 64 * 64 * 4]
    assert stored != state["w"].numpy().tobytes()


def test_truncated_and_foreign_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.tensors"
    write_tensors(path, {"w": torch.randn(256, 256)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(LayoutError) as caught:
        _layout(path)
    assert caught.value.code == "truncated" and "w" in caught.value.message
    path.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(LayoutError) as caught:
        _layout(path)
    assert caught.value.code == "not_tensorizer"
