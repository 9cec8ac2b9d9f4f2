"""A job as the API answers it: its typed variant (from the artifact row) and the deprecated
params keys derived from it. Shared by the jobs routes and the routes that start a job."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant
from tensor_registry_server.core.redact import redact_value
from tensor_registry_server.core.schemas import VariantOut
from tensor_registry_server.jobs import service
from tensor_registry_server.jobs.schemas import JobError, JobOut, JobProgress
from tensor_registry_server.rows.artifacts import Artifact
from tensor_registry_server.rows.jobs import Job, JobKind

# What a job's params carried a copy of before the variant had one home (issue 27): still
# answered for older clients, derived from the artifact row, never stored again.
_DEPRECATED_PARAMS = (
    "version",
    "dtype",
    "format",
    "tensor_parallel_size",
    "storage",
    "encrypt",
    "encrypted",
)


def variant_of(job: Job, artifact: Artifact | None) -> VariantOut | None:
    """What ``job`` makes: its artifact row's typed variant. A job from before issue 27 whose
    artifact is gone answers with the copy its params kept; any other job without one, None."""
    if artifact is not None:
        return VariantOut.of(
            artifact.variant, version=artifact.version_number, storage=artifact.storage
        )
    return _stored_copy(job.params or {})


def _stored_copy(params: dict[str, Any]) -> VariantOut | None:
    try:
        variant = Variant(
            params["dtype"],
            params["format"],
            int(params.get("tensor_parallel_size", 1)),
            bool(params.get("encrypt") or params.get("encrypted")),
        )
        return VariantOut.of(variant, version=int(params["version"]), storage=params["storage"])
    except (KeyError, TypeError, ValueError):
        return None


def _params(job: Job, variant: VariantOut | None) -> dict[str, Any]:
    shown = {
        k: redact_value(v) if k in ("uri", "source_uri") else v
        for k, v in (job.params or {}).items()
        if k != "fingerprint" and k not in _DEPRECATED_PARAMS
    }
    if variant is not None:
        shown.update(variant.model_dump(exclude={"encrypted"}))
        shown["encrypt" if job.kind == JobKind.TENSORIZE else "encrypted"] = variant.encrypted
    return shown


def to_out(job: Job, variant: VariantOut | None, model_name: str | None = None) -> JobOut:
    return JobOut(
        id=job.id,
        kind=job.kind,
        status=job.status,
        progress=JobProgress(
            stage=job.stage, bytes_done=job.bytes_done, bytes_total=job.bytes_total
        ),
        attempts=job.attempts,
        error=JobError.model_validate(job.error) if job.error else None,
        artifact_id=job.artifact_id,
        model_id=job.model_id,
        model_name=model_name,
        version_id=job.version_id,
        queue=job.queue,
        worker=job.worker,
        cancel_requested=job.cancel_requested,
        variant=variant,
        params=_params(job, variant),
        result=dict(job.result or {}),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
    )


async def job_variant(session: AsyncSession, job: Job) -> VariantOut | None:
    artifacts = await service.job_artifacts(session, [job])
    return variant_of(job, artifacts.get(job.artifact_id) if job.artifact_id else None)
