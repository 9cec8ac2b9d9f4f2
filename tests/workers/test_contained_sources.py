"""file:// registrations never read outside their import root, even when the tree changes under
them: the verify job's listing checks containment, and each file is opened again with
``tensor_registry_server.core.paths.open_contained`` (O_NOFOLLOW at every component), so a file or
directory swapped for
a link between listing and reading is refused, not followed."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tensor_registry_server.artifacts.making.registered_sources import list_source
from tensor_registry_server.core import paths
from tensor_registry_server.jobs.runner import JobFailure
from tensor_registry_server.settings import Settings


@pytest.fixture
def tree(tmp_path: Path) -> SimpleNamespace:
    root = tmp_path / "imports"
    (root / "model" / "sub").mkdir(parents=True)
    (root / "model" / "model.tensors").write_bytes(b"tensors")
    (root / "model" / "sub" / "deep.bin").write_bytes(b"deep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.tensors").write_bytes(b"SECRET")
    (outside / "deep.bin").write_bytes(b"SECRET")
    return SimpleNamespace(root=root, outside=outside)


def _ctx(root: Path) -> Any:
    settings = Settings(data_dir=root.parent / "data", storage={"import_roots": [str(root)]})  # type: ignore[arg-type]
    return SimpleNamespace(settings=settings)


def _swap_for_link(path: Path, target: Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(target)


def test_a_file_swapped_for_a_link_after_listing_is_not_followed(tree: SimpleNamespace) -> None:
    found = list_source(_ctx(tree.root), f"file://{tree.root}/model/", 1)
    assert [f.name for f in found] == ["model.tensors"]
    _swap_for_link(tree.root / "model" / "model.tensors", tree.outside / "model.tensors")
    with pytest.raises(JobFailure) as caught:
        found[0].opener()
    assert caught.value.code == "import_root_forbidden"


def test_a_directory_swapped_for_a_link_after_listing_is_not_followed(
    tree: SimpleNamespace,
) -> None:
    found = list_source(_ctx(tree.root), f"file://{tree.root}/model/model.tensors", 1)
    _swap_for_link(tree.root / "model", tree.outside)
    with pytest.raises(JobFailure) as caught:
        found[0].opener()
    assert caught.value.code == "import_root_forbidden"


def test_links_out_of_the_root_are_refused_at_listing(tree: SimpleNamespace) -> None:
    (tree.root / "model" / "config.json").symlink_to(tree.outside / "model.tensors")
    with pytest.raises(JobFailure) as caught:
        list_source(_ctx(tree.root), f"file://{tree.root}/model/", 1)
    assert caught.value.code == "import_root_forbidden"
    (tree.root / "linked").symlink_to(tree.outside)
    with pytest.raises(JobFailure) as caught:
        list_source(_ctx(tree.root), f"file://{tree.root}/linked/", 1)
    assert caught.value.code == "import_root_forbidden"


def test_links_inside_the_root_are_followed_like_a_hugging_face_cache(
    tree: SimpleNamespace,
) -> None:
    (tree.root / "blobs").mkdir()
    (tree.root / "blobs" / "abc").write_bytes(b"weights")
    (tree.root / "model" / "weights.tensors").symlink_to("../blobs/abc")
    with paths.open_contained(tree.root / "model" / "weights.tensors", [tree.root]) as f:
        assert f.read() == b"weights"


def test_the_check_is_repeated_at_open_when_a_component_changes_in_between(
    tree: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race itself: the path is swapped right after ``contained`` resolved it."""
    checked = paths.contained

    def check_then_swap(path: Path, roots: Any) -> tuple[Path, Path]:
        result = checked(path, roots)
        _swap_for_link(tree.root / "model" / "sub", tree.outside)
        return result

    monkeypatch.setattr(paths, "contained", check_then_swap)
    with pytest.raises(paths.OutsideRoot):
        paths.open_contained(tree.root / "model" / "sub" / "deep.bin", [tree.root])


def test_only_regular_files_are_opened(tree: SimpleNamespace) -> None:
    os.mkfifo(tree.root / "model" / "pipe")
    for name in ("pipe", "sub", "missing"):
        with pytest.raises(paths.NotRegularFile):
            paths.open_contained(tree.root / "model" / name, [tree.root])
    with pytest.raises(paths.OutsideRoot):
        paths.open_contained(tree.outside / "model.tensors", [tree.root])
