"""config.json has one set of rules: finalize (bytes from storage, a problem per file) and the
worker (a model directory, an exception) accept and refuse exactly the same documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensor_registry_server.checkpoints.finalize import check_config
from tensor_registry_server.checkpoints.huggingface import ModelSourceError, read_config

ACCEPTED = {
    "architectures": {"architectures": ["LlamaForCausalLM"]},
    "model_type": {"model_type": "llama"},
    "empty-architectures-with-model-type": {"architectures": [], "model_type": "bert"},
}
REFUSED = {
    "not-json": b"{not json",
    "not-utf8": b'{"model_type": "\xff"}',
    "too-deep": json.dumps({"model_type": "llama", "x": json.loads("[" * 100 + "]" * 100)}),
    "list": "[]",
    "neither": "{}",
    "empty-architectures-only": {"architectures": []},
    "empty-model-type-only": {"model_type": ""},
    "architectures-int": {"architectures": 5},
    "architectures-not-names": {"architectures": [7]},
    "architectures-empty-name": {"architectures": [""]},
    "model-type-list": {"model_type": ["llama"]},
    "model-type-int-beside-architectures": {"architectures": ["BertModel"], "model_type": 5},
}


def _raw(document: object) -> bytes:
    if isinstance(document, bytes):
        return document
    return (document if isinstance(document, str) else json.dumps(document)).encode()


def _worker_reads(tmp_path: Path, raw: bytes) -> dict[str, object]:
    (tmp_path / "config.json").write_bytes(raw)
    return read_config(tmp_path)


@pytest.mark.parametrize("document", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_both_accept_a_usable_config(tmp_path: Path, document: object) -> None:
    config, problem = check_config("config.json", _raw(document))
    assert problem is None and config == document
    assert _worker_reads(tmp_path, _raw(document)) == document


@pytest.mark.parametrize("document", REFUSED.values(), ids=REFUSED.keys())
def test_both_refuse_an_unusable_config_with_the_same_words(
    tmp_path: Path, document: object
) -> None:
    config, problem = check_config("config.json", _raw(document))
    assert config is None and problem is not None
    assert (problem.path, problem.code) == ("config.json", "invalid_config")
    with pytest.raises(ModelSourceError) as refused:
        _worker_reads(tmp_path, _raw(document))
    assert (refused.value.code, refused.value.path) == ("invalid_config", "config.json")
    assert refused.value.message == problem.message


def test_a_missing_config_is_the_workers_own_error(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError) as refused:
        read_config(tmp_path)
    assert refused.value.code == "missing_config"
