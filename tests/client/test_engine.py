"""The load engine against a real `tensor-registry serve`: bit-exact loads from the signed URL and
from the node cache (hf, vllm-style with the marker, TP=2), the tensorizer fallback for
encrypted artifacts and ones without a manifest, and every way bytes can go wrong — a flipped
byte in storage, a proxy answering with other bytes, a truncated file — failing with the tensor
named; an URL expiring mid-load re-resolves once."""

from __future__ import annotations

import http.server
import json
import mmap
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from harness.artifacts import MadeArtifact, make_artifact, rank_state
from harness.loopback import QuietHandler, serving
from tensor_registry import RegistryClient
from tensor_registry.api.client import ChecksumMismatch
from tensor_registry.api.resolution import Resolution
from tensor_registry.engine import ChunkMismatch, copy_into_module, load_artifact
from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.node_cache import NodeCache
from tests.client.conftest import Registry


def _name() -> str:
    return f"acme/e-{uuid.uuid4().hex[:10]}"


def _big_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(1024, 1100, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(2048, 1500, generator=g),
        "model.layers.0.mlp.down_proj.bias": torch.randn(33, generator=g).to(torch.float16),
        "model.norm.weight": torch.ones(1100),
        "position_ids": torch.arange(77),
    }


def _raw(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


def _equal(loaded: dict[str, Any], expected: dict[str, torch.Tensor]) -> None:
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(loaded[name], tensor), name


async def _artifact(registry: Registry, **kwargs: Any) -> tuple[str, MadeArtifact]:
    name = _name()
    registry.ready_model(name)
    kwargs.setdefault("layout", True)
    made = await make_artifact(registry.settings, model=name, version=1, **kwargs)
    return name, made


def _client(registry: Registry) -> RegistryClient:
    return RegistryClient(registry.url, registry.token)


async def test_cpu_load_over_the_signed_url_is_bit_exact(
    registry: Registry, cache_dir: Path
) -> None:
    state = _big_state()
    name, _ = await _artifact(registry, sources=[state])
    with _client(registry) as client:
        answer = client.resolve(name, cpu_count=2)
        assert answer.data["engine"]["loader"] == "engine"
        assert [f.kind for f in answer.files if f.path == LAYOUT_FILE] == ["layout"]
        result = load_artifact(answer, client=client, cache=NodeCache(cache_dir))
    assert (result.path, result.source, result.verified) == ("engine", "url", True)
    _equal(result.tensors, state)


async def test_node_cache_files_load_as_zero_copy_views(
    registry: Registry, cache_dir: Path
) -> None:
    state = _big_state(1)
    name, made = await _artifact(registry, sources=[state])
    cache = NodeCache(cache_dir)
    with _client(registry) as client:
        answer = client.resolve(name)
        weights = next(f for f in answer.files if f.path == "model.tensors")
        cached, _ = cache.fetch(
            weights.url,
            sha256=weights.sha256,
            size=weights.size,
            compatibility_key=answer.data["compatibility_key"],
        )
        result = load_artifact(answer, client=client, cache=cache)
    assert (result.path, result.source) == ("engine", "file")
    _equal(result.tensors, state)
    # Views of one private mapping of the cached file: writing them leaves the file unchanged.
    embed = result.tensors["model.embed_tokens.weight"]
    embed.zero_()
    assert cached.read_bytes() == made.files["model.tensors"]


async def test_hf_module_loads_in_place(registry: Registry, cache_dir: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(1)
    source = LlamaForCausalLM(config).eval()
    torch.manual_seed(2)
    target = LlamaForCausalLM(config).eval()
    name, _ = await _artifact(registry, sources=[source])
    with _client(registry) as client:
        result = load_artifact(name, client=client, cache=NodeCache(cache_dir), format="hf")
    copy_into_module(target, result.tensors)
    tokens = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        assert torch.equal(source(tokens).logits, target(tokens).logits)


async def test_vllm_format_and_each_tp_rank(registry: Registry, cache_dir: Path) -> None:
    marker = {".vllm_tensorized_marker": torch.zeros(0)}
    sources = [{**rank_state(rank, elements=300_000), **marker} for rank in range(2)]
    name, _ = await _artifact(registry, sources=sources, format="vllm", tensor_parallel_size=2)
    with _client(registry) as client:
        answer = client.resolve(name, tensor_parallel_size=2)
        for rank in range(2):
            result = load_artifact(answer, client=client, rank=rank, cache=NodeCache(cache_dir))
            assert result.path == "engine"
            _equal(result.tensors, rank_state(rank, elements=300_000))  # marker skipped


async def test_encrypted_and_manifestless_artifacts_fall_back_to_tensorizer(
    registry: Registry, cache_dir: Path
) -> None:
    state = {"w": torch.randn(128, 64)}
    name, _ = await _artifact(registry, sources=[state], encrypted=True)
    keyholder = registry.token_with("resolve", "keys:read", name="keys")
    with RegistryClient(registry.url, keyholder) as client:
        answer = client.resolve(name)
        assert answer.data["engine"]["loader"] == "tensorizer"
        result = load_artifact(answer, client=client, cache=NodeCache(cache_dir))
    assert result.path == "tensorizer" and "encrypted" in (result.reason or "")
    assert result.source == "file"  # through the node cache, sha256-checked
    _equal(result.tensors, state)

    old, _ = await _artifact(registry, sources=[state], layout=False)
    with _client(registry) as client:
        result = load_artifact(old, client=client, cache=NodeCache(cache_dir))
    assert result.path == "tensorizer" and "layout manifest" in (result.reason or "")
    _equal(result.tensors, state)


async def test_a_flipped_byte_in_an_encrypted_artifact_fails_before_tensorizer_reads_it(
    registry: Registry, cache_dir: Path
) -> None:
    # tensorizer's own hashes cover each tensor; the signed sha256 covers the whole file, and
    # the fallback now checks it (node cache) before tensorizer sees a byte.
    state = {"w": torch.randn(256, 64), "b": torch.randn(64)}
    name, made = await _artifact(registry, sources=[state], encrypted=True)
    _flip(made.directory / "model.tensors", len(made.files["model.tensors"]) // 2)
    keyholder = registry.token_with("resolve", "keys:read", name="keys")
    cache = NodeCache(cache_dir)
    with (
        RegistryClient(registry.url, keyholder) as client,
        pytest.raises(ChecksumMismatch) as caught,
    ):
        load_artifact(name, client=client, cache=cache)
    assert made.sha256("model.tensors") in str(caught.value)
    assert "nothing was kept" in str(caught.value)
    assert not cache.path(made.sha256("model.tensors")).exists()


def _flip(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


async def test_a_flipped_byte_in_storage_names_the_tensor(
    registry: Registry, cache_dir: Path
) -> None:
    state = _big_state(2)
    name, made = await _artifact(registry, sources=[state])
    data = made.files["model.tensors"]
    target = state["model.layers.0.mlp.up_proj.weight"].numpy().tobytes()
    offset = data.index(target[:4096]) + 5_000_000
    _flip(made.directory / "model.tensors", offset)
    with _client(registry) as client, pytest.raises(ChunkMismatch) as caught:
        load_artifact(name, client=client, cache=NodeCache(cache_dir))
    assert "model.layers.0.mlp.up_proj.weight" in caught.value.tensors
    assert "model.layers.0.mlp.up_proj.weight" in str(caught.value)
    # The same corruption in a node-cache copy is caught on the mmap path too.
    cache = NodeCache(cache_dir / "c2")
    bad = cache.path(made.sha256("model.tensors"))
    bad.parent.mkdir(parents=True)
    bad.write_bytes(data)
    _flip(bad, offset)
    with _client(registry) as client, pytest.raises(ChunkMismatch) as caught:
        load_artifact(name, client=client, cache=cache)
    assert "model.layers.0.mlp.up_proj.weight" in caught.value.tensors


@contextmanager
def _proxy(upstream: str, mode: str) -> Iterator[tuple[str, dict[str, int]]]:
    """A helper HTTP server on 127.0.0.1 in front of the registry's blob URLs.

    ``shift``: answers every range with the bytes one further on (headers as asked);
    ``whole``: ignores Range and sends the whole file with 200;
    ``expire``: passes the first request, then answers like an expired signature.
    """
    seen = {"requests": 0, "expired": 0, "with_token": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return None

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            with lock:
                seen["with_token"] += "authorization" in {k.lower() for k in self.headers}
                if LAYOUT_FILE not in self.path:
                    seen["requests"] += 1
                count = seen["requests"]
            url = upstream + self.path
            asked = self.headers.get("Range")
            if mode == "expire" and count > 1 and LAYOUT_FILE not in self.path:
                with lock:
                    seen["expired"] += 1
                body = json.dumps(
                    {"code": "signature_expired", "detail": "expired", "status": 403}
                ).encode()
                self._send(403, body, {"Content-Type": "application/problem+json"})
                return
            if mode == "shift" and asked:
                first, last = (int(x) for x in asked.removeprefix("bytes=").split("-"))
                r = httpx.get(url, headers={"Range": f"bytes={first + 1}-{last + 1}"})
                total = r.headers["content-range"].rpartition("/")[2]
                body = r.content
                self._send(206, body, {"Content-Range": f"bytes {first}-{last}/{total}"})
                return
            r = httpx.get(url, headers={} if mode == "whole" or not asked else {"Range": asked})
            headers = {k: v for k, v in r.headers.items() if k.lower() == "content-range"}
            self._send(r.status_code, r.content, headers)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def blob_host(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make ``url``'s origin one the registry's signed keys document names: the proxy stands
    for such a blob host (tests/client/test_foreign_urls.py covers the naming itself); what it
    sends is what these tests are about."""
    from tensor_registry.trust import origins

    def add(url: str) -> None:
        real = origins.allowed_origins

        def allowed(*args: Any, **kwargs: Any) -> set[str]:
            return real(*args, **kwargs) | {origins.origin(url) or url}

        monkeypatch.setattr(origins, "allowed_origins", allowed)

    return add


def _through(answer: Resolution, registry_url: str, proxy: str) -> Resolution:
    data = json.loads(json.dumps(answer.data))
    for f in data["files"]:
        if f["path"].endswith(".tensors") or f["path"] == LAYOUT_FILE:
            f["url"] = f["url"].replace(registry_url, proxy)
    return Resolution(data, dict(answer.params))


@pytest.mark.parametrize("mode", ["shift", "whole"])
async def test_a_proxy_answering_with_other_bytes_names_the_tensor(
    registry: Registry, cache_dir: Path, mode: str, blob_host: Callable[[str], None]
) -> None:
    state = _big_state(3)
    name, _ = await _artifact(registry, sources=[state])
    with _client(registry) as client, _proxy(registry.url, mode) as (proxy, seen):
        blob_host(proxy)
        answer = _through(client.resolve(name), registry.url, proxy)
        with pytest.raises(ChunkMismatch) as caught:
            load_artifact(answer, client=client, cache=NodeCache(cache_dir))
    assert seen["requests"] >= 1
    assert caught.value.tensors and set(caught.value.tensors) <= set(state)
    assert caught.value.tensors[0] in str(caught.value)


async def test_a_truncated_file_names_the_missing_tensor(
    registry: Registry, cache_dir: Path
) -> None:
    state = _big_state(4)
    name, made = await _artifact(registry, sources=[state])
    path = made.directory / "model.tensors"
    data = made.files["model.tensors"]
    os.chmod(path, 0o644)
    path.write_bytes(data[: len(data) - 100])
    last = max(state, key=lambda k: data.index(_raw(state[k])[:64]))
    with _client(registry) as client, pytest.raises(ChunkMismatch) as caught:
        load_artifact(name, client=client, cache=NodeCache(cache_dir))
    assert last in caught.value.tensors and last in str(caught.value)


async def test_an_url_expiring_mid_load_is_resolved_again_once(
    registry: Registry, cache_dir: Path, blob_host: Callable[[str], None]
) -> None:
    state = _big_state(5)
    name, _ = await _artifact(registry, sources=[state])
    with _client(registry) as client, _proxy(registry.url, "expire") as (proxy, seen):
        blob_host(proxy)
        answer = _through(client.resolve(name), registry.url, proxy)
        # Two connections, one 8 MiB range each: the proxy expires the second request.
        answer.data["engine"]["block_bytes"] = 1
        result = load_artifact(answer, client=client, cache=NodeCache(cache_dir), connections=2)
    assert seen["expired"] >= 1 and seen["with_token"] == 0  # signed URLs get no bearer token
    assert result.path == "engine"
    _equal(result.tensors, state)


async def test_backfill_gives_an_old_artifact_its_manifest(
    registry: Registry, cache_dir: Path
) -> None:
    from tensor_registry_server.artifacts.making.layout_writer import backfill_layout
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.storage.registry import StorageRegistry
    from tests.workers.layout_checks import assert_layout_matches

    state = _big_state(6)
    name, made = await _artifact(registry, sources=[state], layout=False)
    storages = StorageRegistry(registry.settings)
    engine = create_engine(registry.settings.database_url)
    try:
        for expected in (True, False):  # a second run finds the manifest and does nothing
            async with session_scope(make_sessionmaker(engine)) as session:
                assert await backfill_layout(session, storages.get("local"), made.id) is expected
    finally:
        await engine.dispose()
        await storages.close()
    from tensor_registry.formats import layout

    manifest = layout.loads((made.directory / LAYOUT_FILE).read_bytes())
    assert_layout_matches(made.directory / "model.tensors", manifest.file("model.tensors"))
    with _client(registry) as client:
        answer = client.resolve(name)
        assert answer.data["engine"]["loader"] == "engine"
        result = load_artifact(answer, client=client, cache=NodeCache(cache_dir))
    assert result.path == "engine"
    _equal(result.tensors, state)


async def test_load_and_bench_load_commands_report_the_engine_path(
    registry: Registry, tmp_path: Path
) -> None:
    state = _big_state(7)
    name, _ = await _artifact(registry, sources=[state])
    env = {"TENSOR_REGISTRY_CACHE_DIR": str(tmp_path / "cache")}
    done = registry.cli("load", f"{name}:1", "--json", env=env)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.splitlines()[0])
    assert (line["path"], line["source"], line["verified"]) == ("engine", "url", True)
    assert line["bytes"] > 14_000_000 and line["gbps"] > 0 and line["tensors"] == len(state)
    # The steps account for the seconds: they add up to them, "other" included.
    steps = line["phases"]
    assert set(steps) == {"signature", "layout", "read", "other"}, steps
    assert abs(sum(steps.values()) - line["seconds"]) < 1e-3, line
    assert steps["read"] > 0 and steps["read"] <= line["seconds"]
    bench = registry.cli("bench-load", name, "--runs", "2", "--no-verify", "--json", env=env)
    assert bench.returncode == 0, bench.stderr
    lines = [json.loads(x) for x in bench.stdout.splitlines()]
    assert [x["verified"] for x in lines[:2]] == [False, False]
    assert lines[2]["runs"] == 2 and lines[2]["best_gbps"] > 0
    # Without --json: a table for people, sizes in decimal units.
    table = registry.cli("bench-load", name, "--runs", "2", env=env)
    assert table.returncode == 0, table.stderr
    header, first, second, summary = table.stdout.splitlines()
    assert header.split()[:5] == ["RUN", "PATH", "SOURCE", "DEVICE", "SIZE"], header
    assert first.split()[:3] == ["1", "engine", "url"] and " MB " in first, first
    assert second.split()[0] == "2" and summary.startswith("2 runs: best "), summary
    cells = first.split()
    assert abs(sum(map(float, cells[-4:])) - float(cells[6])) < 5e-3, first
    missing = registry.cli("load", "acme/does-not-exist", env=env)
    assert missing.returncode == 1 and "model_not_found" in missing.stderr


async def test_resolve_advises_the_engine_from_what_the_node_reports(registry: Registry) -> None:
    name, _ = await _artifact(registry, sources=[{"w": torch.randn(8)}])
    old, _ = await _artifact(registry, sources=[{"w": torch.randn(8)}], layout=False)
    with _client(registry) as client:
        gpu = client.resolve(name, gpu=True, cpu_count=16).data["engine"]
        small_gpu = client.resolve(name, gpu=True, cpu_count=4).data["engine"]
        cpu = client.resolve(name, cpu_count=2, verify_hash=False).data["engine"]
        unknown = client.resolve(name).data["engine"]
        plain = client.resolve(old).data["engine"]
    assert gpu == {
        "loader": "engine",
        "layout_path": LAYOUT_FILE,
        "connections": 12,  # a quarter of the cores left to pinning, copies and digests
        "block_bytes": 64 << 20,
        "register_fraction": 1.0,
        "verify": True,
    }
    assert small_gpu["connections"] == 4  # never below four connections
    assert (cpu["connections"], cpu["register_fraction"], cpu["verify"]) == (4, 0.0, False)
    assert unknown["connections"] == 8 and unknown["register_fraction"] == 0.0
    assert (plain["loader"], plain["layout_path"]) == ("tensorizer", None)


def test_url_pieces_are_handed_on_while_the_rest_of_the_range_is_arriving() -> None:
    """The range reader hands each piece on the moment a receive call has put it in the
    buffer: the server sends the first chunk, then holds the rest until the pieces handed on
    cover it (or 10 s passed)."""
    from tensor_registry.engine.sources import HTTPRangeReader

    chunk, size = 64 * 1024, 4 * 64 * 1024
    data = os.urandom(size)
    first_in = threading.Event()
    seen: dict[str, bool] = {}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _answer_range(self, size)
            if first == 0:
                self.wfile.write(data[:chunk])
                self.wfile.flush()
                seen["handed on before the rest was sent"] = first_in.wait(timeout=10)
            self.wfile.write(data[max(first, chunk) : last + 1])

    pieces: list[tuple[int, bytes]] = []

    def landed(offset: int, piece: memoryview) -> None:
        pieces.append((offset, bytes(piece)))
        if offset + len(piece) >= chunk:
            first_in.set()

    buffer = bytearray(size)
    with serving(Handler) as url:
        reader = HTTPRangeReader(f"{url}/f", size)
        try:
            got = reader(0, memoryview(buffer), landed)
            again = bytearray(chunk)
            again_got = reader(chunk, memoryview(again))  # on the same connection
        finally:
            reader.close()
    assert got == size and bytes(buffer) == data
    assert again_got == chunk and bytes(again) == data[chunk : 2 * chunk]
    assert seen == {"handed on before the rest was sent": True}
    starts = [sum(len(p) for _, p in pieces[:i]) for i in range(len(pieces))]
    assert [o for o, _ in pieces] == starts and b"".join(p for _, p in pieces) == data


def _asked(header: str) -> tuple[int, int]:
    first, last = header.removeprefix("bytes=").split("-")
    return int(first), int(last)


def _answer_range(handler: http.server.BaseHTTPRequestHandler, size: int) -> tuple[int, int]:
    """Send the 206 headers for the range ``handler`` was asked for; returns (first, last)."""
    first, last = _asked(handler.headers["Range"])
    handler.send_response(206)
    handler.send_header("Content-Range", f"bytes {first}-{last}/{size}")
    handler.send_header("Content-Length", str(last - first + 1))
    handler.end_headers()
    return first, last


def _layout(data: bytes, chunk: int) -> Any:
    """A manifest for ``data``: float32 tensors t0, t1, … of one chunk each (the last shorter)."""
    from tensor_registry.formats.layout import FileLayout, TensorLayout, chunk_digest

    lengths = [(o, min(chunk, len(data) - o)) for o in range(0, len(data), chunk)]
    tensors = tuple(
        TensorLayout(f"t{i}", "float32", (n // 4,), o, n) for i, (o, n) in enumerate(lengths)
    )
    digests = tuple(chunk_digest(data[o : o + chunk]) for o in range(0, len(data), chunk))
    return FileLayout("model.tensors", len(data), "", 1, False, chunk, digests, tensors)


def test_a_bad_chunk_fails_the_url_load_before_the_rest_of_its_range_arrives() -> None:
    """Verification happens as the bytes land, not after the range: the server sends a first
    chunk with one flipped byte, then holds the rest of the range until the client hangs up.
    The load must fail naming that chunk's tensor while the rest is still held back (were the
    chunks checked only once the whole range was in, the client would wait for it; were they
    not checked, the load would return)."""
    from tensor_registry.engine.cpu import load_url_cpu

    chunk = 64 * 1024
    data = os.urandom(5 * chunk + 4000)
    file = _layout(data, chunk)
    bad = bytearray(data)
    bad[1000] ^= 0xFF
    seen: dict[str, bool] = {}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            first, last = _answer_range(self, len(data))
            self.wfile.write(bad[first : first + chunk])
            self.wfile.flush()
            self.connection.settimeout(10)
            try:
                hung_up = self.connection.recv(1) == b""
            except TimeoutError:
                hung_up = False
            seen["the client hung up before the rest was sent"] = hung_up
            if not hung_up:
                self.wfile.write(bad[first + chunk : last + 1])

    with serving(Handler) as url, pytest.raises(ChunkMismatch) as caught:
        load_url_cpu(f"{url}/f", file, connections=2)
    assert caught.value.tensors == ["t0"] and "t0" in str(caught.value)
    assert seen == {"the client hung up before the rest was sent": True}


def test_chunks_as_they_land_check_every_chunk_whatever_the_pieces() -> None:
    """Pieces of any size, across chunk boundaries, up to a short last chunk: every chunk is
    compared the moment its last byte lands, a flipped byte fails on the piece that completes
    its chunk, and pieces out of order are refused."""
    import random

    from tensor_registry.engine.checks import ChunksAsTheyLand

    chunk = 4096
    data = os.urandom(7 * chunk + 100)
    file = _layout(data, chunk)
    rng = random.Random(0)
    for start in (0, 2 * chunk):
        check = ChunksAsTheyLand(file, start)
        at = start
        while at < len(data):
            n = rng.choice([1, 100, chunk - 1, chunk, chunk + 1, 3 * chunk])
            check(at, memoryview(data)[at : at + n])
            at = min(len(data), at + n)
            assert check.checked == (len(data) if at == len(data) else at // chunk * chunk)
    assert check.checked == len(data)

    bad = bytearray(data)
    bad[3 * chunk + 7] ^= 1
    check = ChunksAsTheyLand(file, 0)
    check(0, memoryview(bad)[: 4 * chunk - 1])  # chunk 3 is not complete yet
    assert check.checked == 3 * chunk
    with pytest.raises(ChunkMismatch) as caught:
        check(4 * chunk - 1, memoryview(bad)[4 * chunk - 1 : 4 * chunk])
    assert caught.value.tensors == ["t3"]

    check = ChunksAsTheyLand(file, 0)
    check(0, memoryview(data)[:100])
    with pytest.raises(ValueError):
        check(200, memoryview(data)[200:300])
    with pytest.raises(ValueError):
        ChunksAsTheyLand(file, 100)


def test_url_load_faults_its_pages_in_ahead_of_the_bytes() -> None:
    """``_Populate`` faults a step of the private mapping in at once (MADV_POPULATE_WRITE),
    so the receives that fill it then take no page faults of their own."""
    import ctypes
    import resource

    from tensor_registry.engine.cpu import _anonymous, _Populate

    step = _Populate.STEP
    mapped = _anonymous(3 * step)
    populate = _Populate(mapped)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapped))

    def faults_writing(start: int, end: int) -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        ctypes.memset(base + start, 1, end - start)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    ahead = populate.ahead(0, 3 * step)  # the first step, at once
    assert faults_writing(0, step) < 16
    ahead(step // 2)  # bytes landed up to half a step in: faulted in to 1.5 steps at least
    assert faults_writing(step, step + step // 2) < 16
    assert faults_writing(2 * step + step // 2, 3 * step) > step // 2 // mmap.PAGESIZE // 2
    assert mapped[:4] == b"\x01" * 4 and mapped[-1:] == b"\x01"
