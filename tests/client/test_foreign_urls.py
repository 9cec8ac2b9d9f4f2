"""A URL the node hands to another program is on the registry's own origin, or on a blob host
the registry's signed keys document names (issue 33 §4). A man in the middle on 127.0.0.1
(tests/mitm.py) between a real `serve` and the CLI points the weights at
``http://attacker.example/evil.tensors``: `vllm-args` and `pull` refuse it (`foreign_url`) and
print nothing for vLLM. The attacker URL is only a string: nothing is ever sent to it (the node
refuses before fetching, and the proxy would forward only to the real registry).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tensor_registry.trust.origins import origin
from tests.client.conftest import Registry
from tests.client.test_trust_binding import cli, signed
from tests.mitm import mitm

EVIL = "http://attacker.example/evil.tensors"


@pytest.fixture(autouse=True)
def client_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "client-config"
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(path))
    for name in (
        "TENSOR_REGISTRY_TRUSTED_KEYS",
        "TENSOR_REGISTRY_REQUIRE_SIGNED",
        "TENSOR_REGISTRY_ALLOW_UNSIGNED",
    ):
        monkeypatch.delenv(name, raising=False)
    return path


def _point_weights_at(url: str, *, field: str) -> Any:
    def rewrite(path: str, data: Any) -> Any:
        if not path.startswith("/api/v1/resolve"):
            return data
        if field == "files":
            for entry in data["files"]:
                if entry["path"] == "model.tensors":
                    entry["url"] = url
        elif field == "tensorizer_uri":
            data["tensorizer_uri"] = url
            data["tensorizer_uris"] = [url]
        else:
            data["files"][0]["url"] = url
        return data

    return rewrite


@pytest.mark.parametrize("field", ["files", "tensorizer_uri", "config"])
async def test_an_answer_pointing_anywhere_else_is_refused_by_vllm_args_and_pull(
    registry: Registry, tmp_path: Path, client_config: Path, field: str
) -> None:
    name = f"acme/foreign-{uuid.uuid4().hex[:8]}"
    registry.ready_model(name)
    await signed(registry, name, 1, dtype="bfloat16")
    with mitm(registry.url) as proxy:
        # Honest first: the answer's URLs (through the proxy, the node's registry) pass.
        code, out, err = cli(registry, client_config, "vllm-args", name, url=proxy.url)
        assert code == 0, err
        proxy.rewrite = _point_weights_at(EVIL, field=field)
        code, out, err = cli(registry, client_config, "vllm-args", name, url=proxy.url)
        assert code == 1 and "foreign_url" in err and out == "", (code, out, err)
        assert "attacker.example" in err  # the error says which URL was refused
        dest = tmp_path / "dest"
        code, _, err = cli(
            registry, client_config, "pull", name, "--dest", str(dest), url=proxy.url
        )
        assert code == 1 and "foreign_url" in err and "attacker.example" not in out, err
        assert not dest.exists() or not any(dest.iterdir())


async def test_a_blob_host_the_signed_keys_document_names_is_accepted(
    registry: Registry, tmp_path: Path, client_config: Path
) -> None:
    """The registry's public URL is another origin than the proxy the node talks to; the signed
    keys document names it, so an answer pointing there passes (and its bytes are the real
    ones). Another port on the same host is another origin and is refused."""
    name = f"acme/blobhost-{uuid.uuid4().hex[:8]}"
    registry.ready_model(name)
    made = await signed(registry, name, 1, dtype="bfloat16")
    keys = httpx.get(f"{registry.url}/.well-known/tensor-registry/keys").json()
    assert origin(registry.url) in {origin(o) for o in keys["blob_origins"]}
    with mitm(registry.url) as proxy:

        def to_upstream(path: str, data: Any) -> Any:
            if path.startswith("/api/v1/resolve"):
                for entry in data["files"]:
                    entry["url"] = entry["url"].replace(proxy.url, registry.url)
                data["tensorizer_uri"] = data["tensorizer_uri"].replace(proxy.url, registry.url)
            return data

        proxy.rewrite = to_upstream
        dest = tmp_path / "dest"
        code, _, err = cli(
            registry,
            client_config,
            "pull",
            name,
            "--dest",
            str(dest),
            "--weights",
            url=proxy.url,
        )
        assert code == 0, err
        assert (dest / "model.tensors").read_bytes() == made.files["model.tensors"]

        other_port = urlsplit_port_plus_one(registry.url)
        proxy.rewrite = _point_weights_at(f"{other_port}/evil.tensors", field="files")
        code, _, err = cli(registry, client_config, "vllm-args", name, url=proxy.url)
        assert code == 1 and "foreign_url" in err, err


def urlsplit_port_plus_one(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{(parts.port or 80) + 1}"


def test_origins_are_compared_exactly() -> None:
    assert (
        origin("http://127.0.0.1/x") == origin("HTTP://127.0.0.1:80/y?z") == "http://127.0.0.1:80"
    )
    assert origin("https://h.example/a") == "https://h.example:443"
    assert origin("http://[::1]:8/a") == "http://[::1]:8"
    for bad in (
        "file:///etc/passwd",
        "redis://h/0",
        "http://user:pw@h/",
        "http:///x",
        "http://h:x/",
    ):
        assert origin(bad) is None, bad
