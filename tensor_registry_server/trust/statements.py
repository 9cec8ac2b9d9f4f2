"""Building an artifact's signed manifest (the format: tensor_registry/formats/signed_manifest.py)
and its OpenSSF Model Signing signature ``model.sig`` (tensor_registry/formats/model_signature.py).

One builder for the worker's publish step and for the backfill of old artifacts, so both
write the same predicate: the variant (never the key itself), the layout manifest's sha256,
the compatibility key and the provenance the caller gathered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tensor_registry.formats import variant as variants
from tensor_registry.formats.layout import LAYOUT_FILE
from tensor_registry.formats.signed_manifest import (
    BINDING_PREDICATE_TYPE,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    VERSION_PREDICATE_TYPE,
    ManifestFile,
    compatibility_key,
    config_facts,
    statement,
)
from tensor_registry.formats.warm import WARM_PREDICATE_TYPE
from tensor_registry_server.trust.signing_keys import ManifestKeys, ModelSigningKeys

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class Variant:
    artifact_id: str
    model_id: str
    model: str
    version: int
    dtype: str
    format: str
    tensor_parallel_size: int
    encrypted: bool
    key_id: str | None
    encryption_algorithm: str | None


def compatibility_of(
    variant: Variant,
    *,
    config: bytes | None,
    config_sha256: str | None,
    vllm_version: str | None,
    gpu_arch: str | None,
) -> str:
    architecture, quantization = config_facts(config)
    return compatibility_key(
        architecture=architecture,
        config_sha256=config_sha256,
        dtype=variant.dtype,
        format=variant.format,
        tensor_parallel_size=variant.tensor_parallel_size,
        quantization=quantization,
        vllm_version=vllm_version,
        gpu_arch=gpu_arch,
    )


def signed_manifest(
    keys: ManifestKeys,
    *,
    registry: str,
    variant: Variant,
    files: Iterable[ManifestFile],
    compatibility: str,
    provenance: Mapping[str, Any],
    signed_at: str,
) -> bytes:
    """The ``manifest.sig.json`` bytes over ``files`` (the manifest itself excluded)."""
    listed = [f for f in files if f.path != MANIFEST_FILE]
    layout = next((f.sha256 for f in listed if f.path == LAYOUT_FILE), None)
    predicate = {
        "registry": registry,
        "registry_id": keys.registry_id,
        "artifact": {
            "id": variant.artifact_id,
            "model_id": variant.model_id,
            "model": variant.model,
            "version": variant.version,
            "dtype": variant.dtype,
            "format": variant.format,
            "tensor_parallel_size": variant.tensor_parallel_size,
            "encryption": {
                "enabled": variant.encrypted,
                "key_id": variant.key_id,
                "algorithm": variant.encryption_algorithm,
            },
        },
        "layout": {"path": LAYOUT_FILE, "sha256": layout} if layout else None,
        "compatibility_key": compatibility,
        "provenance": dict(provenance),
        "signed_at": signed_at,
    }
    return keys.sign(statement(files=listed, predicate=predicate))


def signed_version_manifest(
    keys: ManifestKeys,
    *,
    registry: str,
    model_id: str,
    model: str,
    version_id: str,
    version: int,
    files: Iterable[ManifestFile],
    finalized_at: str | None,
    source: str | None,
    signed_at: str,
) -> bytes:
    """The DSSE envelope of a ready source version's files (``VERSION_PREDICATE_TYPE``):
    subjects are its files by sha256; ``source`` is the already redacted source URI."""
    predicate = {
        "registry": registry,
        "registry_id": keys.registry_id,
        "version": {
            "id": version_id,
            "model_id": model_id,
            "model": model,
            "number": version,
            "finalized_at": finalized_at,
            "source": source,
        },
        "signed_at": signed_at,
    }
    return keys.sign(
        statement(files=files, predicate=predicate, predicate_type=VERSION_PREDICATE_TYPE)
    )


def signature_name(variant: Variant) -> str:
    """The name model.sig gives the artifact (its subject; informative to verifiers): the
    model and the artifact's door name, ``acme/llama:3.bfloat16.hf.tp1``."""
    door = variants.Variant(
        variant.dtype, variant.format, variant.tensor_parallel_size, variant.encrypted
    )
    return f"{variant.model}:{variants.door_name(str(variant.version), door)}"


def signed_model(
    keys: ModelSigningKeys, *, variant: Variant, files: Iterable[ManifestFile]
) -> bytes:
    """``model.sig`` over every other file of the artifact, the signed manifest included, from
    the sha256 digests already recorded (no byte is read again)."""
    listed = [(f.path, f.sha256) for f in files if f.path != SIGNATURE_FILE]
    return keys.sign(listed, name=signature_name(variant))


def signed_binding(
    keys: ManifestKeys,
    *,
    registry: str,
    model: str,
    model_id: str,
    ref: str,
    version: int,
    artifact: Mapping[str, Any],
    alias: Mapping[str, Any] | None,
    manifest: ManifestFile | None,
    issued_at: str,
    expires_at: str,
) -> bytes:
    """What ``ref`` of ``model`` resolved to, signed for a short while (the resolve answer's
    ``binding``): the subject is the artifact's signed manifest (by sha256) when it has one;
    ``alias`` is {name, revision, moved_at} for an alias ref (how a node tells a rollback)."""
    predicate = {
        "registry": registry,
        "registry_id": keys.registry_id,
        "model": model,
        "model_id": model_id,
        "ref": ref,
        "version": version,
        "artifact": dict(artifact),
        "alias": dict(alias) if alias is not None else None,
        "issued_at": issued_at,
        "expires_at": expires_at,
    }
    return keys.sign(
        statement(
            files=[manifest] if manifest is not None else [],
            predicate=predicate,
            predicate_type=BINDING_PREDICATE_TYPE,
        )
    )


def signed_warm_bundle(
    keys: ManifestKeys,
    *,
    registry: str,
    bundle: Mapping[str, Any],
    key: Mapping[str, Any],
    cache: Mapping[str, Any],
    tar: ManifestFile,
    signed_at: str,
) -> bytes:
    """The DSSE envelope of a warm bundle (``WARM_PREDICATE_TYPE``): its subject is the tar by
    sha256; ``bundle`` is {id, artifact_id, model_id, model, version}; ``key`` the parts of
    vLLM's cache key (tensor_registry/formats/warm.py ``WarmKey``); ``cache`` what vLLM
    computed (hash directories, factors). A node restores only what this signs."""
    predicate = {
        "registry": registry,
        "registry_id": keys.registry_id,
        "bundle": dict(bundle),
        "key": dict(key),
        "cache": dict(cache),
        "signed_at": signed_at,
    }
    return keys.sign(
        statement(files=[tar], predicate=predicate, predicate_type=WARM_PREDICATE_TYPE)
    )
