"""Publishing model directories through the API, reading artifacts back (waiting for jobs:
harness/waiting.py)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import torch

from tensor_registry_server.core.db import create_engine, make_sessionmaker
from tensor_registry_server.core.key_wrapping import unwrap_key
from tensor_registry_server.settings import Settings
from tests.factories import create_model, upload


async def publish_dir(client: httpx.AsyncClient, directory: Path, *, name: str) -> tuple[str, int]:
    """Create ``name`` and a ready version holding the top-level files of ``directory``."""
    model = await create_model(client, name=name)
    r = await client.post(f"/api/v1/models/{model['id']}/versions", json={})
    assert r.status_code == 201, r.text
    number = r.json()["version"]
    for path in sorted(
        p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")
    ):
        r = await upload(client, model["id"], number, path.name, path.read_bytes())
        assert r.status_code == 201, r.text
    r = await client.post(f"/api/v1/models/{model['id']}/versions/{number}/finalize")
    assert r.status_code == 200, r.text
    return str(model["id"]), int(number)


async def tensorize(client: httpx.AsyncClient, model_id: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/api/v1/models/{model_id}/tensorize", json=body)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/api/v1/jobs/{r.json()['id']}"
    return dict(r.json())


async def get_artifact(client: httpx.AsyncClient, artifact_id: str) -> dict[str, Any]:
    r = await client.get(f"/api/v1/artifacts/{artifact_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def artifact_dir(settings: Settings, artifact_id: str) -> Path:
    return settings.local_storage_root / "artifacts" / artifact_id


def stored_files(settings: Settings, artifact_id: str) -> dict[str, bytes]:
    root = artifact_dir(settings, artifact_id)
    if not root.exists():
        return {}
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def assert_files_match_storage(settings: Settings, artifact: dict[str, Any]) -> None:
    stored = stored_files(settings, artifact["id"])
    assert sorted(stored) == sorted(f["path"] for f in artifact["files"])
    for f in artifact["files"]:
        data = stored[f["path"]]
        assert len(data) == f["size"], f["path"]
        assert hashlib.sha256(data).hexdigest() == f["sha256"], f["path"]


async def artifact_key(settings: Settings, artifact_id: str) -> bytes:
    """The artifact's raw key, unwrapped from its row as the key route would."""
    from tensor_registry_server.rows.artifacts import Artifact

    engine = create_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            row = await session.get(Artifact, uuid.UUID(artifact_id))
            assert row is not None and row.wrapped_key is not None
            return unwrap_key(settings.master_key_bytes(), row.wrapped_key, artifact_id=row.id)
    finally:
        await engine.dispose()


def deserialize(path: Path, key: bytes | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a tensorizer file, read with plain tensorizer (no registry code)."""
    from tensorizer import DecryptionParams, TensorDeserializer

    encryption = DecryptionParams.from_key(key) if key is not None else None
    with TensorDeserializer(str(path), device="cpu", encryption=encryption, verify_hash=True) as d:
        return {name: tensor.clone() for name, tensor in d.items()}


def load_into_fresh_model(
    model_dir: Path, tensors_path: Path, dtype: torch.dtype, key: bytes | None = None
) -> torch.nn.Module:
    """Build the architecture from config.json and overwrite every stored tensor from the
    artifact with plain tensorizer, as a serving node would (buffers that are not stored,
    like rotary inv_freq, come from the config as in any transformers load)."""
    import transformers
    from tensorizer import DecryptionParams, TensorDeserializer

    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    model_class = getattr(transformers, config.architectures[0])
    torch.manual_seed(
        12345
    )  # different from the source's seed: every weight must come from the file
    model = model_class(config).to(dtype)
    encryption = DecryptionParams.from_key(key) if key is not None else None
    TensorDeserializer(
        str(tensors_path), device="cpu", encryption=encryption, verify_hash=True
    ).load_into_module(model)
    return model.eval()


def source_model(model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The published source weights, loaded by transformers in float32 and cast to dtype."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    model_class = getattr(transformers, config.architectures[0])
    model = model_class.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.to(dtype).eval()
