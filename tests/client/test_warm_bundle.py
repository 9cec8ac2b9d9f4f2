"""Warm bundles on the node: pack → restore round trip, every escaping tar member refused with
the cache root left as it was, sizes bounded, and hit/miss decided from what vLLM logged or made.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tensor_registry.formats.warm import (
    WarmFormatError,
    WarmKey,
    differences,
    normalize_serve_args,
)
from tensor_registry.formats.warm_bundle import WarmBundleError, hash_dirs, pack, restore
from tensor_registry.warm.observe import observe

HASH_DIR = "torch_compile_cache/0123abcdef"
FACTORS = {"env": {"VLLM_X": "1"}, "config_hash": "c1", "code_hash": "k1", "compiler_hash": "p1"}


def make_cache(root: Path, hash_dir: str = HASH_DIR, factors: dict[str, object] = FACTORS) -> Path:
    rank = root / hash_dir / "rank_0_0" / "backbone"
    (rank / "inductor_cache" / "fxgraph").mkdir(parents=True)
    (rank / "inductor_cache" / "fxgraph" / "fgraph1").write_bytes(b"compiled" * 100)
    (rank / "triton_cache").mkdir()
    (rank / "triton_cache" / "__grp__triton_.json").write_text("{}")
    (rank / "cache_key_factors.json").write_text(json.dumps(factors))
    return root


def test_pack_then_restore_gives_the_same_files_and_records_vllms_factors(tmp_path: Path) -> None:
    source = make_cache(tmp_path / "made")
    buf = io.BytesIO()
    packed = pack(source, buf, max_bytes=1 << 20)
    assert packed.dirs == [HASH_DIR]
    assert packed.factors[HASH_DIR]["config_hash"] == "c1"
    bundle = tmp_path / "b.tar"
    bundle.write_bytes(buf.getvalue())
    node = tmp_path / "node"
    assert restore(bundle, node, max_bytes=1 << 20) == [HASH_DIR]
    made = sorted(p.relative_to(source).as_posix() for p in source.rglob("*"))
    got = sorted(p.relative_to(node).as_posix() for p in node.rglob("*"))
    assert made == got
    for name in made:
        if (source / name).is_file():
            assert (node / name).read_bytes() == (source / name).read_bytes()


def test_packing_stops_at_its_byte_limit(tmp_path: Path) -> None:
    with pytest.raises(WarmBundleError) as caught:
        pack(make_cache(tmp_path), io.BytesIO(), max_bytes=2048)
    assert caught.value.code == "bundle_too_large"


def _tar(path: Path, add: Callable[[tarfile.TarFile], None]) -> Path:
    with tarfile.open(path, "w") as tar:
        ok = tarfile.TarInfo(f"{HASH_DIR}/rank_0_0/ok.bin")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        add(tar)
    return path


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _link(kind: bytes, name: str, target: str) -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = target
        tar.addfile(info)

    return add


def _special(kind: bytes) -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(f"{HASH_DIR}/rank_0_0/dev")
        info.type = kind
        info.devmajor, info.devminor = 1, 3
        tar.addfile(info)

    return add


CRAFTED: dict[str, Callable[[tarfile.TarFile], None]] = {
    "absolute path": lambda tar: _file(tar, "/tmp/evil"),
    "absolute path inside the cache dir name": lambda tar: _file(tar, f"/{HASH_DIR}/x"),
    "dot-dot": lambda tar: _file(tar, f"{HASH_DIR}/../../escaped"),
    "dot-dot at the start": lambda tar: _file(tar, "../escaped"),
    "outside torch_compile_cache": lambda tar: _file(tar, "other_cache/x"),
    "symlink out": _link(tarfile.SYMTYPE, f"{HASH_DIR}/rank_0_0/link", "/etc/passwd"),
    "symlink in": _link(tarfile.SYMTYPE, f"{HASH_DIR}/rank_0_0/link", "ok.bin"),
    "hard link out": _link(tarfile.LNKTYPE, f"{HASH_DIR}/rank_0_0/hard", "/etc/passwd"),
    "character device": _special(tarfile.CHRTYPE),
    "block device": _special(tarfile.BLKTYPE),
    "fifo": _special(tarfile.FIFOTYPE),
    "backslash": lambda tar: _file(tar, f"{HASH_DIR}\\..\\x"),
    "twice the same file": lambda tar: _file(tar, f"{HASH_DIR}/rank_0_0/ok.bin", b"no"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_member_is_refused_and_nothing_is_placed(tmp_path: Path, case: str) -> None:
    bundle = _tar(tmp_path / "evil.tar", CRAFTED[case])
    node = tmp_path / "node"
    node.mkdir()
    with pytest.raises(WarmBundleError) as caught:
        restore(bundle, node, max_bytes=1 << 20)
    assert caught.value.code == "unsafe_member", caught.value
    assert list(node.iterdir()) == []  # staging removed, no hash directory placed
    assert not (tmp_path / "escaped").exists()


def test_a_symlink_planted_in_the_cache_root_is_not_followed(tmp_path: Path) -> None:
    bundle = _tar(tmp_path / "b.tar", lambda tar: None)
    node = tmp_path / "node"
    node.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (node / "torch_compile_cache").symlink_to(elsewhere)
    with pytest.raises(WarmBundleError):
        restore(bundle, node, max_bytes=1 << 20)
    assert list(elsewhere.iterdir()) == []


def test_unpacked_size_is_bounded(tmp_path: Path) -> None:
    bundle = _tar(tmp_path / "big.tar", lambda tar: _file(tar, f"{HASH_DIR}/big", b"y" * 5000))
    with pytest.raises(WarmBundleError) as caught:
        restore(bundle, tmp_path / "node", max_bytes=4096)
    assert caught.value.code == "bundle_too_large"


def test_not_a_tar_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "junk.tar"
    bundle.write_bytes(b"\x00garbage" * 200)
    with pytest.raises(WarmBundleError):
        restore(bundle, tmp_path / "node", max_bytes=1 << 20)


def test_serve_args_are_normalized_and_only_allowed_flags_pass() -> None:
    assert normalize_serve_args(["--max-num-seqs", "8", "--max-model-len=512"]) == [
        "--max-model-len=512",
        "--max-num-seqs=8",
    ]
    for bad in (["--trust-remote-code"], ["--download-dir", "/etc"], ["--max-model-len"]):
        with pytest.raises(WarmFormatError):
            normalize_serve_args(bad)


def test_differences_name_each_key_part() -> None:
    key = WarmKey("0.24.0", "2.11.0", "9.0", 1, "bfloat16", "/m", ("--max-model-len=512",))
    other = WarmKey("0.24.0", "2.11.0", "8.0", 1, "bfloat16", "/m", ("--max-model-len=1024",))
    found = differences(key, other)
    assert found[0].startswith("gpu: bundle has 9.0")
    assert "serve_args --max-model-len: bundle has --max-model-len=512" in found[1]
    assert differences(key, key) == []


def test_hit_when_vllm_logged_the_bundles_directory(tmp_path: Path) -> None:
    root = make_cache(tmp_path)
    log = (
        f"INFO Using cache directory: {root}/{HASH_DIR}/rank_0_0/backbone for vLLM's torch.compile"
    )
    outcome = observe(
        root,
        bundle_dirs=[HASH_DIR],
        bundle_factors={HASH_DIR: FACTORS},
        before=[HASH_DIR],
        log_text=log,
    )
    assert (outcome.result, outcome.used) == ("hit", [HASH_DIR])


def test_miss_names_the_factor_vllm_computed_differently(tmp_path: Path) -> None:
    root = make_cache(tmp_path)
    make_cache(root, "torch_compile_cache/ffffeeee00", {**FACTORS, "config_hash": "c2"})
    outcome = observe(
        root,
        bundle_dirs=[HASH_DIR],
        bundle_factors={HASH_DIR: FACTORS},
        before=[HASH_DIR],
    )
    assert outcome.result == "miss"
    assert outcome.used == ["torch_compile_cache/ffffeeee00"]
    assert any("config_hash: bundle has c1, vLLM computed c2" in d for d in outcome.differed)
    assert hash_dirs(root) == {HASH_DIR, "torch_compile_cache/ffffeeee00"}


def test_a_disabled_cache_is_a_miss_that_says_so(tmp_path: Path) -> None:
    outcome = observe(
        tmp_path,
        bundle_dirs=[HASH_DIR],
        bundle_factors={},
        before=[],
        log_text="INFO vLLM's torch.compile cache is disabled.",
    )
    assert outcome.result == "miss" and "disabled" in outcome.differed[0]
