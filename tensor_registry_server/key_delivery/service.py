"""Key delivery: the raw 32-byte tensorizer key of an encrypted artifact, behind a signed URL.

The URL is minted by resolve for tokens with ``keys:read`` (audited there as ``key.issue``).
It stays valid for repeated fetches until it expires, because vLLM re-reads the key file several
times per rank while loading (docs/tensorizer-vllm-facts.md §1.4); every fetch is audited as
``key.fetch`` with the caller's address and user agent, so issues and uses can be matched by
artifact and ``exp``.
"""

from __future__ import annotations

import logging
import uuid

from cryptography.exceptions import InvalidTag
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry_server.audit.service import record
from tensor_registry_server.core.errors import AppError, Conflict, Forbidden, NotFound
from tensor_registry_server.core.key_wrapping import KEY_BYTES, unwrap_key
from tensor_registry_server.rows.artifacts import Artifact, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.settings import Settings
from tensor_registry_server.storage import signing

log = logging.getLogger("tensor_registry.keys")


async def fetch_key(
    session: AsyncSession,
    artifact_id: str,
    *,
    exp: str | None,
    sig: str | None,
    settings: Settings,
    client: str | None,
    user_agent: str | None,
) -> bytes:
    # The signature is checked before anything is looked up: forged URLs learn nothing.
    signing.verify(
        settings.signing_key_bytes(), purpose="key", subject=artifact_id, exp=exp, sig=sig
    )
    try:
        artifact_uuid = uuid.UUID(artifact_id)
    except ValueError as exc:  # only reachable with a validly signed non-uuid subject
        raise Forbidden("The URL signature does not match.", code="signature_invalid") from exc
    row = (
        await session.execute(
            select(
                Artifact.encrypted,
                Artifact.wrapped_key,
                Artifact.status,
                Artifact.key_id,
                Artifact.version_number,
                Model.name,
            )
            .join(Model, Model.id == Artifact.model_id)
            .where(Artifact.id == artifact_uuid)
        )
    ).first()
    if row is None:
        raise NotFound(f"No artifact with id {artifact_id}.", code="artifact_not_found")
    encrypted, wrapped, status, key_id, version, model_name = row
    if not encrypted or not wrapped:
        raise NotFound(f"Artifact {artifact_id} is not encrypted.", code="key_not_found")
    if status != ArtifactStatus.READY:
        raise Conflict(f"Artifact {artifact_id} is {status}.", code="artifact_not_ready")
    try:
        key = unwrap_key(settings.master_key_bytes(), wrapped, artifact_id=artifact_uuid)
    except (ValueError, InvalidTag) as exc:
        log.error("artifact %s: wrapped key does not unwrap under the master key", artifact_id)
        raise AppError(
            "The artifact key cannot be unwrapped (was the master key changed?).",
            code="key_unwrap_failed",
        ) from exc
    if len(key) != KEY_BYTES:
        raise AppError("The stored artifact key is malformed.", code="key_unwrap_failed")
    record(
        session,
        action="key.fetch",
        actor=None,
        target_type="artifact",
        target_id=artifact_uuid,
        model=model_name,
        version=version,
        key_id=key_id,
        exp=int(exp or 0),
        client=client,
        user_agent=(user_agent or "")[:200] or None,
    )
    return key
