"""The engine's device BLAKE3 (tensor_registry/engine/gpu_blake3.py, CUDA C in blake3_kernels.cu)
computes the blake3 package's digests, bit for bit, and finds the one chunk whose byte changed.

CI has no GPU: the same source is built by the host C compiler (tensor_registry/engine/kernels.py:
its thread bodies in a loop over CPU tensors) and, for the device, compiled by NVRTC to a cubin
that must hold both kernels. The H200 runs (bench/engine/kernel_start.py,
bench/engine/engine_gpu.py) launch it on the device and check every load against the source tensors.
"""

from __future__ import annotations

import random
from pathlib import Path

import blake3
import pytest
import torch

from tensor_registry.engine import gpu_blake3, kernels
from tensor_registry.formats.layout import FileLayout
from tensor_registry.node_cache import NodeCache

KiB = 1 << 10


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "kernels"
    monkeypatch.setenv("TENSOR_REGISTRY_KERNEL_CACHE", str(cache))
    monkeypatch.setattr(kernels, "_modules", {})
    return cache


def _run(chunk: int, size: int, flip: int | None = None, *, blocks: int = 2) -> dict[str, object]:
    rng = random.Random(size)
    data = bytearray(rng.randbytes(size))
    digests = tuple(
        blake3.blake3(bytes(data[i : i + chunk])).hexdigest() for i in range(0, size, chunk)
    )
    if flip is not None:
        data[flip] ^= 0x40
    layout = FileLayout("model.tensors", size, "", 1, False, chunk, digests, ())
    device = gpu_blake3.DeviceDigests(layout, "cpu")
    staged = torch.frombuffer(data, dtype=torch.uint8)
    # Blocks as the engine's ring hands them over: each starts on a chunk.
    step = -(-size // chunk // blocks) * chunk
    for start in range(0, size, step):
        device.hash_block(staged[start : start + step], start, min(start + step, size))
    return {"bad": device.mismatches(), "tail": device.host_tail()}


def test_a_chunk_of_one_thread_makes_its_root_in_the_leaves_kernel() -> None:
    assert _run(16 * KiB, 3 * 16 * KiB, flip=16 * KiB + 5) == {"bad": [1], "tail": None}


def test_chunks_of_many_subtrees_and_a_shorter_last_chunk_left_to_the_host() -> None:
    """Eight threads per chunk: three parent levels make the roots."""
    out = _run(128 * KiB, 4 * 128 * KiB + 5000, flip=5, blocks=3)
    assert out == {"bad": [0], "tail": (4 * 128 * KiB, 4 * 128 * KiB + 5000)}


def test_the_manifest_chunk_size_finds_the_one_flipped_byte() -> None:
    """8 MiB chunks (the manifests' default): 512 threads per chunk, nine parent levels."""
    chunk = 8 << 20
    out = _run(chunk, 3 * chunk + 77, flip=2 * chunk + 123_456, blocks=3)
    assert out == {"bad": [2], "tail": (3 * chunk, 3 * chunk + 77)}


def test_supported_chunk_sizes() -> None:
    sizes = (8 << 20, 64 * KiB, 16 * KiB, 8 * KiB, 3 << 20, 16 * KiB + 1)
    assert [gpu_blake3.supported(n) for n in sizes] == [True, True, True, False, False, False]


def test_a_staged_block_that_does_not_start_on_16_bytes_is_refused() -> None:
    layout = FileLayout("m", 32 * KiB, "", 1, False, 16 * KiB, ("00" * 32,) * 2, ())
    device = gpu_blake3.DeviceDigests(layout, "cpu")
    staged = torch.zeros(32 * KiB + 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="16 bytes"):
        device.hash_block(staged[4:], 0, 32 * KiB)


def test_the_host_build_is_cached_and_reused(_kernel_cache: Path) -> None:
    kernels.module(gpu_blake3.SOURCE, "cpu")
    built = sorted(p.name for p in _kernel_cache.iterdir())
    assert len(built) == 1 and built[0].endswith(".so")
    kernels._modules.clear()
    before = (_kernel_cache / built[0]).stat().st_mtime_ns
    kernels.module(gpu_blake3.SOURCE, "cpu")
    assert (_kernel_cache / built[0]).stat().st_mtime_ns == before


def test_nvrtc_compiles_the_device_source_to_a_cubin_holding_both_kernels() -> None:
    """What a CUDA node builds on its first load (sm_90: the H200), compiled here by the NVRTC
    wheel CUDA builds of torch ship; NVRTC needs no GPU."""
    cubin = kernels.nvrtc_compile(gpu_blake3.SOURCE.read_bytes(), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert b"leaves" in cubin and b"parents" in cubin
    with pytest.raises(kernels.CudaError, match="NVRTC"):
        kernels.nvrtc_compile(b"this is not CUDA C", "sm_90")


def test_a_kernel_cache_others_can_write_is_not_loaded_from(_kernel_cache: Path) -> None:
    """An attacker who can write the cache could plant a build that runs in the loader: a
    folder or file writable by group or others is refused (and "auto" digests fall back to the
    host threads)."""
    kernels.module(gpu_blake3.SOURCE, "cpu")
    (built,) = _kernel_cache.iterdir()
    kernels._modules.clear()
    built.chmod(0o666)
    with pytest.raises(kernels.CudaError, match="writable by another user"):
        kernels.module(gpu_blake3.SOURCE, "cpu")
    built.chmod(0o600)
    _kernel_cache.chmod(0o777)
    with pytest.raises(kernels.CudaError, match="writable by another user"):
        kernels.module(gpu_blake3.SOURCE, "cpu")
    _kernel_cache.chmod(0o700)
    assert kernels.module(gpu_blake3.SOURCE, "cpu") is not None


def test_the_kernel_cache_lives_under_the_node_cache_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A container that keeps its cache volume (TENSOR_REGISTRY_CACHE_DIR) keeps its built
    # kernels with its weights: a restart loads the cubin instead of building it again.
    monkeypatch.delenv("TENSOR_REGISTRY_KERNEL_CACHE")
    monkeypatch.setenv("TENSOR_REGISTRY_CACHE_DIR", str(tmp_path / "volume"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernels.cache_dir() == tmp_path / "volume" / "kernels"
    assert NodeCache().root == tmp_path / "volume"
    monkeypatch.delenv("TENSOR_REGISTRY_CACHE_DIR")
    assert kernels.cache_dir() == tmp_path / "xdg" / "tensor-registry" / "kernels"
    monkeypatch.setenv("TENSOR_REGISTRY_KERNEL_CACHE", str(tmp_path / "elsewhere"))
    assert kernels.cache_dir() == tmp_path / "elsewhere"
    # Built through the host compiler here (no GPU in CI): the .so lands in that folder.
    kernels.module(gpu_blake3.SOURCE, "cpu")
    assert list((tmp_path / "elsewhere").glob("*.so"))
