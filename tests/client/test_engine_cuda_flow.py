"""load_cuda's control flow without a GPU: its CUDA calls faked, everything else real.

The device loads are measured on the H200 (bench/engine/engine_gpu.py); CI has no GPU, so here the
streams, events, the runtime's async copies (tensor_registry/engine/copies.py: done at once,
with memmove) and ``cudaHostRegister`` are stand-ins and the "device" is host memory, while
the frontier, the pinned-ring readers, the pinning thread's mapped slices and the chunk checks
on host threads all run for real: every byte must land in its tensor, in every mode, and a
flipped byte on either path must fail the load naming its tensor."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.loopback import QuietHandler, serving
from tensor_registry.engine import cuda as engine_cuda
from tensor_registry.engine import gpu_blake3, pinned
from tensor_registry.engine.checks import ChunkMismatch
from tensor_registry.formats.layout import FileLayout, build_file_layout

KiB = 1 << 10


class _Event:
    def record(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class _Cudart:
    def __init__(self) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, address: int, length: int, flags: int) -> int:
        self.registered.append((address, length))
        return 0

    def cudaHostUnregister(self, address: int) -> int:
        self.unregistered.append(address)
        return 0


class _Runtime:
    """tensor_registry.engine.copies.CudaRuntime on the host: each copy done at once, between host
    addresses (the "device" allocation is host memory here); events and streams have nothing
    to wait for."""

    def __init__(self) -> None:
        self.copies = 0
        self.events: set[int] = set()
        self.made = itertools.count(1)

    def copy(self, dst: int, src: int, length: int, stream: int) -> None:
        assert stream and length > 0
        ctypes.memmove(dst, src, length)
        self.copies += 1

    def event(self) -> int:
        event = next(self.made)
        self.events.add(event)
        return event

    def record(self, event: int, stream: int) -> None:
        assert event in self.events

    def wait(self, event: int) -> None:
        assert event in self.events

    def destroy(self, event: int) -> None:
        self.events.remove(event)

    def sync(self, stream: int) -> None:
        assert stream


def _host_ring(count: int, size: int) -> pinned.PinnedRing:
    ring = pinned.PinnedRing.__new__(pinned.PinnedRing)
    ring.count, ring.size = count, size
    ring.how, ring.fill_s = "host", 0.0
    ring.complete = threading.Event()
    ring.complete.set()
    ring.free = queue.SimpleQueue()
    for index in range(count):
        ring.free.put((torch.empty(size, dtype=torch.uint8), index))
    return ring


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> _Cudart:
    cudart = _Cudart()
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(
        torch.cuda, "Stream", lambda device=None: type("Stream", (), {"cuda_stream": 7})()
    )
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(engine_cuda, "shared_ring", _host_ring)
    monkeypatch.setattr(pinned, "cuda_runtime_library", lambda: cudart)
    runtime = _Runtime()
    monkeypatch.setattr(engine_cuda, "runtime", lambda: runtime)
    cudart.runtime = runtime  # type: ignore[attr-defined]
    return cudart


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[Path, FileLayout, dict[str, torch.Tensor]]:
    """A tensorizer file of odd-sized tensors (so blocks and slices cut through them), with
    64 KiB chunks so a 3 MB file has many blocks, slices and chunks."""
    from tensorizer import TensorSerializer

    g = torch.Generator().manual_seed(7)
    state = {
        f"layer{i}.weight": torch.randn(97 + 13 * i, 61 + i, generator=g).to(torch.bfloat16)
        for i in range(24)
    }
    state["bias"] = torch.randn(3, generator=g)
    path = tmp_path / "model.tensors"
    serializer = TensorSerializer(str(path))
    serializer.write_state_dict(state)
    serializer.close()
    with path.open("rb") as fh:
        layout = build_file_layout(fh, path.name, size=path.stat().st_size, chunk_bytes=64 * KiB)
    return path, layout, state


def _load(path: Path, layout: FileLayout, **options: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "device": "cpu:0",
        "readers": 3,
        "block_bytes": 128 * KiB,
        "register_slice": 256 * KiB,
        "digest_on": "host",
        "hash_threads": 2,
        "register_fraction": 0.0,  # the modes below set it; the node's own choice: test_engine_plan
    }
    tensors = engine_cuda.load_cuda(layout, path=path, **{**defaults, **options})
    pinned.wait_released()
    return tensors


MODES = [
    pytest.param({}, id="ring"),
    pytest.param({"register_fraction": 0.5}, id="fixed-half"),
    pytest.param({"register_fraction": 1.0, "balance": True}, id="balanced"),
    pytest.param({"register_fraction": 1.0}, id="pinning-only"),
]


# How a load is checked: unverified, chunk digests on host threads, or on the "device" (the
# kernels' host build over the staging buffers: the device path's staging, hashing and
# scatter all run, tensor_registry/engine/kernels.py).
CHECKS = [
    pytest.param({"verify": True}, id="host-digests"),
    pytest.param({"verify": True, "digest_on": "device"}, id="device-digests"),
    pytest.param({"verify": False}, id="unverified"),
]


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSOR_REGISTRY_KERNEL_CACHE", str(tmp_path / "kernels"))


@pytest.mark.parametrize("options", MODES)
@pytest.mark.parametrize("check", CHECKS)
def test_every_byte_lands_in_its_tensor(
    fake_cuda: _Cudart, artifact: Any, options: dict[str, Any], check: dict[str, Any]
) -> None:
    path, layout, state = artifact
    phases: dict[str, Any] = {}
    tensors = _load(path, layout, phases=phases, **check, **options)
    assert set(tensors) == set(state)
    for name, expected in state.items():
        assert torch.equal(tensors[name], expected), name
    registered = phases.get("registered_bytes", 0)
    fraction = options.get("register_fraction", 0)
    if fraction and not options.get("balance"):
        # A fixed split: the pinning thread took the tail from the block boundary down.
        floor = int(layout.size * (1 - fraction)) // (128 * KiB) * (128 * KiB)
        assert registered == layout.size - floor and fake_cuda.registered
    elif not fraction:
        assert registered == 0 and not fake_cuda.registered
    # (balanced: wherever the two sides met, which may be before the pinning took anything)
    if fraction == 1.0 and not options.get("balance"):
        assert phases["ring_buffers"] == 0  # pinning takes it all: no pinned ring is allocated
    assert len(fake_cuda.unregistered) == len(fake_cuda.registered)  # every slice unpinned
    assert fake_cuda.runtime.copies > 0 and not fake_cuda.runtime.events  # all destroyed
    if options.get("register_fraction", 0) < 1:
        assert phases["readers_read_s"] > 0  # the readers' own accounting (bench phases)
        first, done = phases["readers_first_s"], phases["readers_done_s"]
        assert 0 < first[0] <= first[1] <= done[1] <= phases["issued_s"] and done[0] <= done[1]
    expected = check.get("digest_on", "host") if check["verify"] else "none"
    assert phases["digest_on"] == expected


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x55]))


def test_each_reader_keeps_two_buffers_of_its_own_and_gives_them_back(
    fake_cuda: _Cudart, artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader takes READER_BUFFERS buffers from the process's ring (one at once, the next
    while it reads, never waiting for one while it holds one) and cycles through them, each
    copied on its own stream; at the end every buffer is back in the ring and every event is
    destroyed."""
    path, layout, state = artifact
    taken: dict[int, set[int]] = {}
    rings: list[pinned.PinnedRing] = []

    def ring(count: int, size: int) -> pinned.PinnedRing:
        made = _host_ring(count, size)
        take, try_take = made.take, made.try_take

        def log(got: Any) -> Any:
            if got is not None:
                taken.setdefault(threading.get_ident(), set()).add(got[1])
            return got

        made.take = lambda: log(take())  # type: ignore[method-assign]
        made.try_take = lambda: log(try_take())  # type: ignore[method-assign]
        rings.append(made)
        return made

    monkeypatch.setattr(engine_cuda, "shared_ring", ring)
    phases: dict[str, Any] = {}
    tensors = _load(path, layout, readers=3, phases=phases)
    assert all(torch.equal(tensors[name], expected) for name, expected in state.items())
    # (a reader that started after the others took every block takes nothing)
    assert 1 <= len(taken) <= 3
    assert all(len(mine) <= engine_cuda.READER_BUFFERS for mine in taken.values())
    assert max(len(mine) for mine in taken.values()) == 2  # a second one, taken as it read
    assert rings[0].free.qsize() == rings[0].count == phases["ring_buffers"]
    assert not fake_cuda.runtime.events


def test_readers_share_a_ring_smaller_than_two_buffers_each(
    fake_cuda: _Cudart, artifact: Any
) -> None:
    """Three readers, two buffers in all: a reader waits for a buffer only while it holds none,
    so they share without waiting on one another for ever."""
    path, layout, state = artifact
    done: list[dict[str, Any]] = []
    loading = threading.Thread(
        target=lambda: done.append(_load(path, layout, readers=3, ring_buffers=2)), daemon=True
    )
    loading.start()
    loading.join(60)
    assert done, "the load did not finish"
    assert all(torch.equal(done[0][name], expected) for name, expected in state.items())


def test_small_blocks_for_a_file_only_when_nothing_is_pinned(
    fake_cuda: _Cudart, artifact: Any
) -> None:
    """8 MiB blocks (one chunk of the manifest's digests at most) for a local file read only by
    the ring; 64 MiB where the pinning thread also runs (while it pins, every other CUDA call of
    the process waits, and small blocks wait more often) and over a URL."""
    path, layout, _ = artifact
    seen = {}
    for fraction in (0.0, 0.5):
        phases: dict[str, Any] = {}
        _load(path, layout, block_bytes=None, register_fraction=fraction, phases=phases)
        seen[fraction] = phases["block_bytes"]
    phases = {}
    with _url_of(path) as url:
        _load_url(url, layout, block_bytes=None, phases=phases)
    assert seen == {0.0: engine_cuda.FILE_BLOCK_BYTES, 0.5: engine_cuda.BLOCK_BYTES}
    assert phases["block_bytes"] == engine_cuda.BLOCK_BYTES == 64 << 20


@pytest.mark.parametrize("options", MODES)
@pytest.mark.parametrize("where", ["first tensor", "last tensor"])
@pytest.mark.parametrize("digest_on", ["host", "device"])
def test_a_flipped_byte_fails_the_load_naming_its_tensor(
    fake_cuda: _Cudart, artifact: Any, options: dict[str, Any], where: str, digest_on: str
) -> None:
    """The first tensor is read by the ring (unless everything is pinned), the last one lies in
    the pinned tail (when anything is): both paths check every chunk."""
    path, layout, _ = artifact
    tensors = [t for t in layout.tensors if t.data_length]
    target = tensors[0] if where == "first tensor" else tensors[-1]
    _flip(path, target.data_offset + target.data_length // 2)
    with pytest.raises(ChunkMismatch) as caught:
        _load(path, layout, verify=True, digest_on=digest_on, **options)
    assert target.name in caught.value.tensors
    assert target.name in str(caught.value)


class _RangeFile(QuietHandler):
    """Exact byte ranges of ``path`` (206), as the registry's blob route answers them;
    ``cut`` ends every body that starts at ``cut_from`` or later that many bytes early and
    closes (a connection lost mid-range, where tensors' bytes go missing)."""

    path: Path
    cut = 0
    cut_from = 0

    def do_GET(self) -> None:
        data = self.path_bytes()
        first, last = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        last = min(last, len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        cut = self.cut if first >= self.cut_from else 0
        self.wfile.write(data[first : last + 1 - cut])
        if cut:
            self.close_connection = True

    def path_bytes(self) -> bytes:
        return type(self).path.read_bytes()


@contextlib.contextmanager
def _url_of(path: Path, cut: int = 0, cut_from: int = 0) -> Any:
    handler = type("Handler", (_RangeFile,), {"path": path, "cut": cut, "cut_from": cut_from})
    with serving(handler) as base:
        yield f"{base}/model.tensors"


def _load_url(url: str, layout: FileLayout, **options: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "device": "cpu:0",
        "readers": 3,
        "block_bytes": 128 * KiB,
        "digest_on": "host",
        "hash_threads": 2,
    }
    return engine_cuda.load_cuda(layout, url=url, **{**defaults, **options})


@pytest.mark.parametrize("check", CHECKS)
def test_every_byte_lands_over_the_signed_url(
    fake_cuda: _Cudart, artifact: Any, check: dict[str, Any]
) -> None:
    """Over a URL only the pinned ring runs, each reader on its own keep-alive connection
    taking its blocks' bodies straight from the socket (sources._receive_all)."""
    path, layout, state = artifact
    phases: dict[str, Any] = {}
    with _url_of(path) as url:
        tensors = _load_url(url, layout, phases=phases, **check)
    assert set(tensors) == set(state)
    for name, expected in state.items():
        assert torch.equal(tensors[name], expected), name
    assert not fake_cuda.registered and phases["readers_read_s"] > 0


class _HeldLastBlock(_RangeFile):
    """Sends each range but its last block, then holds that block back until the client has
    asked for another range (or ``hold`` seconds pass): a loader that asks for its next span
    only once this one is read waits out every hold. Records (client port, first byte) of every
    request and, per held block, whether the next request came while it was held."""

    block = 128 * KiB
    hold = 10.0
    requests: list[tuple[int, int]]
    ahead: list[bool]
    arrived: threading.Condition

    def do_GET(self) -> None:
        data = self.path_bytes()
        first, last = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        cls = type(self)
        with cls.arrived:
            cls.requests.append((self.client_address[1], first))
            cls.arrived.notify_all()
            seen = len(cls.requests)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        held = first + (last - first) // self.block * self.block  # the last block's start
        self.wfile.write(data[first:held])
        if last + 1 < len(data):  # a reader with more to claim asks for it now
            with cls.arrived:
                cls.ahead.append(cls.arrived.wait_for(lambda: len(cls.requests) > seen, self.hold))
        self.wfile.write(data[held : last + 1])


@pytest.mark.parametrize("ahead", [True, False])
def test_a_reader_asks_for_its_next_span_while_the_last_block_arrives(
    fake_cuda: _Cudart, artifact: Any, ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One reader: each span's last block is held back by the server until the next request
    comes. With ``LoadOptions.url_ahead`` it comes at once, on the reader's second connection
    (the two connections take turns); with one connection it never can, and every hold runs out."""
    path, layout, state = artifact
    handler = type(
        "Handler",
        (_HeldLastBlock,),
        {
            "path": path,
            "requests": [],
            "ahead": [],
            "arrived": threading.Condition(),
            "hold": 10.0 if ahead else 0.2,
        },
    )
    with serving(handler) as base:
        tensors = _load_url(f"{base}/model.tensors", layout, readers=1, url_ahead=ahead)
    for name, expected in state.items():
        assert torch.equal(tensors[name], expected), name
    firsts = [first for _, first in handler.requests]
    assert firsts == sorted(set(firsts)) and firsts[0] == 0 and len(firsts) >= 3  # once each
    ports = [port for port, _ in handler.requests]
    assert handler.ahead and all(handler.ahead) is ahead and any(handler.ahead) is ahead
    if ahead:
        assert len(set(ports)) == 2 and all(a != b for a, b in itertools.pairwise(ports))
    else:
        assert len(set(ports)) == 1


@pytest.mark.parametrize("digest_on", ["host", "device"])
def test_a_flipped_byte_behind_the_url_names_its_tensor(
    fake_cuda: _Cudart, artifact: Any, digest_on: str
) -> None:
    path, layout, _ = artifact
    target = [t for t in layout.tensors if t.data_length][-1]
    _flip(path, target.data_offset + target.data_length // 3)
    with _url_of(path) as url, pytest.raises(ChunkMismatch) as caught:
        _load_url(url, layout, verify=True, digest_on=digest_on)
    assert target.name in caught.value.tensors and target.name in str(caught.value)


def test_a_connection_lost_mid_range_fails_naming_the_missing_tensors(
    fake_cuda: _Cudart, artifact: Any
) -> None:
    path, layout, _ = artifact
    past_index = -(-layout.tensors[0].data_offset // (128 * KiB)) * (128 * KiB)
    with (
        _url_of(path, cut=60000, cut_from=past_index) as url,
        pytest.raises(ChunkMismatch, match="only") as caught,
    ):
        _load_url(url, layout, verify=True)
    assert caught.value.tensors and all(n in str(caught.value) for n in caught.value.tensors)


def test_a_truncated_file_is_refused_before_any_copy(fake_cuda: _Cudart, artifact: Any) -> None:
    path, layout, _ = artifact
    os.truncate(path, layout.size - 1000)
    with pytest.raises(ChunkMismatch, match="only") as caught:
        _load(path, layout, verify=True, register_fraction=0.5)
    assert caught.value.tensors == [layout.tensors[-1].name] or caught.value.tensors
    assert not fake_cuda.registered


def test_auto_digests_fall_back_to_the_host_where_the_kernels_cannot_be_built(
    artifact: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No CUDA driver here (CPU torch): "auto" hashes on the host threads, "device" fails, and
    a chunk size the kernels cannot hash is refused by name."""
    _, layout, _ = artifact
    device = torch.device("cuda", 0)
    monkeypatch.setattr(gpu_blake3, "_warm", set())
    monkeypatch.setattr(gpu_blake3, "DEVICE_DIGESTS_FROM", 0)  # "auto" tries the device
    assert gpu_blake3.device_digests(layout, device, "auto") is None
    assert (str(device), layout.chunk_bytes) not in gpu_blake3._warm
    monkeypatch.setattr(gpu_blake3, "DEVICE_DIGESTS_FROM", 2 * 10**9)
    with pytest.raises((RuntimeError, AssertionError, OSError)):
        gpu_blake3.device_digests(layout, device, "device")
    odd = FileLayout("m", layout.size, "", 1, False, 48 * KiB, layout.chunks, ())
    with pytest.raises(ValueError, match="49152 cannot be hashed"):
        gpu_blake3.device_digests(odd, "cpu", "device")
    # A small file stays on the host threads until the kernels ran in this process.
    assert gpu_blake3.device_digests(layout, "cpu", "auto") is None
    assert gpu_blake3.device_digests(layout, "cpu", "device") is not None  # the host build
    assert gpu_blake3.device_digests(layout, "cpu", "auto") is not None  # now warm here
    monkeypatch.setattr(gpu_blake3, "_warm", set())
    monkeypatch.setattr(gpu_blake3, "DEVICE_DIGESTS_FROM", layout.size)
    assert gpu_blake3.device_digests(layout, "cpu", "auto") is not None  # a big file


def test_the_ring_is_one_mapping_faulted_in_by_threads_and_pinned_buffer_by_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ring's buffers are views of one anonymous mapping: threads fault each buffer in
    (MADV_POPULATE_WRITE) and it is registered on its own and handed out at once, so a first
    load reads after one buffer instead of after the ring (cudaHostAlloc costs a fresh process
    ≈ 0.45 s per GB on one thread). Each buffer is its own zeroed, writable span."""
    cudart = _Cudart()
    cudart.engine_source = "fake"  # type: ignore[attr-defined]
    monkeypatch.setattr(pinned, "cuda_runtime_library", lambda: cudart)
    populated: list[tuple[int, int, bool]] = []
    real = pinned.prefault.populate

    def populate(address: int, length: int, *, write: bool) -> bool:
        populated.append((address, length, write))
        return real(address, length, write=write)

    monkeypatch.setattr(pinned.prefault, "populate", populate)
    count, size = 5, (1 << 20) + 4096
    ring = pinned.PinnedRing(count, size)
    buffers = [ring.take() for _ in range(count)]  # each handed out as the filler makes it
    assert ring.complete.wait(10) and ring.how == "register" and ring.error is None
    base = cudart.registered[0][0]
    assert base % (2 << 20) == 0  # aligned for transparent huge pages
    assert cudart.registered == [(base + i * size, size) for i in range(count)]
    pieces = sorted(populated)
    assert len(pieces) > count and all(w for _, _, w in pieces)
    assert pieces[0][0] == base and sum(n for _, n, _ in pieces) == count * size
    assert all(a + n == b for (a, n, _), (b, _, _) in itertools.pairwise(pieces))
    assert [index for _, index in buffers] == list(range(count))
    assert [b.data_ptr() for b, _ in buffers] == [base + i * size for i in range(count)]
    for buffer, index in buffers:
        assert buffer.numel() == size and int(torch.count_nonzero(buffer)) == 0
        buffer.fill_(index + 1)
    for buffer, index in buffers:
        assert bool((buffer == index + 1).all())


def test_a_process_keeps_its_ring_for_the_next_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first load that needs a ring makes it (filling in the background); the next one
    of the same shape gets the same buffers, filled."""
    cudart = _Cudart()
    cudart.engine_source = "fake"  # type: ignore[attr-defined]
    monkeypatch.setattr(pinned, "cuda_runtime_library", lambda: cudart)
    monkeypatch.setattr(pinned, "_rings", {})
    ring = pinned.shared_ring(3, 8192)
    assert ring.complete.wait(10) and ring.fill_s is not None
    assert pinned.shared_ring(3, 8192) is ring and len(cudart.registered) == 3
    assert pinned.shared_ring(4, 8192) is not ring


def test_a_ring_that_cannot_be_allocated_fails_its_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If neither the mapping nor torch can pin the ring, every reader waiting for a buffer
    gets the error instead of waiting for ever."""
    monkeypatch.setattr(pinned, "_anonymous", lambda length: None)

    def no_pinned(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("out of pinned memory")

    monkeypatch.setattr(torch, "empty", no_pinned)
    ring = pinned.PinnedRing(2, 4096)
    assert ring.complete.wait(10)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="pinned ring") as caught:
            ring.take()
        assert "out of pinned memory" in str(caught.value.__cause__)


def test_the_ring_falls_back_to_torch_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the driver refuses to register the mapping, or only torch's binding of the
    runtime is there (it holds the GIL), the mapping is not used and torch pins the buffers."""
    refusing = _Cudart()
    refusing.engine_source = "fake"  # type: ignore[attr-defined]
    refusing.cudaHostRegister = lambda address, length, flags: 1  # type: ignore[method-assign]
    asked: list[bool] = []
    real_empty = torch.empty

    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        if threading.current_thread() is threading.main_thread():  # not other tests' rings
            asked.append(pin_memory)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    for cudart in (refusing, _Cudart()):  # the second: no engine_source, torch's binding
        monkeypatch.setattr(pinned, "cuda_runtime_library", lambda c=cudart: c)
        asked.clear()
        ring = pinned.PinnedRing(3, 4096, background=False)
        buffers = [ring.take() for _ in range(3)]
        assert ring.complete.is_set()
        assert ring.how == "torch" and asked == [True, True, True]
        assert sorted(index for _, index in buffers) == [0, 1, 2]
