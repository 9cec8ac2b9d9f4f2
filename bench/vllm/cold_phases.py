"""vLLM 0.24's start, split into its phases from its own log lines (issue 35 §1).

The formats are vLLM 0.24.0's (``vllm/v1/worker/gpu_model_runner.py``, ``compilation/``,
``v1/engine/core.py``, ``utils/mem_utils.py``):

- ``Model loading took X GiB memory and Y seconds``        -> weights (model init + load)
- ``Loading weights took Y seconds``                        -> the default loader's own read
- ``Dynamo bytecode transform time: Y s``                   -> part of compile
- ``torch.compile took Y s in total`` (or ``torch.compile and initial profiling/warmup run
  together took Y s in total``)                             -> compile
- ``Directly load the compiled graph(s) ... from the cache, took Y s``  -> compile, cached
- ``Memory profiling takes Y seconds``                       -> memory profiling
- ``Graph capturing finished in Y secs, took X GiB``         -> CUDA graph capture
- ``init engine (profile, create kv cache, warmup model) took Y s (compilation: C s)``
                                                              -> the engine's whole init
The rest of the start (process start to first token, less the phases) is ``rest``.
"""

from __future__ import annotations

import re
from typing import Any

PATTERNS: dict[str, re.Pattern[str]] = {
    "weights_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "loader_read_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "compile_s": re.compile(
        r"torch\.compile (?:and initial profiling/warmup run together )?"
        r"took ([\d.]+) s in total"
    ),
    "compile_cached_s": re.compile(r"Directly load the compiled graph\(s\) for .*?took ([\d.]+) s"),
    "profile_s": re.compile(r"Memory profiling takes ([\d.]+) seconds"),
    "graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "engine_init_s": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
    ),
    "init_compile_s": re.compile(r"init engine .*?\(compilation: ([\d.]+) s"),
}


def parse_phases(log: str) -> dict[str, float]:
    """Seconds per phase named in ``PATTERNS``, from vLLM's log text (the last of each)."""
    found: dict[str, float] = {}
    for name, pattern in PATTERNS.items():
        hits = pattern.findall(log)
        if hits:
            found[name] = float(hits[-1])
    return found


def split(total_s: float, phases: dict[str, float]) -> dict[str, Any]:
    """The start to first token as weights / compile / graphs / profiling / rest (seconds).
    Compile is torch.compile's total (or the cached load); profiling is the engine's init
    less compile and graphs where vLLM logs no separate profiling line."""
    weights = phases.get("weights_s", 0.0)
    compile_s = phases.get("compile_s", phases.get("compile_cached_s", 0.0))
    graphs = phases.get("graphs_s", 0.0)
    init = phases.get("engine_init_s")
    profile = phases.get("profile_s")
    if profile is None and init is not None:
        profile = max(0.0, init - phases.get("init_compile_s", compile_s) - graphs)
    profile = profile or 0.0
    rest = max(0.0, total_s - weights - compile_s - graphs - profile)
    return {
        "total_s": round(total_s, 3),
        "weights_s": weights,
        "compile_s": compile_s,
        "graphs_s": graphs,
        "profile_s": round(profile, 3),
        "rest_s": round(rest, 3),
    }
