"""A lying registry (issue 26 §1, §3, §4) and a replica dying mid-download (issue 29 §5), played
by a helper server on 127.0.0.1 (tests/client/lying_server.py) against the real CLI and the
node cache: paths that escape the destination, bodies that never end, run over or drip, a
connection cut mid-body, and a pulled file edited in place."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.serve_process import ROOT
from tensor_registry import NodeCache, RegistryClient, node_cache
from tensor_registry.api.client import (
    ChecksumMismatch,
    ConnectionFailed,
    InvalidKey,
    RegistryError,
    ResponseTooLarge,
    TransferTimeout,
)
from tensor_registry.api.resolution import ResolvedFile
from tensor_registry.api.transfer import TransferLimits
from tensor_registry.beneath import write_beneath
from tensor_registry.formats.model_signature import PULL_RECORD
from tensor_registry.formats.paths import UnsafePath
from tensor_registry.formats.signed_manifest import (
    MANIFEST_FILE,
    PAYLOAD_TYPE,
    ManifestFile,
    envelope,
    key_id,
    pae,
    statement,
)
from tensor_registry.trust import TrustError, fetch_keys_document, verify_directory
from tests.client.lying_server import Drip, DropOnce, Endless, Liar, Oversize

CONFIG = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
# Small limits injected where a test wants a deadline or a retry to come quickly.
QUICK = TransferLimits(
    idle_seconds=1.0,
    min_bytes_per_second=float(1 << 30),
    grace_seconds=1.5,
    retries=2,
    backoff_seconds=0.05,
    backoff_max_seconds=0.1,
)


def _cli(url: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")}
    env.update(
        PYTHONPATH=str(ROOT),
        XDG_CONFIG_HOME=str(tmp / "xdg"),
        TENSOR_REGISTRY_CONFIG_DIR=str(tmp / "cfg"),
        TENSOR_REGISTRY_CACHE_DIR=str(tmp / "cache"),
        TENSOR_REGISTRY_URL=url,
        TENSOR_REGISTRY_TOKEN="trg_liar",
    )
    return subprocess.run(
        [sys.executable, "-m", "tensor_registry.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _everything(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _blob_requests(liar: Liar) -> list[tuple[str, str | None]]:
    return [r for r in liar.requests if r[0].startswith("/blob/")]


# ---------------------------------------------------------------------------------------------
# §1: every path through one rule; writes stay under the destination


@pytest.mark.parametrize(
    "lie",
    ["../../x", "/ABSOLUTE", "a/../../x", "sub/./x", "a//x", ".hidden", "x\\..\\y", "config.json"],
)
def test_pull_and_export_refuse_a_path_that_leaves_the_destination(
    tmp_path: Path, lie: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    if lie == "/ABSOLUTE":
        lie = str(outside / "planted")
    liar = Liar()
    liar.file("config.json", CONFIG)
    liar.file(lie, b"planted by a lying registry")
    dest = tmp_path / "deep" / "er" / "dest"
    with liar.serving() as url:
        for command in (
            ["pull", "acme/liar:prod", "--dest", str(dest)],
            ["export", "acme/liar:prod", "--to", str(dest)],
        ):
            done = _cli(url, tmp_path, *command)
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert "unsafe_path" in done.stderr and "Traceback" not in done.stderr
    # Nothing fetched, nothing written: not the planted file, not even the honest one.
    assert _blob_requests(liar) == []
    assert _everything(outside) == set()
    assert not any("planted" in p.name or p.name == "x" for p in tmp_path.rglob("*"))
    assert not (dest / "config.json").exists()


def test_a_link_inside_the_destination_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.json"
    victim.write_bytes(b"the node's own file")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    (dest / "config.json").symlink_to(victim)

    # A directory of the destination that is a link: refused, nothing lands behind it.
    liar = Liar()
    liar.file("sub/tokenizer.json", b'{"lie": true}')
    with liar.serving() as url:
        done = _cli(url, tmp_path, "pull", "acme/liar:prod", "--dest", str(dest))
    assert done.returncode == 1 and "unsafe_path" in done.stderr, done.stderr
    assert "link or not a directory" in done.stderr
    assert _everything(outside) == {"victim.json"}

    # A file of the destination that is a link: replaced by the pulled file, not written through.
    liar = Liar()
    liar.file("config.json", CONFIG)
    with liar.serving() as url:
        done = _cli(url, tmp_path, "pull", "acme/liar:prod", "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    assert victim.read_bytes() == b"the node's own file"
    assert not (dest / "config.json").is_symlink()
    assert (dest / "config.json").read_bytes() == CONFIG


def test_the_node_cache_and_writer_apply_the_same_rule(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache")
    sha = hashlib.sha256(CONFIG).hexdigest()
    liar = Liar()
    liar.file("config.json", CONFIG)
    with liar.serving() as url:
        cache.fetch(f"{url}/blob/0", sha256=sha, size=len(CONFIG))
    dest = tmp_path / "dest"
    for lie in ("../x", "/etc/x", "a/../../x", ""):
        with pytest.raises(UnsafePath):
            cache.place(sha, dest, lie)
        with pytest.raises(UnsafePath):
            write_beneath(dest, lie, b"x")
    assert not (tmp_path / "x").exists()
    cache.place(sha, dest, "nested/dir/config.json")
    assert (dest / "nested" / "dir" / "config.json").read_bytes() == CONFIG


def _sign(files: dict[str, bytes]) -> tuple[bytes, str]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    payload = statement(
        files=[ManifestFile(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()],
        predicate={
            "artifact": {"id": "00000000-0000-0000-0000-000000000002", "dtype": "float16"},
            "registry": "http://127.0.0.1:1",
        },
    )
    signed = envelope(payload, [(key_id(public), private.sign(pae(PAYLOAD_TYPE, payload)))])
    return signed, base64.b64encode(public).decode()


def test_a_signed_bundle_naming_a_path_outside_it_is_refused_offline(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_bytes(b"not the bundle's")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    data, public = _sign({"../secret.json": secret.read_bytes(), "model.tensors": b"w"})
    (bundle / MANIFEST_FILE).write_bytes(data)
    (bundle / "model.tensors").write_bytes(b"w")
    with pytest.raises(UnsafePath):
        verify_directory(bundle, {key_id(base64.b64decode(public)): base64.b64decode(public)})
    for command in (["verify", str(bundle)], ["load-dir", str(bundle)]):
        done = _cli("http://127.0.0.1:9", tmp_path, *command, "--trusted-key", public)
        assert done.returncode == 1, (command, done.stderr)
        assert "unsafe_path" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------
# §3: sizes, byte caps, idle timeouts and deadlines


@pytest.mark.parametrize("readers", [1, 4])
def test_a_download_stops_at_the_signed_size(tmp_path: Path, readers: int) -> None:
    data = b"ten bytes!"
    cache = NodeCache(tmp_path / "cache", parallel_min_bytes=1, limits=QUICK)
    liar = Liar()
    liar.file("endless.json", data, body=Endless())
    liar.file("oversize.json", data, body=Oversize(extra=8 << 20))
    started = time.monotonic()
    with liar.serving() as url:
        for index in (0, 1):
            with pytest.raises(RegistryError) as caught:
                cache.fetch(
                    f"{url}/blob/{index}",
                    sha256=hashlib.sha256(data).hexdigest(),
                    size=len(data),
                    readers=readers,
                )
            assert caught.value.code in ("checksum_mismatch", "range_not_honoured")
    assert time.monotonic() - started < 10
    # The endless body was left at once: far less than its cap was ever sent.
    assert liar.sent < 16 << 20
    assert cache.size() == 0 and list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_a_download_shorter_than_its_size_fails(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", limits=QUICK)
    liar = Liar()
    liar.file("config.json", CONFIG)
    with liar.serving() as url, pytest.raises(ChecksumMismatch):
        cache.fetch(
            f"{url}/blob/0",
            sha256=hashlib.sha256(CONFIG + b"!").hexdigest(),
            size=len(CONFIG) + 1,
        )


def test_a_slow_drip_ends_at_the_deadline_derived_from_the_size(tmp_path: Path) -> None:
    data = b"d" * 400  # 1 byte per 20 ms: 8 s, against a deadline of about 1.5 s
    cache = NodeCache(tmp_path / "cache", limits=QUICK)
    liar = Liar()
    liar.file("config.json", data, body=Drip(every=0.02))
    started = time.monotonic()
    with liar.serving() as url, pytest.raises(TransferTimeout):
        cache.fetch(f"{url}/blob/0", sha256=hashlib.sha256(data).hexdigest(), size=400)
    assert time.monotonic() - started < QUICK.grace_seconds + QUICK.idle_seconds + 1.5


def test_an_idle_server_times_out_after_bounded_retries(tmp_path: Path) -> None:
    data = b"i" * 50
    limits = TransferLimits(
        idle_seconds=0.3, grace_seconds=30, retries=2, backoff_seconds=0.05, backoff_max_seconds=0.1
    )
    cache = NodeCache(tmp_path / "cache", limits=limits)
    liar = Liar()
    liar.file("config.json", data, body=Drip(every=1.0))
    started = time.monotonic()
    with liar.serving() as url, pytest.raises(TransferTimeout):
        cache.fetch(f"{url}/blob/0", sha256=hashlib.sha256(data).hexdigest(), size=50)
    # Three attempts of at most about one idle period each (plus their first bytes).
    assert time.monotonic() - started < 6
    assert len(_blob_requests(liar)) == 3


def test_small_documents_are_capped_while_streaming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    liar = Liar()
    liar.file("key", b"k" * 32, body=Endless())
    liar.file("manifest", b"m" * 100, body=Oversize(extra=4 << 20))
    liar.endless = {"/.well-known/", "/api/v1/resolve"}
    monkeypatch.setattr("tensor_registry.api.client.MAX_JSON_BYTES", 1 << 20)
    started = time.monotonic()
    with liar.serving() as url, RegistryClient(url, "trg_x", limits=QUICK) as client:
        with pytest.raises(InvalidKey):
            client.fetch_key(f"{url}/blob/0")
        entry = ResolvedFile("manifest.sig.json", 100, "0" * 64, f"{url}/blob/1", "manifest")
        with pytest.raises(ResponseTooLarge):
            client.fetch_resolved_file(entry, "signed manifest")
        with pytest.raises(TrustError) as caught:
            fetch_keys_document(client)
        assert caught.value.code == "bad_keys"
        with pytest.raises(ResponseTooLarge):
            client.resolve("acme/liar", "prod")
    assert time.monotonic() - started < 10
    # Three endless bodies, each left within its cap (+ what the sockets buffered).
    assert liar.sent < 3 * (2 << 20) + 3 * (8 << 20)


def test_a_job_event_stream_with_an_endless_line_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    liar = Liar()
    liar.endless = {"/api/v1/jobs/"}
    monkeypatch.setattr("tensor_registry.api.client.MAX_EVENT_BYTES", 256 << 10)
    with (
        liar.serving() as url,
        RegistryClient(url, "trg_x", limits=QUICK) as client,
        pytest.raises(ResponseTooLarge),
    ):
        list(client.job_events("00000000-0000-0000-0000-000000000003"))
    assert liar.sent < 16 << 20


# ---------------------------------------------------------------------------------------------
# issue 29 §5: a connection cut mid-body resumes with Range from the byte it reached


@pytest.mark.parametrize("readers", [1, 3])
def test_a_download_cut_mid_body_resumes_from_where_it_stopped(
    tmp_path: Path, readers: int
) -> None:
    data = os.urandom(300_000)
    cache = NodeCache(tmp_path / "cache", parallel_min_bytes=1, limits=QUICK)
    liar = Liar()
    liar.file("model.tensors", data, body=DropOnce(at=40_000), kind="weights")
    with liar.serving() as url:
        path, fetched = cache.fetch(
            f"{url}/blob/0",
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            readers=readers,
        )
    assert fetched and path.read_bytes() == data
    ranges = [r for _, r in _blob_requests(liar)]
    assert len(ranges) == readers + 1
    first = ranges[0]
    start, _, end = (first or f"bytes=0-{len(data) - 1}").removeprefix("bytes=").partition("-")
    assert ranges[-1] == f"bytes={int(start) + 40_000}-{end}"


def test_pull_survives_a_replica_killed_mid_download(tmp_path: Path) -> None:
    data = os.urandom(200_000)
    liar = Liar()
    liar.file("config.json", CONFIG)
    liar.file("model.tensors", data, body=DropOnce(at=70_000), kind="weights")
    dest = tmp_path / "dest"
    with liar.serving() as url:
        done = _cli(url, tmp_path, "pull", "acme/liar:prod", "--dest", str(dest), "--weights")
    assert done.returncode == 0, done.stderr
    assert (dest / "model.tensors").read_bytes() == data
    assert ("/blob/1", f"bytes=70000-{len(data) - 1}") in liar.requests


def test_a_server_that_always_drops_fails_after_bounded_retries(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    cache = NodeCache(tmp_path / "cache", limits=QUICK)
    liar = Liar()
    liar.file("config.json", data, body=DropOnce(at=100))
    drops = liar.files[0].body
    assert isinstance(drops, DropOnce)

    class Always(DropOnce):
        @property  # type: ignore[override]
        def dropped(self) -> bool:
            return False

        @dropped.setter
        def dropped(self, value: bool) -> None:
            return None

    liar.files[0].body = Always(at=100)
    with liar.serving() as url, pytest.raises(ConnectionFailed):
        cache.fetch(f"{url}/blob/0", sha256=hashlib.sha256(data).hexdigest(), size=10_000)
    ranges = [r for _, r in _blob_requests(liar)]
    assert ranges == [None, "bytes=100-9999", "bytes=200-9999"]


# ---------------------------------------------------------------------------------------------
# §4: a placed file edited in place is never placed again


def test_a_pulled_file_edited_in_place_is_fetched_again_not_reused(tmp_path: Path) -> None:
    liar = Liar()
    liar.file("config.json", CONFIG)
    with liar.serving() as url:
        first = _cli(url, tmp_path, "pull", "acme/liar:prod", "--dest", str(tmp_path / "one"))
        assert first.returncode == 0, first.stderr
        placed = tmp_path / "one" / "config.json"
        os.chmod(placed, 0o644)  # what root does not even need to do
        edited = CONFIG.replace(b"llama", b"evil!")
        assert len(edited) == len(CONFIG)
        with open(placed, "r+b") as fh:  # in place: the cache's object shares the inode
            fh.write(edited)
        again = _cli(url, tmp_path, "pull", "acme/liar:prod", "--dest", str(tmp_path / "two"))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "two" / "config.json").read_bytes() == CONFIG
    assert len(_blob_requests(liar)) == 2  # fetched again, not reused
    assert "0 B downloaded" not in again.stderr


def test_an_untouched_object_is_reused_without_hashing_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = NodeCache(tmp_path / "cache")
    sha = hashlib.sha256(CONFIG).hexdigest()
    liar = Liar()
    liar.file("config.json", CONFIG)
    with liar.serving() as url:
        cache.fetch(f"{url}/blob/0", sha256=sha, size=len(CONFIG))
        cache.place(sha, tmp_path / "a", "config.json")
        hashed: list[Path] = []
        real = node_cache.sha256_file
        monkeypatch.setattr(
            "tensor_registry.node_cache.sha256_file", lambda p: hashed.append(p) or real(p)
        )
        _, fetched = cache.fetch(f"{url}/blob/0", sha256=sha, size=len(CONFIG))
        assert not fetched and hashed == []  # its stamp matched: no second pass over the bytes
        # A same-size edit through the placed link: the stamp no longer matches, the bytes are
        # hashed, found wrong, and the object is dropped and fetched again.
        placed = tmp_path / "a" / "config.json"
        os.chmod(placed, 0o644)
        with open(placed, "r+b") as fh:
            fh.write(b"X")
        assert not cache.contains(sha, len(CONFIG))
        assert len(hashed) == 1 and not cache.path(sha).exists()
        _, fetched = cache.fetch(f"{url}/blob/0", sha256=sha, size=len(CONFIG))
    assert fetched and cache.path(sha).read_bytes() == CONFIG


def test_pull_record_and_key_file_are_written_inside_the_destination(tmp_path: Path) -> None:
    liar = Liar()
    liar.file("config.json", CONFIG)
    dest = tmp_path / "dest"
    with liar.serving() as url:
        done = _cli(url, tmp_path, "pull", "acme/liar:prod", "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    record = json.loads((dest / PULL_RECORD).read_text())
    # The weights stay remote (no --weights); what was written is the config, inside dest.
    placed = [f["path"] for f in record["files"] if f.get("local", True)]
    assert placed == ["config.json"]
