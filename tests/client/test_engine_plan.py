"""The engine's own choice of how to bring a node-cache file onto the GPU (issue 35 §0):
pin it in place or read it through the ring, from what the node measured
(tensor_registry.engine.plan). The rates below are the ones an H100 node showed (issue 35:
registering 7.81 GB took 0.33 s, the pinned copy ran at 51.4 GB/s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensor_registry.engine import cuda as engine_cuda
from tensor_registry.engine import plan, wait_released
from tensor_registry.loading import LoadOptions
from tests.client.test_engine_cuda_flow import _load, artifact, fake_cuda  # noqa: F401

H100 = plan.NodeRates(
    register_gbps=23.7,
    dma_gbps=51.4,
    read_gbps=5.0,
    ring_gbps=3.3,
    filesystem="ext4",
    cores=16,
    probe_s=0.01,
)
RING = 24 * (8 << 20)


def test_a_big_file_goes_through_a_ready_ring_when_registering_is_the_slow_side() -> None:
    choice = plan.choose(7_810_000_000, H100, readers=12, ring_bytes=RING, ring_ready=True)
    assert choice.register_fraction == 0.0
    assert choice.pin_s == pytest.approx(7.81 / 23.7, rel=1e-3)
    assert choice.ring_s == pytest.approx(7.81 / 51.4, rel=1e-3)


def test_a_small_first_load_pins_in_place_rather_than_pay_for_a_fresh_ring() -> None:
    # A vLLM rank's 1.35 GB: the fresh ring (0.06 s here) costs more than pinning the file.
    choice = plan.choose(1_350_000_000, H100, readers=12, ring_bytes=RING, ring_ready=False)
    assert choice.register_fraction == 1.0
    # Once the process holds its ring, the same file goes through it.
    ready = plan.choose(1_350_000_000, H100, readers=12, ring_bytes=RING, ring_ready=True)
    assert ready.register_fraction == 0.0


def test_a_node_whose_readers_copy_slowly_pins_when_registering_outruns_them() -> None:
    slow_copies = plan.NodeRates(60.0, 51.4, 2.0, 3.3, "tmpfs", 16, 0.01)
    choice = plan.choose(10**10, slow_copies, readers=12, ring_bytes=RING, ring_ready=True)
    assert choice.register_fraction == 1.0
    # Where both reach the DMA rate, the ring: pinning stalls every other CUDA call meanwhile.
    fast = plan.NodeRates(60.0, 51.4, 5.0, 3.3, "ext4", 16, 0.01)
    tie = plan.choose(10**10, fast, readers=12, ring_bytes=RING, ring_ready=True)
    assert tie.register_fraction == 0.0
    assert plan.choose(10**10, H100, readers=2, ring_bytes=RING, ring_ready=True).pin_s < 1


def test_the_file_system_is_read_from_the_mount_table(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with path.open("rb") as fh:
        assert plan.filesystem_of(fh.fileno()) not in ("", None)


def test_a_load_left_to_decide_measures_the_node_once_and_says_what_it_chose(
    fake_cuda: Any,  # noqa: F811
    artifact: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, layout, state = artifact
    monkeypatch.setattr(plan, "runtime", engine_cuda.runtime)
    monkeypatch.setattr(plan, "_measured", {})
    probes: list[int] = []
    real = plan._probe

    def counted(*args: Any) -> plan.NodeRates:
        probes.append(1)
        return real(*args)

    monkeypatch.setattr(plan, "_probe", counted)
    for _ in range(2):
        phases: dict[str, Any] = {}
        tensors = _load(path, layout, register_fraction=None, phases=phases)
        for name, expected in state.items():
            assert torch.equal(tensors[name], expected), name
        chosen = phases["plan"]["register_fraction"]
        assert chosen in (0.0, 1.0)
        assert phases["plan"]["register_gbps"] > 0 and phases["plan"]["filesystem"]
        assert (phases.get("registered_bytes", 0) > 0) == (chosen == 1.0)
    assert probes == [1]


def test_a_fraction_the_caller_gives_is_used_without_measuring(
    fake_cuda: Any,  # noqa: F811
    artifact: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, layout, state = artifact
    monkeypatch.setattr(plan, "measure", lambda *a, **k: pytest.fail("measured"))
    phases: dict[str, Any] = {}
    options = LoadOptions(register_fraction=0.5)
    tensors = engine_cuda.load_cuda(
        layout,
        path=path,
        device="cpu:0",
        options=options,
        readers=3,
        block_bytes=128 << 10,
        register_slice=256 << 10,
        digest_on="host",
        phases=phases,
    )
    wait_released()
    assert "plan" not in phases and phases["registered_bytes"] > 0
    assert all(torch.equal(tensors[n], v) for n, v in state.items())


def test_unknown_load_options_are_refused() -> None:
    with pytest.raises(TypeError, match="register_fractio"):
        LoadOptions().given(register_fractio=0.5)
