"""Registering an artifact tensorized elsewhere (``POST …/artifacts``): the uri and the key are
checked here, the key is kept only wrapped, and a verify job
(tensor_registry_server/artifacts/making/verify.py)
fetches and checks the bytes before anything is published.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict
from urllib.parse import urlparse

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant
from tensor_registry_server.artifacts import variants
from tensor_registry_server.artifacts.schemas import ENCRYPTION_ALGORITHM, ArtifactRegister
from tensor_registry_server.audit.service import record
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.errors import Conflict, Invalid
from tensor_registry_server.core.key_wrapping import KEY_BYTES, new_key_id, wrap_key
from tensor_registry_server.core.queue import VERIFY_TASK, TaskSender, enqueue_after_commit
from tensor_registry_server.core.redact import redact_uri
from tensor_registry_server.core.source_uri import HTTP_SCHEMES, check_source_uri
from tensor_registry_server.jobs import lifecycle
from tensor_registry_server.jobs.pool.service import Requirement, routable_workers, route
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import JobKind
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage.registry import StorageRegistry


def _check_register_uri(uri: str, tensor_parallel_size: int, settings: Settings) -> None:
    check_source_uri(uri, settings)
    parsed = urlparse(uri)
    if parsed.scheme in HTTP_SCHEMES:
        template = "%03d" in parsed.path
        if tensor_parallel_size > 1 and not template:
            raise Invalid(
                "An https:// uri for tensor_parallel_size > 1 must name the rank files with a "
                "%03d template, e.g. https://host/path/model-rank-%03d.tensors.",
                code="invalid_source_uri",
            )
        if tensor_parallel_size == 1 and (template or not parsed.path.endswith(".tensors")):
            raise Invalid(
                "An https:// uri must name the .tensors file itself.", code="invalid_source_uri"
            )
    if "%" in uri.replace("%03d", ""):
        raise Invalid(
            "The uri may contain no '%' other than a %03d template.", code="invalid_source_uri"
        )


def _decode_key(encoded: str) -> bytes:
    try:
        key = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(
            "encryption_key_b64 is not valid base64.", code="invalid_encryption_key"
        ) from exc
    if len(key) != KEY_BYTES:
        raise Invalid(
            f"encryption_key_b64 must decode to exactly {KEY_BYTES} bytes, not {len(key)}.",
            code="invalid_encryption_key",
        )
    return key


async def register_artifact(
    session: AsyncSession,
    principal: Principal,
    model: Model,
    data: ArtifactRegister,
    *,
    idempotency_key: str | None,
    storages: StorageRegistry,
    sender: TaskSender,
) -> variants.Outcome:
    settings = storages.settings
    fingerprint = _fingerprint(model, data)
    if (
        found := await variants.idempotent(session, principal, idempotency_key, fingerprint)
    ) is not None:
        return found
    key = _checked_key(data, settings)
    version = await variants.ready_version(session, model, data.version)
    storage = storages.get(data.storage).name
    variant = await _new_variant(session, version, data, encrypted=key is not None)
    queue = await _verify_queue(session, settings, data, encrypted=key is not None)
    artifact, job = lifecycle.pending_artifact_and_job(
        principal,
        model,
        version,
        kind=JobKind.VERIFY,
        origin="registered",
        storage=storage,
        queue=queue,
        variant=variant,
        idempotency_key=idempotency_key,
        # The raw uri stays on the artifact row for the verify job; the job shows it redacted.
        params={
            "uri": redact_uri(data.uri),
            "fingerprint": fingerprint,
        },
        source_uri=data.uri,
    )
    if key is not None:
        _keep_wrapped(artifact, key, settings)
    if await variants.insert_rows(session, artifact, job):
        if (
            found := await variants.idempotent(session, principal, idempotency_key, fingerprint)
        ) is not None:
            return found
        raise Conflict("A concurrent request registered this variant.", code="variant_exists")
    enqueue_after_commit(session, sender, VERIFY_TASK, job.id, queue)
    record(
        session,
        action="artifact.register",
        actor=principal,
        target_type="artifact",
        target_id=artifact.id,
        model=model.name,
        version=version.number,
        job_id=str(job.id),
        uri=redact_uri(data.uri),
        **asdict(variant),
    )
    return variants.Outcome(artifact=artifact, job=job)


def _fingerprint(model: Model, data: ArtifactRegister) -> str:
    """What makes a retry with the same Idempotency-Key the same request. The key is never part
    of the fingerprint, the job or a log: only whether there is one; its wrapped form is kept."""
    return variants.fingerprint(
        "register",
        model.id,
        {
            **data.model_dump(exclude={"encryption_key_b64"}),
            "encrypted": bool(data.encryption_key_b64),
        },
    )


def _checked_key(data: ArtifactRegister, settings: Settings) -> bytes | None:
    """The request-time checks that need no database, in the order their errors are reported:
    the variant, the key (decoded: returned, or None without one), the uri."""
    if data.format == "hf" and data.tensor_parallel_size != 1:
        raise Invalid(
            "Format 'hf' artifacts are one file; tensor_parallel_size must be 1.",
            code="unsupported_variant",
        )
    key = (
        _decode_key(data.encryption_key_b64.get_secret_value())
        if data.encryption_key_b64 is not None
        else None
    )
    _check_register_uri(data.uri, data.tensor_parallel_size, settings)
    return key


async def _new_variant(
    session: AsyncSession, version: Version, data: ArtifactRegister, *, encrypted: bool
) -> Variant:
    """The variant this registration makes; 409 ``variant_exists`` when the version already
    has a live artifact of it (unlike a tensorize request, a registration names bytes of its
    own, so an existing artifact is not the answer to it)."""
    variant = Variant(data.dtype, data.format, data.tensor_parallel_size, encrypted)
    existing = await variants.live_variant(session, version, variant)
    if existing is not None:
        raise Conflict(
            f"Version {version.number} already has a {existing.status} artifact of this variant.",
            code="variant_exists",
            artifact_id=str(existing.id),
        )
    return variant


async def _verify_queue(
    session: AsyncSession, settings: Settings, data: ArtifactRegister, *, encrypted: bool
) -> str:
    """The queue of a live worker able to verify this variant
    (tensor_registry_server.jobs.pool.service). Its
    job loads no model, so it asks for no memory to hold one (``source_bytes`` 0)."""
    return route(
        await routable_workers(session, settings),
        Requirement(
            kind="verify",
            format=data.format,
            tensor_parallel_size=data.tensor_parallel_size,
            encrypted=encrypted,
            source_bytes=0,
        ),
        settings,
    )


def _keep_wrapped(artifact: Artifact, key: bytes, settings: Settings) -> None:
    """The registered key on the artifact row, only wrapped under the master key (the verify
    job unwraps it to check the files; key URLs unwrap it for ``keys:read`` callers)."""
    artifact.wrapped_key = wrap_key(settings.master_key_bytes(), key, artifact_id=artifact.id)
    artifact.key_id = new_key_id()
    artifact.encryption_algorithm = ENCRYPTION_ALGORITHM
