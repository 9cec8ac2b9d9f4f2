"""The isolated pickle converter (worker/pickle_convert.py): real weights come out as equal
safetensors; a malicious pickle (one that writes a file and connects to a listener when
unpickled) does nothing, whether it is a raw pickle or inside torch.save's zip."""

from __future__ import annotations

import os
import pickle
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tensor_registry_server.versions.pickle_convert import (
    ConversionError,
    convert,
    safetensors_name,
)


class _Payload:
    """Unpickling this runs ``exec``: writes ``marker`` and connects to ``port``."""

    def __init__(self, marker: Path, port: int) -> None:
        self.code = (
            f"open({str(marker)!r}, 'w').write('pwned');"
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        )

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (self.code,))


@pytest.fixture
def listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    yield server
    server.close()


def _got_a_connection(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def test_real_weights_convert_to_equal_safetensors(tmp_path: Path) -> None:
    state = {"a.weight": torch.randn(3, 4), "b.bias": torch.arange(5, dtype=torch.float16)}
    state["tied"] = state["a.weight"]  # shared storage, as tied embeddings are
    torch.save(state, tmp_path / "pytorch_model.bin")
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    pairs = [("pytorch_model.bin", "model.safetensors"), ("legacy.pt", "legacy.safetensors")]
    written, isolation = convert(tmp_path, pairs)
    assert [w["tensors"] for w in written] == [3, 3]
    for _, target in pairs:
        loaded = load_file(tmp_path / target)
        assert set(loaded) == set(state)
        for name, tensor in state.items():
            assert torch.equal(loaded[name], tensor) and loaded[name].dtype == tensor.dtype
    assert isinstance(isolation.network_namespace, bool)


@pytest.mark.parametrize("packaging", ["torch_zip", "raw_pickle"])
def test_a_malicious_pickle_writes_nothing_and_connects_nowhere(
    tmp_path: Path, listener: socket.socket, packaging: str
) -> None:
    marker = tmp_path / "pwned.txt"
    port = listener.getsockname()[1]
    payload = {"weight": torch.ones(2), "evil": _Payload(marker, port)}
    if packaging == "torch_zip":
        torch.save(payload, tmp_path / "pytorch_model.bin")
    else:
        (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(payload, protocol=4))
    # The payload is real: plain pickle.load runs it (proved in a copy of the bytes, here).
    if packaging == "raw_pickle":
        pickle.loads((tmp_path / "pytorch_model.bin").read_bytes())  # noqa: S301 - the point
        assert marker.exists() and _got_a_connection(listener)
        marker.unlink()

    with pytest.raises(ConversionError, match="could not be loaded safely"):
        convert(tmp_path, [("pytorch_model.bin", "model.safetensors")])
    assert not marker.exists()
    assert not _got_a_connection(listener)
    assert not (tmp_path / "model.safetensors").exists()


def test_the_child_has_no_network_and_no_environment(
    tmp_path: Path, listener: socket.socket
) -> None:
    """Even code the restricted loader let through could not connect or read secrets: the
    child's socket constructors raise and its environment is empty."""
    import tensor_registry_server.versions.pickle_convert as module

    probe = (
        "import os, socket, json\n"
        "try:\n    socket.socket(); net = 'open'\nexcept OSError as e:\n    net = 'refused'\n"
        "print(json.dumps([{'net': net, 'env': sorted(os.environ)}]))\n"
        "raise SystemExit(0)\n"
    )
    original = module.CHILD
    module.CHILD = original.replace("import torch\n", probe + "import torch\n", 1)
    os.environ["TENSOR_REGISTRY_MASTER_KEY"] = "secret-for-the-test"
    try:
        written, _ = convert(tmp_path, [])
    finally:
        module.CHILD = original
        del os.environ["TENSOR_REGISTRY_MASTER_KEY"]
    assert written[0]["net"] == "refused"
    assert not [k for k in written[0]["env"] if k.startswith("TENSOR_REGISTRY")]


def test_paths_outside_the_job_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConversionError):
        convert(tmp_path, [("../etc/passwd", "x.safetensors")])


def test_safetensors_names() -> None:
    assert (
        safetensors_name("pytorch_model-00001-of-00002.bin") == "model-00001-of-00002.safetensors"
    )
    assert safetensors_name("sub/weights.pt") == "sub/weights.safetensors"
