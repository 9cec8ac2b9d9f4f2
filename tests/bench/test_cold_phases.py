# ruff: noqa: E501 - vLLM's log lines, copied whole
"""bench/vllm/cold_phases.py reads vLLM 0.24's own start lines (formats copied from its source:
gpu_model_runner.py, compilation/backends.py and monitor.py, v1/engine/core.py)."""

from __future__ import annotations

import pytest

from bench.vllm.cold_phases import parse_phases, split

COLD = """\
(EngineCore_DP0 pid=812) INFO 12-07 00:01:02 [default_loader.py:431] Loading weights took 9.87 seconds
(EngineCore_DP0 pid=812) INFO 12-07 00:01:02 [gpu_model_runner.py:5256] Model loading took 14.99 GiB memory and 10.412345 seconds
(EngineCore_DP0 pid=812) INFO 12-07 00:01:09 [backends.py:1149] Dynamo bytecode transform time: 6.41 s
(EngineCore_DP0 pid=812) INFO 12-07 00:01:31 [backends.py:394] Compiling a graph for compile range (1, 8192) takes 19.02 s
(EngineCore_DP0 pid=812) INFO 12-07 00:01:33 [monitor.py:34] torch.compile took 27.55 s in total
(EngineCore_DP0 pid=812) INFO 12-07 00:01:35 [gpu_worker.py:509] Available KV cache memory: 51.2 GiB
(EngineCore_DP0 pid=812) INFO 12-07 00:01:49 [gpu_model_runner.py:6657] Graph capturing finished in 13 secs, took 0.52 GiB
(EngineCore_DP0 pid=812) INFO 12-07 00:01:49 [core.py:345] init engine (profile, create kv cache, warmup model) took 46.10 s (compilation: 27.55 s)
(APIServer pid=700) INFO 12-07 00:01:51 [api_server.py:581] Starting vLLM server on http://127.0.0.1:8000
"""

WARM = """\
(EngineCore_DP0 pid=9) INFO [gpu_model_runner.py:303] Model loading took 14.99 GiB and 0.612000 seconds
(EngineCore_DP0 pid=9) INFO [backends.py:293] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.412 s
(EngineCore_DP0 pid=9) INFO [gpu_model_runner.py:6657] Graph capturing finished in 12 secs, took 0.52 GiB
(EngineCore_DP0 pid=9) INFO [core.py:345] init engine (profile, create kv cache, warmup model) took 17.00 s
"""


def test_a_cold_start_splits_into_vllms_phases() -> None:
    phases = parse_phases(COLD)
    assert phases == {
        "weights_s": 10.412345,
        "loader_read_s": 9.87,
        "dynamo_s": 6.41,
        "compile_s": 27.55,
        "graphs_s": 13.0,
        "engine_init_s": 46.10,
        "init_compile_s": 27.55,
    }
    row = split(80.0, phases)
    assert row["compile_s"] == 27.55 and row["graphs_s"] == 13.0
    assert row["profile_s"] == pytest.approx(46.10 - 27.55 - 13.0, abs=1e-3)
    total = row["weights_s"] + row["compile_s"] + row["graphs_s"] + row["profile_s"] + row["rest_s"]
    assert total == pytest.approx(80.0, abs=1e-3)


def test_a_start_from_a_warm_compile_cache_counts_the_cached_load_as_compile() -> None:
    phases = parse_phases(WARM)
    assert phases["compile_cached_s"] == 2.412 and "compile_s" not in phases
    assert phases["weights_s"] == 0.612
    row = split(30.0, phases)
    assert row["compile_s"] == 2.412
    assert row["profile_s"] == pytest.approx(17.0 - 2.412 - 12.0, abs=1e-3)


def test_an_eager_start_has_no_compile_or_graphs() -> None:
    text = "INFO [core.py:345] init engine (profile, create kv cache, warmup model) took 3.20 s\n"
    row = split(12.0, parse_phases(text))
    assert (row["compile_s"], row["graphs_s"], row["profile_s"]) == (0.0, 0.0, 3.2)
