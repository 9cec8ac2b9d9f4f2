"""Loading weights from signed URLs of a real `tensor-registry serve`: tensorizer's own HTTP reader
(curl, parallel range readers, hash verification) and the client's in-process one, the client's
load_state_dict/load_into_module (through the node cache), encrypted artifacts, expired URLs and
wrong keys. Tampered bytes: tests/client/test_trust.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
from tensorizer import DecryptionParams, TensorDeserializer

from harness.artifacts import make_artifact, rank_state
from harness.waiting import poll
from tensor_registry import RegistryClient, load_into_module, load_state_dict, resolve
from tensor_registry.api.client import (
    KeyAccessRequired,
    SignatureExpired,
    SignatureInvalid,
    WrongKey,
)
from tensor_registry.node_cache import NodeCache
from tensor_registry.tensorizer_stream import HTTPRangeStream
from tests.client.conftest import Registry


@pytest.fixture(autouse=True)
def node_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's node cache and pinned keys in its own directories, never the user's."""
    monkeypatch.setenv("TENSOR_REGISTRY_CACHE_DIR", str(tmp_path / "node-cache"))
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(tmp_path / "client-config"))


def _name() -> str:
    return f"acme/m-{uuid.uuid4().hex[:10]}"


def _tiny_llama(seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


async def test_tensorizer_reads_the_signed_uri_with_parallel_readers(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    state = {"big": torch.randn(512, 1024), "small": torch.arange(10, dtype=torch.float32)}
    await make_artifact(registry.settings, model=name, version=1, sources=[state])
    with RegistryClient(registry.url, registry.token) as client:
        answer = client.resolve(name)
    # tensorizer's own reader, exactly as vLLM would use it: curl + 4 range readers + hashes.
    with TensorDeserializer(
        answer.tensorizer_uri, device="cpu", num_readers=4, verify_hash=True
    ) as deserializer:
        loaded = dict(deserializer.items())
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


async def test_each_rank_of_the_template_loads_its_own_file(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    await make_artifact(registry.settings, model=name, version=1, tensor_parallel_size=2)
    answer = resolve(name, url=registry.url, token=registry.token, tensor_parallel_size=2)
    for rank in range(2):
        expected = rank_state(rank)
        # tensorizer over the URL: its curl reader, and the client's in-process one.
        for source in (answer.tensorizer_uri % rank, HTTPRangeStream(answer.tensorizer_uri % rank)):
            with TensorDeserializer(
                source, device="cpu", num_readers=2, verify_hash=True
            ) as deserializer:
                assert all(torch.equal(deserializer[k], expected[k]) for k in expected)
        with RegistryClient(registry.url, registry.token) as client:
            via_client = load_state_dict(answer, client=client, rank=rank)
            assert all(torch.equal(via_client[k], expected[k]) for k in expected)


async def test_hf_model_loaded_through_the_client_gives_identical_logits(
    registry: Registry,
) -> None:
    name = _name()
    registry.ready_model(name)
    source = _tiny_llama(seed=1)
    await make_artifact(registry.settings, model=name, version=1, sources=[source])
    target = _tiny_llama(seed=2)
    tokens = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        assert not torch.equal(source(tokens).logits, target(tokens).logits)
        with RegistryClient(registry.url, registry.token) as client:
            load_into_module(target, f"{name}:1", client=client, format="hf")
        assert torch.equal(source(tokens).logits, target(tokens).logits)
    # (tensorizer re-registers non-persistent buffers such as inv_freq as persistent ones.)
    expected, loaded = source.state_dict(), target.state_dict()
    assert set(expected) <= set(loaded)
    assert all(torch.equal(expected[k], loaded[k]) for k in expected)


async def test_encrypted_artifact_needs_keys_read_and_the_right_key(registry: Registry) -> None:
    name = _name()
    registry.ready_model(name)
    state = {"w": torch.randn(256, 64)}
    made = await make_artifact(
        registry.settings, model=name, version=1, encrypted=True, sources=[state]
    )
    reader = registry.token_with("resolve", name="no-keys")
    keyholder = registry.token_with("resolve", "keys:read", name="keys")

    with RegistryClient(registry.url, reader) as client:
        answer = client.resolve(name)
        assert answer.encrypted and answer.encryption_key_url is None
        with pytest.raises(KeyAccessRequired):
            load_state_dict(answer, client=client)
    with RegistryClient(registry.url, keyholder) as client:
        answer = client.resolve(name)
        assert answer.encryption_key_url is not None
        key = client.fetch_key(answer.encryption_key_url)
        assert key == made.key
        # The key as vLLM would use it: tensorizer's DecryptionParams over the signed stream.
        with TensorDeserializer(
            answer.tensorizer_uri,
            device="cpu",
            num_readers=2,
            verify_hash=True,
            encryption=DecryptionParams.from_key(key),
        ) as deserializer:
            assert torch.equal(deserializer["w"], state["w"])
        assert torch.equal(load_state_dict(name, client=client)["w"], state["w"])
        with pytest.raises(SignatureInvalid):
            client.fetch_key(answer.encryption_key_url.replace("sig=", "sig=x"))

    wrong = await make_artifact(
        registry.settings,
        model=name,
        version=1,
        dtype="float16",
        encrypted=True,
        stored_key=bytes(32),
    )
    with RegistryClient(registry.url, keyholder) as client, pytest.raises(WrongKey) as caught:
        load_state_dict(name, client=client, dtype="float16")
    assert str(wrong.id) in str(caught.value) and caught.value.code == "decryption_failed"


def _expired(client: RegistryClient, url: str) -> bool:
    try:
        client.probe(url)
    except SignatureExpired:
        return True
    return False


async def test_expired_urls_are_resolved_again_once(registry: Registry, tmp_path: Path) -> None:
    name = _name()
    registry.ready_model(name)
    state = {"w": torch.randn(64, 64)}
    await make_artifact(registry.settings, model=name, version=1, sources=[state])
    # A node cache of its own for each load: a cached file would need no URL at all.
    with RegistryClient(registry.url, registry.token) as client:
        stale = client.resolve(name, ttl=1)
        # The client knows these are about to expire: it resolves before starting.
        loaded = load_state_dict(stale, client=client, cache=NodeCache(tmp_path / "one"))
        assert torch.equal(loaded["w"], state["w"])
        # A node whose clock runs behind believes the URLs are fresh; the server says
        # signature_expired, and the client resolves once more.
        skewed = client.resolve(name, ttl=1)
        poll(
            lambda: _expired(client, skewed.tensorizer_uri),
            what="the server to refuse the URL as expired",
            timeout=30,
        )
        skewed.data["expires_at"] = "2999-01-01T00:00:00Z"
        loaded = load_state_dict(skewed, client=client, cache=NodeCache(tmp_path / "two"))
        assert torch.equal(loaded["w"], state["w"])
