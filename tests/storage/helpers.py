"""Small helpers shared by the storage tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible-looking bytes."""
    out = bytearray()
    block = hashlib.sha256(f"seed-{seed}".encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


async def chunks_of(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def failing_after(data: bytes, fail_at: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """Yields ``data`` in chunks, then raises once ``fail_at`` bytes have gone out."""
    sent = 0
    for start in range(0, len(data), size):
        if sent >= fail_at:
            raise ConnectionResetError("client went away")
        chunk = data[start : start + size]
        sent += len(chunk)
        yield chunk


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)
        self.norm = torch.nn.LayerNorm(width)


def model_of(megabytes: int, *, width: int = 512, seed: int = 0) -> torch.nn.Module:
    """A module of about ``megabytes`` float32 MB, many tensors of mixed sizes."""
    torch.manual_seed(seed)
    per_block = (4 * width * width + 4 * width) * 4
    blocks = max(1, megabytes * 1_000_000 // per_block)
    model = torch.nn.Sequential(*[Block(width) for _ in range(blocks)])
    model.register_buffer("scale", torch.arange(7, dtype=torch.float32))
    return model


def state_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same_tensors(
    loaded: Iterable[tuple[str, torch.Tensor]], expected: dict[str, torch.Tensor]
) -> None:
    got = {name.lstrip("."): tensor for name, tensor in loaded}
    assert set(got) == set(expected), sorted(set(got) ^ set(expected))
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def read_file(path: os.PathLike[str]) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def metric_value(url: str, name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` on the server at ``url``'s /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no {name} series with {labels}")


def bytes_served(url: str, storage: str) -> float:
    """``tensor_registry_blob_bytes_served_total`` of ``storage``."""
    return metric_value(url, "tensor_registry_blob_bytes_served_total", storage=storage)


def blob_responses(url: str, storage: str, status: str) -> float:
    """``tensor_registry_blob_responses_total`` of ``storage`` and ``status``."""
    return metric_value(url, "tensor_registry_blob_responses_total", storage=storage, status=status)


def request_lines(lines: Iterable[str], path: str) -> list[dict[str, Any]]:
    """The JSON log lines (a request's, a disconnect's) about ``path``, from a server's output."""
    out = []
    for line in list(lines):
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        message = entry.get("message", "")
        if isinstance(message, str) and message.startswith("{"):
            entry = {**entry, **json.loads(message)}
        if entry.get("path") == path:
            out.append(entry)
    return out


async def move_to_s3(database_url: str, made: Any, *, endpoint: str, bucket: str) -> None:
    """A made artifact (harness.artifacts.MadeArtifact) moved to S3: its files put in the bucket
    under the same keys, and its row saying storage s3."""
    import asyncio

    import boto3
    from sqlalchemy import update

    from tensor_registry_server.core.db import create_engine
    from tensor_registry_server.rows.artifacts import Artifact
    from tensor_registry_server.storage.object_keys import artifact_prefix
    from tests.storage.conftest import S3_KEY_ID, S3_SECRET

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEY_ID,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
    )
    for path, data in made.files.items():
        key = artifact_prefix(made.id) + path
        await asyncio.to_thread(client.put_object, Bucket=bucket, Key=key, Body=data)
    engine = create_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(update(Artifact).where(Artifact.id == made.id).values(storage="s3"))
    finally:
        await engine.dispose()
