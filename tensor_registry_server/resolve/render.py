"""Rendering a resolve answer (ResolveOut) for a chosen artifact: signed URLs per file, the
tensorizer URIs, the key URL, the loader advice and the vllm block.

The answer is built as plain data and encoded here (tests validate it against ResolveOut): on
the hot path, validating our own output would cost as much as the lookup.

Decisions where the contract is silent:
- ``deserializer.num_readers`` defaults to 4: tensorizer's own choice when hashes are verified,
  and a load a registry serving many nodes over HTTP can carry. Nodes that can do more say so
  (``num_readers`` or ``cpu_count``: half the CPUs, 1..16).
- ``verify_hash`` is advised on: it is the one check that catches a proxy or server answering
  a Range request with the wrong bytes, and storage corruption, before the weights are used.
  It costs CPU (H200 node, 16 readers, bench/RESULTS.md: 30.8 → 6.8 GB/s from a local
  file, 20.0 → 6.3 GB/s through the client over loopback HTTP); nodes that trust their path
  can ask for ``verify_hash=false``.
- The vllm block carries no key material and no key capability unless asked for
  (``embed_key_url``): vLLM logs ``model_loader_extra_config``. By default
  ``encryption_keyfile`` names a local file that ``tensor-registry pull`` writes (mode 0600)
  from ``encryption_key_url``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tensor_registry.formats.signed_manifest import MANIFEST_FILE, ManifestFile, compatibility_key
from tensor_registry_server.core.choice_cache import CachedFile, Selection
from tensor_registry_server.core.errors import AppError
from tensor_registry_server.resolve.advice import engine_advice, file_kind
from tensor_registry_server.resolve.schemas import ResolveQuery
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage import signing
from tensor_registry_server.storage.base import Storage
from tensor_registry_server.storage.registry import StorageRegistry
from tensor_registry_server.trust.signing_keys import manifest_keys
from tensor_registry_server.trust.statements import signed_binding

# One encoder for the hot path (json.dumps with options builds a new one per call).
compact_json = json.JSONEncoder(separators=(",", ":")).encode

DEFAULT_NUM_READERS = 4
MAX_ADVISED_READERS = 16
WEIGHTS_SUFFIX = ".tensors"
SINGLE_FILE = "model.tensors"
RANK_TEMPLATE = "model-rank-%03d.tensors"


def advise_readers(q: ResolveQuery) -> int:
    if q.num_readers is not None:
        return q.num_readers
    if q.cpu_count is not None:
        return max(1, min(MAX_ADVISED_READERS, q.cpu_count // 2))
    return DEFAULT_NUM_READERS


def direct_urls(storages: StorageRegistry, storage: str) -> Any:
    """The backend's ``download_url`` when it overrides the base (presigned S3), else None."""
    backend = storages.get(storage)
    direct = getattr(type(backend), "download_url", None)
    if direct is None or direct is getattr(Storage, "download_url", None):
        return None
    return backend.download_url


async def _file_urls(
    storages: StorageRegistry,
    settings: Settings,
    secret: bytes,
    selection: Selection,
    ttl: int,
) -> list[str]:
    # Backends that can hand out their own short-lived GET (presigned S3) do so; everything
    # else (the local directory, Redis) is served by the registry's signed blob route.
    direct = direct_urls(storages, selection.storage)
    urls: list[str] = []
    signed: tuple[str, str, str] | None = None  # (scope, URL up to the key, query)
    for f in selection.files:
        url = await direct(f.storage_key, ttl) if direct is not None else None
        if url:
            urls.append(str(url))
            continue
        # A blob signature covers the artifact's whole prefix (signing.blob_scope), so one
        # signature serves every file: sign once, then only the key in the path differs.
        scope = signing.blob_scope(f.storage_key)
        if signed is None or signed[0] != scope:
            first = signing.blob_url(
                settings.public_base_url,
                secret,
                storage=selection.storage,
                key=f.storage_key,
                ttl=ttl,
            )
            head, _, query = first.partition("?")
            signed = (scope, head[: len(head) - len(f.storage_key)], query)
        urls.append(f"{signed[1]}{f.storage_key}?{signed[2]}")
    return urls


async def _warm_bundles(
    storages: StorageRegistry, settings: Settings, secret: bytes, selection: Selection, ttl: int
) -> list[dict[str, Any]]:
    """The artifact's ready warm bundles with a signed URL each (docs/warm-state.md); a node
    picks the one whose key is its own and checks its signed ``statement``."""
    out = []
    for bundle in selection.warm_bundles:
        key = bundle.get("storage_key")
        if not key:
            continue
        direct = direct_urls(storages, bundle["storage"])
        url = await direct(key, ttl) if direct is not None else None
        if not url:
            url = signing.blob_url(
                settings.public_base_url, secret, storage=bundle["storage"], key=key, ttl=ttl
            )
        out.append(
            {
                "id": bundle["id"],
                "url": str(url),
                "size": bundle["size"],
                "sha256": bundle["sha256"],
                "key": bundle["key"],
                "cache": bundle["cache"],
                "statement": bundle["statement"],
                "created_at": bundle["created_at"],
            }
        )
    return out


def _weights(selection: Selection) -> list[CachedFile]:
    """Rank-ordered weight files, checked against the layout vLLM expects."""
    by_path = {f.path: f for f in selection.files}
    tp = selection.tensor_parallel_size
    names = [SINGLE_FILE] if tp == 1 else [RANK_TEMPLATE % rank for rank in range(tp)]
    missing = [n for n in names if n not in by_path]
    if missing:
        raise AppError(
            f"Artifact {selection.artifact_id} is ready but lacks {', '.join(missing)}.",
            code="artifact_layout_invalid",
        )
    return [by_path[n] for n in names]


def _template_key(rank_files: list[CachedFile]) -> str:
    directory = rank_files[0].storage_key.rpartition("/")[0]
    template = f"{directory}/{RANK_TEMPLATE}" if directory else RANK_TEMPLATE
    if any(template % rank != f.storage_key for rank, f in enumerate(rank_files)):
        raise AppError(
            "The rank files of this artifact are not stored side by side, so no %03d "
            "template can address them.",
            code="artifact_layout_invalid",
        )
    return template


def legacy_compatibility_key(selection: Selection) -> str:
    """The key of an artifact published before keys were recorded: from what its rows hold
    (the config.json digest stands in for the architecture and quantization it contains)."""
    config = next((f.sha256 for f in selection.files if f.path == "config.json"), None)
    return compatibility_key(
        architecture=None,
        config_sha256=config,
        dtype=selection.dtype,
        format=selection.format,
        tensor_parallel_size=selection.tensor_parallel_size,
    )


def vllm_block(
    selection: Selection,
    q: ResolveQuery,
    *,
    tensorizer_uri: str,
    readers: int,
    key_url: str | None,
) -> dict[str, Any]:
    """The answer's ``vllm`` block: vLLM's tensorizer loader config and the matching CLI args.

    The key URL is in it only when the caller asked (``embed_key_url``): vLLM logs it.
    """
    extra: dict[str, Any] = {
        "tensorizer_uri": tensorizer_uri,
        "num_readers": readers,
        "verify_hash": q.verify_hash,
    }
    keyfile = None
    if selection.encrypted:
        if q.embed_key_url and key_url is not None:
            keyfile = {"path": key_url, "source": "url"}
        else:
            keyfile = {"path": q.keyfile, "source": "file"}
        extra["encryption_keyfile"] = keyfile["path"]
    args = [
        "--load-format",
        "tensorizer",
        "--model-loader-extra-config",
        compact_json(extra),
    ]
    if selection.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(selection.tensor_parallel_size)]
    # The weights were serialized in this dtype; vLLM must build the model in the same one
    # (else it takes config.json's torch_dtype).
    args += ["--dtype", selection.dtype]
    return {"model_loader_extra_config": extra, "args": args, "keyfile": keyfile}


def _iso_seconds(moment: int) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def binding(
    selection: Selection, q: ResolveQuery, settings: Settings, *, ttl: int, expires_at: int
) -> str:
    """The answer's signed ``binding`` (tensor_registry_server/trust/statements.py
    ``signed_binding``)."""
    manifest = next((f for f in selection.files if f.path == MANIFEST_FILE), None)
    alias = None
    if selection.alias_revision is not None:
        alias = {
            "name": q.ref,
            "revision": selection.alias_revision,
            "moved_at": selection.alias_moved_at,
        }
    data = signed_binding(
        manifest_keys(settings),
        registry=settings.public_base_url,
        model=selection.model,
        model_id=selection.model_id,
        ref=q.ref,
        version=selection.version,
        artifact={
            "id": selection.artifact_id,
            "dtype": selection.dtype,
            "format": selection.format,
            "tensor_parallel_size": selection.tensor_parallel_size,
            "encrypted": selection.encrypted,
        },
        alias=alias,
        manifest=ManifestFile(manifest.path, manifest.size, manifest.sha256) if manifest else None,
        issued_at=_iso_seconds(expires_at - ttl),
        expires_at=_iso_seconds(expires_at),
    )
    return data.decode()


async def render(
    selection: Selection,
    q: ResolveQuery,
    *,
    storages: StorageRegistry,
    settings: Settings,
    secret: bytes,
    ttl: int,
    expires_at: int,
    readers: int,
    wants_key_url: bool,
) -> tuple[bytes, str | None]:
    """The JSON answer (ResolveOut) and the key URL in it, if any."""
    weights = _weights(selection)
    urls = await _file_urls(storages, settings, secret, selection, ttl)
    files: list[dict[str, Any]] = [
        {
            "path": f.path,
            "size": f.size,
            "sha256": f.sha256,
            "url": url,
            "kind": file_kind(f.path, WEIGHTS_SUFFIX),
        }
        for f, url in zip(selection.files, urls, strict=True)
    ]
    if selection.tensor_parallel_size == 1:
        tensorizer_uri = next(f["url"] for f in files if f["path"] == weights[0].path)
        rank_uris = [tensorizer_uri]
    else:
        tensorizer_uri = signing.blob_url(
            settings.public_base_url,
            secret,
            storage=selection.storage,
            key=_template_key(weights),
            ttl=ttl,
        )
        rank_uris = [tensorizer_uri % rank for rank in range(selection.tensor_parallel_size)]

    key_url = None
    if wants_key_url:
        key_url = signing.key_url(
            settings.public_base_url, secret, artifact_id=selection.artifact_id, ttl=ttl
        )

    body = {
        "model": selection.model,
        "chosen_by": selection.chosen_by,
        "ref": q.ref,
        "version": selection.version,
        "artifact": {
            "id": selection.artifact_id,
            "model_id": selection.model_id,
            "version": selection.version,
            "dtype": selection.dtype,
            "format": selection.format,
            "tensor_parallel_size": selection.tensor_parallel_size,
            "encryption": {
                "enabled": selection.encrypted,
                "key_id": selection.key_id,
                "algorithm": selection.encryption_algorithm,
            },
            "storage": selection.storage,
            "tensorizer_version": selection.tensorizer_version,
        },
        "compatibility_key": selection.compatibility_key or legacy_compatibility_key(selection),
        "manifest_path": (
            MANIFEST_FILE if any(f.path == MANIFEST_FILE for f in selection.files) else None
        ),
        "expires_at": _iso_seconds(expires_at),
        "files": files,
        "tensorizer_uri": tensorizer_uri,
        "tensorizer_uris": rank_uris,
        "encryption_key_url": key_url,
        "deserializer": {"num_readers": readers, "verify_hash": q.verify_hash},
        "engine": engine_advice(
            paths=[f.path for f in selection.files],
            encrypted=selection.encrypted,
            cpu_count=q.cpu_count,
            gpu=q.gpu,
            verify=q.verify_hash,
        ),
        "vllm": vllm_block(
            selection, q, tensorizer_uri=tensorizer_uri, readers=readers, key_url=key_url
        ),
        "binding": binding(selection, q, settings, ttl=ttl, expires_at=expires_at),
        "warm_bundles": await _warm_bundles(storages, settings, secret, selection, ttl),
        "remote_code": selection.remote_code,
    }
    return compact_json(body).encode(), key_url
