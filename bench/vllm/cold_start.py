"""The whole start of ``vllm serve``, process start to the first generated token, per phase
(issue 35 §1). Written and CPU-checked (the commands and environments of every arm, the phase
split of vLLM's log lines: tests/bench/); the GPU runs are still to be made.

    python3 bench/vllm/cold_start.py --model-dir M --registry URL --out $OUT   # vLLM, one GPU

Arms, each a fresh ``vllm serve`` on a cold node (fresh cache directories: VLLM_CACHE_ROOT,
TRITON_CACHE_DIR, XDG_CACHE_HOME, the registry's node cache), interleaved:

- ``baseline``: vLLM's default loader from the safetensors source (what a user has today);
- ``tensorizer-url``: vLLM's tensorizer loader from the registry's signed URL (the resolve
  answer's ``vllm`` block);
- ``plugin``: ``--load-format tensor-registry``, node cache cold;
- ``plugin-warm``: the same with warm state restored before the start. Until the registry's
  warm bundle exists (issue 35 §2) this is emulated: the ``plugin`` arm's VLLM_CACHE_ROOT and
  TRITON_CACHE_DIR are copied into the fresh node's before it starts (said in the results);
- ``warm-restart``: the ``plugin`` arm's node started again, every cache warm (the ceiling);
- ``eager``: the plugin with ``--enforce-eager`` (no compile, no graphs).

Each start is timed from ``Popen`` to the first token of a real ``/v1/completions`` request
(``max_tokens`` 1, streamed), and split into vLLM's phases from its own log lines
(bench/vllm/cold_phases.py). Ratios: plugin-warm ÷ warm-restart (target ≤ 1.15) and baseline ÷
plugin-warm (target ≥ 3), to first token.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

ARMS = ("baseline", "tensorizer-url", "plugin", "plugin-warm", "warm-restart", "eager")
# The caches vLLM 0.24 reads at start (torch.compile / Inductor live under VLLM_CACHE_ROOT).
CACHE_VARIABLES = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "XDG_CACHE_HOME": "xdg",
    "TENSOR_REGISTRY_CACHE_DIR": "node-cache",
}
WARM_COPIED = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR")


@dataclass
class Arm:
    name: str
    node: Path  # the node's cache root
    args: list[str] = field(default_factory=list)
    restore_from: Path | None = None  # another node whose compile caches are copied in first


def node_env(node: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment of a start on ``node``: every cache vLLM and the plugin read, under it."""
    env = dict(base)
    for variable, folder in CACHE_VARIABLES.items():
        env[variable] = str(node / folder)
    return env


def serve_command(
    arm: str,
    *,
    model: str,
    port: int,
    extra_config: dict[str, object] | None = None,
    python: str = "python3",
) -> list[str]:
    """``vllm serve`` for ``arm``: ``model`` is the safetensors directory (baseline) or the
    model's config directory; ``extra_config`` the loader's (the tensorizer block of the resolve
    answer, or what ``tensor-registry vllm-args --loader tensor-registry`` prints)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}")
    command = [python, "-m", "vllm.entrypoints.cli.main", "serve", model]
    command += ["--port", str(port), "--host", "127.0.0.1", "--dtype", "bfloat16"]
    command += ["--max-model-len", "4096", "--gpu-memory-utilization", "0.85"]
    if arm == "tensorizer-url":
        command += ["--load-format", "tensorizer"]
    elif arm != "baseline":
        command += ["--load-format", "tensor-registry"]
    if arm != "baseline":
        command += ["--model-loader-extra-config", json.dumps(extra_config or {})]
    if arm == "eager":
        command.append("--enforce-eager")
    return command


def plan_arms(root: Path, order: tuple[str, ...] = ARMS) -> list[Arm]:
    """One fresh node per arm, except ``warm-restart`` (the ``plugin`` arm's node again) and
    ``plugin-warm`` (a fresh node with the ``plugin`` node's compile caches copied in)."""
    arms: dict[str, Arm] = {}
    for name in order:
        if name == "warm-restart":
            arms[name] = Arm(name, root / "plugin")
        elif name == "plugin-warm":
            arms[name] = Arm(name, root / name, restore_from=root / "plugin")
        else:
            arms[name] = Arm(name, root / name)
    return [arms[n] for n in order]


def prepare_node(arm: Arm) -> None:
    """A cold node is fresh folders; a restored one gets the source node's compile caches."""
    if arm.name == "warm-restart":
        return
    if arm.node.exists():
        shutil.rmtree(arm.node)
    for folder in CACHE_VARIABLES.values():
        (arm.node / folder).mkdir(parents=True)
    if arm.restore_from is not None:
        for variable in WARM_COPIED:
            folder = CACHE_VARIABLES[variable]
            shutil.copytree(arm.restore_from / folder, arm.node / folder, dirs_exist_ok=True)


def ratios(first_token_s: dict[str, float]) -> dict[str, float]:
    """The issue's two ratios, to first token, where both arms ran."""
    out: dict[str, float] = {}
    if "plugin-warm" in first_token_s and "warm-restart" in first_token_s:
        out["plugin_warm_over_warm_restart"] = (
            first_token_s["plugin-warm"] / first_token_s["warm-restart"]
        )
    if "baseline" in first_token_s and "plugin-warm" in first_token_s:
        out["baseline_over_plugin_warm"] = first_token_s["baseline"] / first_token_s["plugin-warm"]
    return out


def now() -> float:
    return time.perf_counter()


if __name__ == "__main__":  # pragma: no cover - the GPU driver is the part still to write
    raise SystemExit(
        "cold_start.py: the arms, commands and phase split are here (tests/bench/); the driver "
        "that starts vllm serve and sends the first request is still to be written: "
        + os.path.basename(__file__)
    )
