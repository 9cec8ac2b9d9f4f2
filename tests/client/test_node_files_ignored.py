"""What the node writes into a pulled or exported folder lives in one declared directory of node
state, `.cache/tensor-registry/` (pull.json, tensorizer.key, keys.json), and this package's
directory verifier ignores exactly those regular files there: any other file under it, or a
directory by one of those names, is an unsigned file. The names a client before it wrote at the
top level (tensorizer.key, .tensor-registry.json, keys.json) are ignored as regular files only:
files planted under a `tensorizer.key/` directory are unsigned files (issue 33 §5). The signed
ignore_paths name directories only (the reference verifier ignores a name as a prefix)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from tensor_registry.beneath import write_beneath
from tensor_registry.formats import model_signature
from tensor_registry.formats.model_signature import (
    HF_LOCAL_DIR_CACHE,
    KEYFILE_PATH,
    KEYS_FILE,
    LEGACY_NODE_FILES,
    NODE_STATE_DIR,
    PULL_RECORD,
    SIGNATURE_FILE,
)
from tensor_registry.formats.paths import UnsafePath
from tensor_registry.formats.signed_manifest import ManifestError

OLD_NAMES = sorted(LEGACY_NODE_FILES.values())


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_the_node_state_directory_is_where_the_node_files_live() -> None:
    assert NODE_STATE_DIR == ".cache/tensor-registry"
    assert (PULL_RECORD, KEYFILE_PATH, KEYS_FILE) == (
        ".cache/tensor-registry/pull.json",
        ".cache/tensor-registry/tensorizer.key",
        ".cache/tensor-registry/keys.json",
    )
    assert OLD_NAMES == [".tensor-registry.json", "keys.json", "tensorizer.key"]


def test_the_signed_ignore_paths_name_no_loose_file() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    data = model_signature.sign(key, [("config.json", "ab" * 32)], name="acme/x:1")
    statement = json.loads(base64.b64decode(json.loads(data)["dsseEnvelope"]["payload"]))
    ignore = statement["predicate"]["serialization"]["ignore_paths"]
    assert ignore == [
        *model_signature.GIT_PATHS,
        SIGNATURE_FILE,
        HF_LOCAL_DIR_CACHE,
        NODE_STATE_DIR,
    ]
    assert not set(OLD_NAMES) & set(ignore)
    # An artifact file the reference verifier would ignore cannot be signed.
    for path in (f"{NODE_STATE_DIR}/pull.json", f"{HF_LOCAL_DIR_CACHE}/x", ".git/HEAD"):
        with pytest.raises(ValueError, match="would be ignored"):
            model_signature.statement([(path, "ab" * 32)], name="acme/x:1")
    # The old loose names are ordinary file names now: signed like any other.
    model_signature.statement([("keys.json", "ab" * 32)], name="acme/x:1")


def test_the_node_files_are_ignored_as_files(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "config.json": b"{}",
            SIGNATURE_FILE: b"{}",
            PULL_RECORD: b"{}",
            KEYFILE_PATH: b"k" * 32,
            KEYS_FILE: b"{}",
            **dict.fromkeys(OLD_NAMES, b"old pull"),
            ".git/HEAD": b"x",
            f"{HF_LOCAL_DIR_CACHE}/download/config.json.metadata": b"x",
        },
    )
    assert model_signature.directory_files(root) == ["config.json"]


@pytest.mark.parametrize("name", [PULL_RECORD, KEYFILE_PATH, KEYS_FILE, *OLD_NAMES, SIGNATURE_FILE])
def test_a_directory_by_a_node_files_name_is_walked(tmp_path: Path, name: str) -> None:
    root = _tree(
        tmp_path, {"config.json": b"{}", f"{name}/evil.py": b"import os", f"{name}/a/b": b""}
    )
    assert model_signature.directory_files(root) == sorted(
        ["config.json", f"{name}/a/b", f"{name}/evil.py"]
    )


def test_any_other_file_in_the_node_state_directory_is_unsigned(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "config.json": b"{}",
            PULL_RECORD: b"{}",
            f"{NODE_STATE_DIR}/evil.py": b"import os",
            f"{NODE_STATE_DIR}/sub/model.safetensors": b"x",
            f"{NODE_STATE_DIR}/{SIGNATURE_FILE}": b"{}",
            ".cache/other.bin": b"x",
        },
    )
    assert model_signature.directory_files(root) == [
        ".cache/other.bin",
        f"{NODE_STATE_DIR}/evil.py",
        f"{NODE_STATE_DIR}/{SIGNATURE_FILE}",
        f"{NODE_STATE_DIR}/sub/model.safetensors",
        "config.json",
    ]


@pytest.mark.parametrize("name", [KEYFILE_PATH, "tensorizer.key", NODE_STATE_DIR])
def test_a_link_by_a_node_files_name_is_refused(tmp_path: Path, name: str) -> None:
    root = _tree(tmp_path / "dir", {"config.json": b"{}"})
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(tmp_path, root / name)
    with pytest.raises(ManifestError, match="symbolic link"):
        model_signature.directory_files(root)


def test_node_file_reads_the_new_place_then_an_old_pulls_file_never_a_directory(
    tmp_path: Path,
) -> None:
    assert model_signature.node_file(tmp_path, PULL_RECORD) is None
    (tmp_path / ".tensor-registry.json").mkdir()  # a directory by the old name: not a record
    (tmp_path / ".tensor-registry.json" / "x").write_text("{}")
    assert model_signature.node_file(tmp_path, PULL_RECORD) is None
    old = _tree(tmp_path / "old", {".tensor-registry.json": b"{}"})
    assert model_signature.node_file(old, PULL_RECORD) == old / ".tensor-registry.json"
    _tree(old, {PULL_RECORD: b"{}"})
    assert model_signature.node_file(old, PULL_RECORD) == old / PULL_RECORD
    model_signature.drop_legacy_node_file(old, PULL_RECORD)
    assert not (old / ".tensor-registry.json").exists()
    # A directory by an old name is left alone (it is not the node's).
    model_signature.drop_legacy_node_file(tmp_path, PULL_RECORD)
    assert (tmp_path / ".tensor-registry.json" / "x").is_file()


def test_the_state_directory_is_created_without_following_a_link(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    written = write_beneath(dest, KEYFILE_PATH, b"k" * 32, mode=0o600, own=True)
    assert written == dest / KEYFILE_PATH and (written.stat().st_mode & 0o777) == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(elsewhere, linked / ".cache")
    with pytest.raises(UnsafePath, match="link"):
        write_beneath(linked, PULL_RECORD, b"{}", own=True)
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(UnsafePath):
        write_beneath(dest, ".cache/../x", b"{}", own=True)
