"""What the node writes beside a pulled artifact (tensorizer.key, .tensor-registry.json, ...) is
ignored by this package's directory verifier as exactly those files, never as a directory by
that name: files planted under `tensorizer.key/` are unsigned files (issue 33 §5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensor_registry.formats import model_signature
from tensor_registry.formats.model_signature import IGNORED_PATHS, KEYFILE_NAME, PULL_RECORD


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_the_node_files_are_ignored_as_files(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"config.json": b"{}", KEYFILE_NAME: b"k" * 32, PULL_RECORD: b"{}", ".git/HEAD": b"x"},
    )
    assert model_signature.directory_files(root, IGNORED_PATHS) == ["config.json"]


@pytest.mark.parametrize("name", [KEYFILE_NAME, PULL_RECORD, model_signature.SIGNATURE_FILE])
def test_a_directory_by_a_node_files_name_is_walked(tmp_path: Path, name: str) -> None:
    root = _tree(
        tmp_path, {"config.json": b"{}", f"{name}/evil.py": b"import os", f"{name}/a/b": b""}
    )
    assert model_signature.directory_files(root, IGNORED_PATHS) == sorted(
        ["config.json", f"{name}/a/b", f"{name}/evil.py"]
    )
