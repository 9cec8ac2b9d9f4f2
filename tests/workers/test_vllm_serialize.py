"""`serialize_vllm`: the child process that runs vLLM's serializer, its files, key, errors, cancel.

vLLM cannot be installed on CI machines (it needs CUDA and a torch of its own), so these tests put
a small stand-in package named `vllm` on the child's path. It has exactly the interface that
`tensor_registry_server.artifacts.making.vllm_serialize` uses, as it is in vLLM 0.24 (checked
against the
real one on an H200:
`bench/vllm/vllm_check.py`, results in bench/results/tensorize.md): `EngineArgs`,
`LLMEngine.from_vllm_config(...).collective_rpc(fn, kwargs=...)` calling `fn(worker, ...)` once
per tensor-parallel rank, and `model_executor.model_loader.tensorizer` with `TensorizerConfig`,
`serialize_vllm_model` (registers the marker parameter and writes with `TensorSerializer`) and
`serialize_extra_artifacts`, which here fails the way vLLM's does without the Hub.
What is tested is the registry's side: the child process, the files it reports, the key kept
off command lines, errors surfacing, and a cancelled job killing the child's process group.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from tensor_registry_server.artifacts.making.serialize import (
    SerializeError,
    new_encryption_key,
    serialize_vllm,
)
from tensor_registry_server.artifacts.making.tensorfile import (
    inspect_tensors,
    load_state_dict,
    verify_tensors,
)

FAKE_VLLM = {
    "vllm/__init__.py": '__version__ = "0.24.0+standin"\n',
    # Runs as the child's interpreter starts (PYTHONPATH holds the stand-in), before torch or
    # vllm is imported: the timeout test learns the child's pid even when a loaded machine
    # spends its whole timeout importing torch.
    "sitecustomize.py": """
        import json, os

        started = os.environ.get("STANDIN_STARTED")
        if started:
            with open(started, "w") as f:
                json.dump({"pid": os.getpid()}, f)
    """,
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
        class EngineArgs:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

            def create_engine_config(self):
                return self.kwargs
    """,
    "vllm/distributed/__init__.py": """
        RANK = 0

        def get_tensor_model_parallel_rank():
            return RANK
    """,
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/llm_engine.py": """
        import json, os, sys, time
        import torch
        import vllm.distributed


        class Worker:
            def __init__(self, rank, config):
                self.rank, self.model_config = rank, config

            def get_model(self):
                torch.manual_seed(self.rank)
                return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))


        class LLMEngine:
            def __init__(self, config):
                self.config = config

            @classmethod
            def from_vllm_config(cls, config):
                record = os.environ.get("STANDIN_RECORD")
                if record:
                    with open(record, "w") as f:
                        json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "argv": sys.argv,
                                   "config": config, "env": dict(os.environ)}, f)
                mode = os.environ.get("STANDIN_MODE", "")
                if mode == "fail":
                    raise RuntimeError("engine failed to start: CUDA out of memory (stand-in)")
                if mode == "hang":
                    open(os.path.join(os.environ["STANDIN_OUT"], "model.tensors"), "wb").write(
                        b"x" * 4096)
                    while True:
                        time.sleep(1)
                return cls(config)

            def collective_rpc(self, method, kwargs=None):
                results = []
                for rank in range(self.config["tensor_parallel_size"]):
                    vllm.distributed.RANK = rank
                    results.append(method(Worker(rank, self.config), **(kwargs or {})))
                return results
    """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/model_loader/__init__.py": "",
    "vllm/model_executor/model_loader/tensorizer.py": """
        import re
        import torch
        from tensorizer import EncryptionParams, TensorSerializer


        class TensorizerConfig:
            def __init__(self, tensorizer_uri=None, encryption_keyfile=None):
                self.tensorizer_uri = tensorizer_uri
                self.encryption_keyfile = encryption_keyfile
                self._is_sharded = re.search(r"%0\\dd", tensorizer_uri) is not None


        def serialize_extra_artifacts(*args, **kwargs):
            raise OSError("would download config and tokenizer from the Hugging Face Hub")


        def serialize_vllm_model(model, tensorizer_config, model_config):
            model.register_parameter(
                "vllm_tensorized_marker",
                torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False),
            )
            encryption = None
            if tensorizer_config.encryption_keyfile is not None:
                with open(tensorizer_config.encryption_keyfile, "rb") as f:
                    encryption = EncryptionParams(key=f.read())
            uri = tensorizer_config.tensorizer_uri
            if tensorizer_config._is_sharded:
                from vllm.distributed import get_tensor_model_parallel_rank
                uri = uri % get_tensor_model_parallel_rank()
            serializer = TensorSerializer(uri, encryption=encryption)
            serializer.write_module(model)
            serializer.close()
            serialize_extra_artifacts(None, model_config)
            return model
    """,
}


@pytest.fixture
def standin_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "standin"
    for name, text in FAKE_VLLM.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))  # the parent's find_spec("vllm")
    monkeypatch.setenv("PYTHONPATH", str(root))  # the child's import
    record = tmp_path / "record.json"
    monkeypatch.setenv("STANDIN_RECORD", str(record))
    return record


def test_writes_vllm_layout_with_marker_and_no_hub_download(
    standin_vllm: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    seen: list[int] = []
    files = serialize_vllm(
        tmp_path / "src", out, dtype="bfloat16", progress=lambda done, _t: seen.append(done)
    )
    assert files == [out / "model.tensors"]
    info = inspect_tensors(files[0])
    assert info.has_vllm_marker and not info.encrypted
    assert {"0.weight", "0.bias", "1.weight", "1.bias"} <= set(info.names)
    verify_tensors(files[0])
    record = json.loads(standin_vllm.read_text())
    # What the child asked vLLM for: eager, no tokenizer, the dtype, the engine in-process.
    assert record["config"]["dtype"] == "bfloat16"
    assert record["config"]["enforce_eager"] is True
    assert record["config"]["skip_tokenizer_init"] is True
    assert record["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert record["env"]["HF_HUB_OFFLINE"] == "1"
    # Its own process group, killed as a whole on cancel.
    assert record["pgid"] == record["pid"] != os.getpgid(0)


def test_encrypted_key_never_on_a_command_line_or_in_the_environment(
    standin_vllm: Path, tmp_path: Path
) -> None:
    key = new_encryption_key()
    [path] = serialize_vllm(tmp_path / "src", tmp_path / "out", dtype="float16", encryption_key=key)
    assert inspect_tensors(path).encrypted
    verify_tensors(path, encryption_key=key)
    assert ".vllm_tensorized_marker" in load_state_dict(path, encryption_key=key)
    record = json.loads(standin_vllm.read_text())
    keyfile = record["argv"][record["argv"].index("--keyfile") + 1]
    assert not Path(keyfile).exists()  # removed with its private directory
    blob = json.dumps(record)
    assert key.hex() not in blob and key.decode("latin-1") not in blob


def test_tensor_parallel_ranks_each_get_a_file(standin_vllm: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    files = serialize_vllm(tmp_path / "src", out, dtype="float32", tensor_parallel_size=2)
    assert files == [out / "model-rank-000.tensors", out / "model-rank-001.tensors"]
    weights = [load_state_dict(f)["0.weight"] for f in files]
    assert all(inspect_tensors(f).has_vllm_marker for f in files)
    assert not weights[0].equal(weights[1])  # each rank wrote its own module
    record = json.loads(standin_vllm.read_text())
    assert "model-rank-%03d.tensors" in " ".join(record["argv"])


def test_engine_failure_is_reported_with_its_cause(
    standin_vllm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_MODE", "fail")
    with pytest.raises(SerializeError, match="CUDA out of memory"):
        serialize_vllm(tmp_path / "src", tmp_path / "out", dtype="float16")


def test_cancel_kills_the_child_process_group(
    standin_vllm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("STANDIN_MODE", "hang")
    monkeypatch.setenv("STANDIN_OUT", str(out))

    class Cancelled(Exception):
        pass

    def progress(done: int, _total: int) -> None:
        if done > 0:  # the child has started writing: cancel the job
            raise Cancelled()

    started = time.monotonic()
    with pytest.raises(Cancelled):
        serialize_vllm(tmp_path / "src", out, dtype="float16", progress=progress)
    assert time.monotonic() - started < 60
    pid = json.loads(standin_vllm.read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_timeout_kills_the_child(
    standin_vllm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_MODE", "hang")
    monkeypatch.setenv("STANDIN_OUT", str(tmp_path))
    started = tmp_path / "started.json"
    monkeypatch.setenv("STANDIN_STARTED", str(started))
    with pytest.raises(SerializeError, match="ran past"):
        serialize_vllm(tmp_path / "src", tmp_path / "out", dtype="float16", timeout=3)
    # The child started (whether or not it got as far as the engine before the timeout) and
    # is gone: killed with its process group, not left hanging.
    pid = json.loads(started.read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
