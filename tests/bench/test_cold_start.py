"""bench/vllm/cold_start.py's arms: the vllm serve command and the node each starts on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.vllm.cold_start import ARMS, node_env, plan_arms, prepare_node, ratios, serve_command


def test_each_arm_asks_vllm_for_its_loader() -> None:
    config = {"tensorizer_uri": "http://127.0.0.1:1/blob?sig=x", "num_readers": 8}
    base = serve_command("baseline", model="/m", port=8000)
    assert "--load-format" not in base and "--model-loader-extra-config" not in base
    url = serve_command("tensorizer-url", model="/m", port=8000, extra_config=config)
    assert url[url.index("--load-format") + 1] == "tensorizer"
    assert json.loads(url[url.index("--model-loader-extra-config") + 1]) == config
    for arm in ("plugin", "plugin-warm", "warm-restart", "eager"):
        command = serve_command(arm, model="/m", port=8000, extra_config={"model": "a/b:prod"})
        assert command[command.index("--load-format") + 1] == "tensor-registry"
        assert ("--enforce-eager" in command) is (arm == "eager")
    with pytest.raises(ValueError):
        serve_command("nope", model="/m", port=1)


def test_every_cold_node_is_fresh_and_the_warm_ones_reuse_the_plugin_nodes_caches(
    tmp_path: Path,
) -> None:
    arms = {a.name: a for a in plan_arms(tmp_path)}
    assert list(arms) == list(ARMS)
    assert arms["warm-restart"].node == arms["plugin"].node
    prepare_node(arms["plugin"])
    compiled = arms["plugin"].node / "vllm" / "torch_compile_cache" / "abc" / "graph.py"
    compiled.parent.mkdir(parents=True)
    compiled.write_text("compiled")
    (arms["plugin"].node / "node-cache" / "weights").write_text("w")
    prepare_node(arms["plugin-warm"])
    warm = arms["plugin-warm"].node
    assert (warm / "vllm" / "torch_compile_cache" / "abc" / "graph.py").read_text() == "compiled"
    assert not (warm / "node-cache" / "weights").exists()  # weights stay cold
    prepare_node(arms["warm-restart"])  # the same node again, untouched
    assert compiled.exists()
    env = node_env(warm, {"PATH": "/bin"})
    assert env["VLLM_CACHE_ROOT"] == str(warm / "vllm") and env["PATH"] == "/bin"


def test_the_issues_ratios() -> None:
    got = ratios({"baseline": 90.0, "plugin-warm": 23.0, "warm-restart": 20.0})
    assert got["plugin_warm_over_warm_restart"] == pytest.approx(1.15)
    assert got["baseline_over_plugin_warm"] == pytest.approx(90 / 23)
    assert ratios({"baseline": 1.0}) == {}
