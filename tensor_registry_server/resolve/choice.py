"""Choosing the artifact a resolve answers with: one indexed statement, cached by the caller.

The choice is one statement (models → versions → newest matching ready artifact → its files);
``choose`` asks the resolve cache (tensor_registry_server.core.choice_cache) first and stores
what the database
said. Only a miss pays for ``_explain_miss``, which says precisely why nothing matched.

Decisions where the contract is silent:
- ``latest`` is the highest *ready version*, as docs/api.md defines it, even when that version lacks
  the requested variant: then the answer is 404 ``no_matching_artifact`` listing the variants
  it has and the versions that do have a match. Falling back to an older version would let
  nodes with different filters silently run different versions during a rollout.
- Among several matching ready artifacts of the version the most recently created wins.
- Default variants (issue 26 §7.4): a filter the request leaves out is taken from the alias's
  ``default_variant`` when it has one (ref is an alias), else from the model's (the more
  specific default applies whole, they are not mixed); the answer's ``chosen_by`` says
  which rule decided: ``request`` (the request's filters alone), ``alias_default`` or
  ``model_default`` (a default filled at least one filter), ``newest``
  (nothing constrained the choice). A default that no artifact of the version matches is a 404
  like any filter: a fleet never silently loads another variant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC
from typing import Any, NoReturn

from sqlalchemy import and_, null, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from tensor_registry_server.core.choice_cache import CachedFile, Lookup, ResolveCache, Selection
from tensor_registry_server.core.errors import NotFound
from tensor_registry_server.resolve.refs import Ref, version_named
from tensor_registry_server.resolve.schemas import ResolveQuery
from tensor_registry_server.resolve.warm import ready_bundles
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionStatus

CHOICE_ORDER = (
    "the filters given (dtype, format, tensor_parallel_size, encrypted) must match; then "
    "unencrypted before encrypted; then the newest"
)


CHOSEN_BY = ("request", "alias_default", "model_default", "newest")


def apply_defaults(
    filters: dict[str, Any],
    alias_defaults: dict[str, Any] | None,
    model_defaults: dict[str, Any] | None,
) -> tuple[dict[str, Any], str]:
    """The filters with what the request left out filled from the default variant (the
    alias's when it has one, else the model's: the more specific default applies whole), and
    the rule that decided."""
    source, defaults = (
        ("alias_default", alias_defaults) if alias_defaults else ("model_default", model_defaults)
    )
    merged = dict(filters)
    filled = False
    for field, value in filters.items():
        if value is None and defaults and defaults.get(field) is not None:
            merged[field] = defaults[field]
            filled = True
    if filled:
        return merged, source
    if any(value is not None for value in filters.values()):
        return merged, "request"
    return merged, "newest"


async def _variant_defaults(
    session: AsyncSession, name: str, ref: Ref
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the alias's default variant, the model's): one indexed read, on a cache miss only."""
    if ref.kind == "alias":
        row = (
            await session.execute(
                select(Alias.default_variant, Model.default_variant)
                .select_from(Model)
                .outerjoin(Alias, (Alias.model_id == Model.id) & (Alias.name == ref.alias))
                .where(Model.name == name)
            )
        ).first()
        return (row[0], row[1]) if row is not None else (None, None)
    model_defaults = await session.scalar(select(Model.default_variant).where(Model.name == name))
    return None, model_defaults


def query_filters(q: ResolveQuery) -> dict[str, Any]:
    return {
        # ``artifact_id``: a node that re-resolves pins the artifact it started with.
        "id": q.artifact_id,
        "dtype": q.dtype,
        "format": q.format,
        "tensor_parallel_size": q.tensor_parallel_size,
        "encrypted": q.encrypted,
    }


def _artifact_filters(entity: Any, filters: dict[str, Any]) -> list[Any]:
    return [getattr(entity, name) == value for name, value in filters.items() if value is not None]


def _choice_statement(name: str, ref: Ref, filters: dict[str, Any]) -> Any:
    """The hot-path query: one row per file of the chosen artifact (none when nothing matches).

    The choice (CHOICE_ORDER): the filters given are hard constraints; among the ready
    artifacts of the version that match, unencrypted before encrypted, then the newest. So
    adding an encrypted variant never changes what a resolve without ``encrypted=`` returns,
    and a caller without ``keys:read`` gets a plain artifact whenever one matches.
    """
    newer = aliased(Artifact)
    newest_match = (
        select(newer.id)
        .where(
            newer.version_id == Version.id,
            newer.status == ArtifactStatus.READY,
            *_artifact_filters(newer, filters),
        )
        .order_by(newer.encrypted.asc(), newer.created_at.desc(), newer.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    stmt = (
        select(
            Model.id,
            Model.name,
            Model.namespace,
            Version.number,
            Artifact.id,
            Artifact.dtype,
            Artifact.format,
            Artifact.tensor_parallel_size,
            Artifact.encrypted,
            Artifact.key_id,
            Artifact.encryption_algorithm,
            Artifact.storage,
            Artifact.storage_prefix,
            Artifact.tensorizer_version,
            ArtifactFile.path,
            ArtifactFile.size,
            ArtifactFile.sha256,
            ArtifactFile.storage_key,
            Artifact.stats["compatibility_key"].as_string(),
            *((Alias.revision, Alias.updated_at) if ref.kind == "alias" else (null(), null())),
            Version.remote_code,
        )
        .select_from(Model)
        .join(Version, Version.model_id == Model.id)
        .join(Artifact, Artifact.id == newest_match)
        .join(ArtifactFile, ArtifactFile.artifact_id == Artifact.id)
        .where(Model.name == name, Version.status == VersionStatus.READY)
        .order_by(ArtifactFile.path)
    )
    if ref.kind == "alias":
        # Joined (not a subquery): the alias's revision and move time go into the answer's
        # signed binding, which is how a node tells a rolled-back alias (docs/trust.md).
        stmt = stmt.join(
            Alias,
            and_(
                Alias.model_id == Model.id,
                Alias.name == ref.alias,
                Alias.version_id == Version.id,
            ),
        )
    else:
        stmt = stmt.where(version_named(ref, Model.id))
    return stmt


def _selection(rows: Sequence[Any]) -> Selection:
    first = rows[0]
    return Selection(
        model_id=str(first[0]),
        model=first[1],
        namespace=first[2],
        version=first[3],
        artifact_id=str(first[4]),
        dtype=first[5],
        format=first[6],
        tensor_parallel_size=first[7],
        encrypted=bool(first[8]),
        key_id=first[9],
        encryption_algorithm=first[10],
        storage=first[11],
        storage_prefix=first[12],
        tensorizer_version=first[13],
        files=tuple(
            CachedFile(path=r[14], size=int(r[15]), sha256=r[16], storage_key=r[17]) for r in rows
        ),
        compatibility_key=first[18],
        alias_revision=first[19],
        alias_moved_at=_iso(first[20]),
        remote_code=first[21],
    )


def _iso(moment: Any) -> str | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return str(moment.astimezone(UTC).isoformat().replace("+00:00", "Z"))


SessionGetter = Callable[[], Awaitable[AsyncSession]]


async def choose(
    get_session: SessionGetter,
    name: str,
    ref: Ref,
    filters: dict[str, Any],
    *,
    cache: ResolveCache | None,
    qkey: str,
) -> tuple[Selection, bool]:
    """The chosen artifact and whether it came from the cache."""
    lookup = await cache.lookup(name, qkey) if cache is not None else None
    if lookup is not None and lookup.selection is not None:
        return lookup.selection, True
    session = await get_session()
    alias_defaults, model_defaults = await _variant_defaults(session, name, ref)
    merged, chosen_by = apply_defaults(filters, alias_defaults, model_defaults)
    rows = (await session.execute(_choice_statement(name, ref, merged))).all()
    if not rows:
        await _explain_miss(session, name, ref, merged, chosen_by=chosen_by)
    selection = replace(
        _selection(rows),
        chosen_by=chosen_by,
        warm_bundles=await ready_bundles(session, rows[0][4]),
    )
    if cache is not None:
        await cache.store(lookup or Lookup(None, None, None), qkey, selection)
    return selection, False


async def _explain_miss(
    session: AsyncSession,
    name: str,
    ref: Ref,
    filters: dict[str, Any],
    *,
    chosen_by: str = "request",
) -> NoReturn:
    """Off the hot path: say precisely why nothing matched, listing what exists."""
    model_id = await session.scalar(select(Model.id).where(Model.name == name))
    if model_id is None:
        raise NotFound(f"No model named '{name}'.", code="model_not_found")
    version_row: Any  # (id, number, status) or None
    if ref.kind == "alias":
        version_row = (
            await session.execute(
                select(Version.id, Version.number, Version.status)
                .join(Alias, Alias.version_id == Version.id)
                .where(Alias.model_id == model_id, Alias.name == ref.alias)
            )
        ).first()
        if version_row is None:
            raise NotFound(f"Model '{name}' has no alias '{ref.alias}'.", code="alias_not_found")
    elif ref.kind == "version":
        version_row = (
            await session.execute(
                select(Version.id, Version.number, Version.status).where(
                    Version.model_id == model_id, Version.number == ref.number
                )
            )
        ).first()
        if version_row is None:
            raise NotFound(f"Model '{name}' has no version {ref.number}.", code="version_not_found")
    else:
        version_row = (
            await session.execute(
                select(Version.id, Version.number, Version.status)
                .where(Version.model_id == model_id, Version.status == VersionStatus.READY)
                .order_by(Version.number.desc())
                .limit(1)
            )
        ).first()
    available: list[dict[str, Any]] = []
    if version_row is not None:
        artifacts = (
            await session.execute(
                select(
                    Artifact.dtype,
                    Artifact.format,
                    Artifact.tensor_parallel_size,
                    Artifact.encrypted,
                    Artifact.status,
                )
                .where(Artifact.version_id == version_row[0])
                .order_by(Artifact.created_at.desc())
            )
        ).all()
        available = [
            {
                "version": version_row[1],
                "dtype": a[0],
                "format": a[1],
                "tensor_parallel_size": a[2],
                "encrypted": bool(a[3]),
                "status": a[4],
            }
            for a in artifacts
        ]
    matching_versions = list(
        (
            await session.execute(
                select(Version.number)
                .join(Artifact, Artifact.version_id == Version.id)
                .where(
                    Version.model_id == model_id,
                    Version.status == VersionStatus.READY,
                    Artifact.status == ArtifactStatus.READY,
                    *_artifact_filters(Artifact, filters),
                )
                .group_by(Version.number)
                .order_by(Version.number.desc())
                .limit(10)
            )
        ).scalars()
    )
    wanted = ", ".join(f"{k}={v}" for k, v in filters.items() if v is not None) or "any variant"
    if chosen_by in ("alias_default", "model_default"):
        wanted += f" (with the {chosen_by.replace('_', ' ')} variant)"
    if version_row is None:
        where = f"'{name}' has no ready version"
    elif version_row[2] != VersionStatus.READY:
        where = f"version {version_row[1]} of '{name}' is {version_row[2]}"
    else:
        where = f"version {version_row[1]} of '{name}' has no ready artifact with {wanted}"
    raise NotFound(
        f"Nothing to resolve: {where}. (How resolve chooses: {CHOICE_ORDER}.)",
        code="no_matching_artifact",
        title="No matching artifact",
        version=version_row[1] if version_row is not None else None,
        chosen_by=chosen_by,
        available=available,
        versions_with_match=matching_versions,
    )
