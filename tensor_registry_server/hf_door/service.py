"""What the Hugging Face door answers: a repo (``namespace/name``) at a revision is a snapshot.

A revision is a door name (tensor_registry.formats.variant): a source ref (a version number, an
alias, ``latest``, and ``main`` = latest as on the Hub) names a ready version's files; with a
variant suffix (``prod.bfloat16.hf.tp1``, ``3.float16.vllm.tp2.enc``) it names the artifact
``resolve`` would choose for those filters (tensor_registry_server.resolve.choice: the same
statement and the same
cache); a 40-hex commit this door handed out (tensor_registry_server.hf_door.commits) names that
very version or
artifact again, which is how the client asks for each file after its first call.

Scopes as on /api/v1: ``models:read`` for a source (what reading a version's files needs),
``resolve`` for a variant (what resolving it needs); namespaces apply to every name.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import HF_DEFAULT_BRANCH, Variant, parse_door_name
from tensor_registry_server.auth import Principal
from tensor_registry_server.core.choice_cache import CachedFile, ResolveCache, query_key
from tensor_registry_server.core.errors import Invalid, NotFound
from tensor_registry_server.hf_door.commits import (
    SOURCE,
    VARIANT,
    CommitRef,
    commit_id,
    git_blob_oid,
    parse_commit,
)
from tensor_registry_server.hf_door.errors import entry_not_found
from tensor_registry_server.models.schemas import validate_name
from tensor_registry_server.resolve.choice import SessionGetter, choose
from tensor_registry_server.resolve.refs import Ref, parse_ref, ready_version
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.models import Model, ModelTag
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus

MAX_REVISION_CHARS = 256
MAX_PATH_CHARS = 1024
# Bounds on what one listing of refs reads (versions, artifacts, aliases of one model).
MAX_REF_ROWS = 2000
TREE_PAGE_SIZE = 1000  # the Hub's own page size for tree listings


@dataclass(frozen=True)
class Snapshot:
    """One immutable set of files: a ready version's (SOURCE) or a ready artifact's (VARIANT)."""

    model_id: str
    model: str
    kind: str
    row_id: str
    version: int
    storage: str
    files: tuple[CachedFile, ...]
    revision: str
    variant: Variant | None = None
    created_at: datetime | None = None

    @property
    def commit(self) -> str:
        return commit_id(self.kind, self.row_id)

    def file(self, path: str) -> CachedFile:
        for f in self.files:
            if f.path == path:
                return f
        raise entry_not_found(path[:MAX_PATH_CHARS], self.commit)


def checked_name(principal: Principal, name: str) -> str:
    try:
        validate_name(name)
    except ValueError as exc:
        raise Invalid(f"model: {exc}.", code="invalid_model_name") from exc
    principal.require_namespace(name.split("/", 1)[0])
    return name


def _revision_not_found(name: str, revision: str) -> NotFound:
    return NotFound(
        f"Model '{name}' has no revision '{revision[:MAX_REVISION_CHARS]}'.",
        code="revision_not_found",
    )


async def find_snapshot(
    get_session: SessionGetter,
    principal: Principal,
    name: str,
    revision: str,
    *,
    cache: ResolveCache | None,
) -> Snapshot:
    name = checked_name(principal, name)
    if len(revision) > MAX_REVISION_CHARS:
        raise _revision_not_found(name, revision)
    commit = parse_commit(revision)
    if commit is not None:
        return await _by_commit(await get_session(), principal, name, commit, revision)
    door = parse_door_name(revision)
    ref_text = "latest" if door.ref == HF_DEFAULT_BRANCH else door.ref
    ref = parse_ref(ref_text)
    if door.variant is None:
        principal.require_scope("models:read")
        return await _source(await get_session(), name, ref, revision)
    principal.require_scope("resolve")
    variant = door.variant
    filters: dict[str, Any] = {
        "dtype": variant.dtype,
        "format": variant.format,
        "tensor_parallel_size": variant.tensor_parallel_size,
        "encrypted": variant.encrypted,
    }
    selection, _ = await choose(
        get_session, name, ref, filters, cache=cache, qkey=query_key(name, ref_text, filters)
    )
    return Snapshot(
        model_id=selection.model_id,
        model=selection.model,
        kind=VARIANT,
        row_id=selection.artifact_id,
        version=selection.version,
        storage=selection.storage,
        files=selection.files,
        revision=revision,
        variant=variant,
    )


async def model_row(session: AsyncSession, name: str) -> Model:
    model = await session.scalar(select(Model).where(Model.name == name))
    if model is None:
        raise NotFound(f"No model named '{name}'.", code="model_not_found")
    return model


async def _version_files(session: AsyncSession, version_id: uuid.UUID) -> tuple[CachedFile, ...]:
    rows = await session.execute(
        select(VersionFile.path, VersionFile.size, VersionFile.sha256, VersionFile.storage_key)
        .where(VersionFile.version_id == version_id)
        .order_by(VersionFile.path)
    )
    return tuple(CachedFile(path=r[0], size=int(r[1]), sha256=r[2], storage_key=r[3]) for r in rows)


async def _source(session: AsyncSession, name: str, ref: Ref, revision: str) -> Snapshot:
    model = await model_row(session, name)
    version = await ready_version(session, model.id, ref)
    if version is None:
        raise _revision_not_found(name, revision)
    return await _source_snapshot(session, version, model.name, revision)


async def _source_snapshot(
    session: AsyncSession, version: Version, name: str, revision: str
) -> Snapshot:
    """A ready version as the snapshot a revision (by ref or by commit) names."""
    return Snapshot(
        model_id=str(version.model_id),
        model=name,
        kind=SOURCE,
        row_id=str(version.id),
        version=version.number,
        storage=version.storage,
        files=await _version_files(session, version.id),
        revision=revision,
        created_at=version.finalized_at or version.created_at,
    )


async def _by_commit(
    session: AsyncSession, principal: Principal, name: str, commit: CommitRef, revision: str
) -> Snapshot:
    if commit.kind == SOURCE:
        principal.require_scope("models:read")
        found = (
            await session.execute(
                select(Version, Model.name)
                .join(Model, Model.id == Version.model_id)
                .where(Version.id == commit.row_id)
            )
        ).first()
        if found is None or found[1] != name or found[0].status != VersionStatus.READY:
            raise _revision_not_found(name, revision)
        return await _source_snapshot(session, found[0], name, revision)
    principal.require_scope("resolve")
    row = (
        await session.execute(
            select(Artifact, Model.name)
            .join(Model, Model.id == Artifact.model_id)
            .where(Artifact.id == commit.row_id)
        )
    ).first()
    if row is None or row[1] != name or row[0].status != ArtifactStatus.READY:
        raise _revision_not_found(name, revision)
    artifact = row[0]
    rows = await session.execute(
        select(ArtifactFile.path, ArtifactFile.size, ArtifactFile.sha256, ArtifactFile.storage_key)
        .where(ArtifactFile.artifact_id == artifact.id)
        .order_by(ArtifactFile.path)
    )
    return Snapshot(
        model_id=str(artifact.model_id),
        model=name,
        kind=VARIANT,
        row_id=str(artifact.id),
        version=artifact.version_number,
        storage=artifact.storage,
        files=tuple(
            CachedFile(path=r[0], size=int(r[1]), sha256=r[2], storage_key=r[3]) for r in rows
        ),
        revision=revision,
        variant=_variant_of(artifact),
        created_at=artifact.ready_at or artifact.created_at,
    )


def _variant_of(artifact: Artifact) -> Variant:
    return Variant(
        artifact.dtype, artifact.format, artifact.tensor_parallel_size, bool(artifact.encrypted)
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def audit_row(
    principal: Principal, snap: Snapshot, stored: CachedFile, *, redirect_ttl: int | None
) -> dict[str, Any]:
    """The audit row of a file handed out: resolve's row (``action=resolve``, the artifact or
    version, the ref, the version) with the door, the path and the commit."""
    return {
        "action": "resolve",
        "actor": principal,
        "target_type": "artifact" if snap.kind == VARIANT else "version",
        "target_id": snap.row_id,
        "model": snap.model,
        "ref": snap.revision,
        "version": snap.version,
        "door": "hf",
        "path": stored.path,
        "commit": snap.commit,
        "redirect": redirect_ttl is not None,
        "ttl": redirect_ttl,
    }


# ---- repo info -------------------------------------------------------------------------------


def _lfs(f: CachedFile) -> tuple[str, dict[str, Any]]:
    oid, pointer_size = git_blob_oid(f.sha256, f.size)
    return oid, {"oid": f.sha256, "size": f.size, "pointerSize": pointer_size}


async def repo_info(
    session: AsyncSession, snap: Snapshot, *, files_metadata: bool
) -> dict[str, Any]:
    """The Hub's model info (``GET /api/models/{repo_id}[/revision/{rev}]``) for a snapshot."""
    model = await model_row(session, snap.model)
    tags = sorted(
        (await session.execute(select(ModelTag.tag).where(ModelTag.model_id == model.id)))
        .scalars()
        .all()
    )
    siblings: list[dict[str, Any]] = []
    for f in snap.files:
        sibling: dict[str, Any] = {"rfilename": f.path}
        if files_metadata:
            oid, lfs = _lfs(f)
            sibling.update(size=f.size, blobId=oid, lfs={"size": f.size, "sha256": f.sha256, **lfs})
        siblings.append(sibling)
    namespace = snap.model.split("/", 1)[0]
    return {
        "_id": snap.model_id,
        "id": snap.model,
        "modelId": snap.model,
        "author": namespace,
        "sha": snap.commit,
        "lastModified": _iso(snap.created_at or model.updated_at),
        "createdAt": _iso(model.created_at),
        "private": True,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": tags,
        "cardData": {"description": model.description} if model.description else None,
        "siblings": siblings,
        "usedStorage": sum(f.size for f in snap.files),
        # Not the Hub's: what this revision is in the registry's own words.
        "tensorRegistry": {
            "kind": snap.kind,
            "version": snap.version,
            "artifact_id": snap.row_id if snap.kind == VARIANT else None,
            "variant": snap.variant.suffix if snap.variant is not None else None,
        },
    }


# ---- tree ------------------------------------------------------------------------------------


def _folder_oid(snap: Snapshot, path: str) -> str:
    """A folder's id: fixed per snapshot and path (the door keeps no git trees)."""
    return hashlib.sha1(f"{snap.commit}:{path}".encode()).hexdigest()  # noqa: S324 - an id


def tree_entries(
    snap: Snapshot, path: str, *, recursive: bool, expand: bool
) -> list[dict[str, Any]]:
    """The entries of ``GET /api/models/{repo_id}/tree/{rev}[/{path}]``: files and folders under
    ``path`` (directly, or all the way down with ``recursive``), folders first as the Hub lists
    them. An unknown folder is 404 ``EntryNotFound``."""
    base = path.strip("/")
    prefix = f"{base}/" if base else ""
    entries: dict[str, dict[str, Any]] = {}
    last_commit = (
        {"id": snap.commit, "title": snap.revision, "date": _iso(snap.created_at)}
        if expand
        else None
    )
    for f in snap.files:
        if not f.path.startswith(prefix):
            continue
        rest = f.path[len(prefix) :]
        parts = rest.split("/")
        # Every folder between ``path`` and the file (only the first one unless recursive).
        for depth in range(1, len(parts) if recursive else min(2, len(parts))):
            folder = prefix + "/".join(parts[:depth])
            entries.setdefault(
                folder,
                {"type": "directory", "oid": _folder_oid(snap, folder), "size": 0, "path": folder},
            )
        if recursive or len(parts) == 1:
            oid, lfs = _lfs(f)
            entries[f.path] = {
                "type": "file",
                "oid": oid,
                "size": f.size,
                "path": f.path,
                "lfs": lfs,
            }
    if base and not entries:
        raise entry_not_found(base[:MAX_PATH_CHARS], snap.commit)
    if last_commit is not None:
        for entry in entries.values():
            entry["lastCommit"] = last_commit
    return sorted(entries.values(), key=lambda e: (e["type"] != "directory", e["path"]))


# ---- refs ------------------------------------------------------------------------------------


def _ref(name: str, kind: str, commit: str) -> dict[str, str]:
    return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": commit}


async def refs(session: AsyncSession, name: str) -> dict[str, Any]:
    """``GET /api/models/{repo_id}/refs``: ``main`` and the aliases are branches (they move),
    version numbers are tags; each with a variant suffix for every variant its version has,
    pointing at the artifact that name resolves to."""
    model = await model_row(session, name)
    versions = (
        await session.execute(
            select(Version.id, Version.number)
            .where(Version.model_id == model.id, Version.status == VersionStatus.READY)
            .order_by(Version.number.desc())
            .limit(MAX_REF_ROWS)
        )
    ).all()
    aliases = (
        await session.execute(
            select(Alias.name, Alias.version_id)
            .where(Alias.model_id == model.id)
            .order_by(Alias.name)
            .limit(MAX_REF_ROWS)
        )
    ).all()
    artifacts = (
        await session.execute(
            select(Artifact)
            .where(Artifact.model_id == model.id, Artifact.status == ArtifactStatus.READY)
            # The choice resolve makes among artifacts of one variant: the newest wins.
            .order_by(Artifact.created_at.desc(), Artifact.id.desc())
            .limit(MAX_REF_ROWS)
        )
    ).scalars()
    chosen: dict[uuid.UUID, dict[str, str]] = {}  # version id → {variant suffix: commit}
    for artifact in artifacts:
        per_version = chosen.setdefault(artifact.version_id, {})
        per_version.setdefault(_variant_of(artifact).suffix, commit_id(VARIANT, artifact.id))
    number_of = {vid: number for vid, number in versions}

    def named(ref: str, version_id: uuid.UUID) -> list[tuple[str, str]]:
        if version_id not in number_of:
            return []  # an alias on a version that is not ready
        own = [(ref, commit_id(SOURCE, version_id))]
        return own + [
            (f"{ref}.{suffix}", commit)
            for suffix, commit in sorted(chosen.get(version_id, {}).items())
        ]

    branches: list[dict[str, str]] = []
    if versions:
        branches += [_ref(n, "heads", c) for n, c in named(HF_DEFAULT_BRANCH, versions[0][0])]
    for alias, version_id in aliases:
        branches += [_ref(n, "heads", c) for n, c in named(alias, version_id)]
    tags = [_ref(n, "tags", c) for vid, number in versions for n, c in named(str(number), vid)]
    return {"branches": branches, "converts": [], "tags": tags}


# ---- whoami ----------------------------------------------------------------------------------


def whoami(principal: Principal) -> dict[str, Any]:
    """``GET /api/whoami-v2``: the token as a Hub user; its namespaces as its organizations."""
    writes = principal.is_admin or principal.has_scope("models:write")
    return {
        "type": "user",
        "id": str(principal.token_id),
        "name": principal.name,
        "fullname": principal.name,
        "isPro": False,
        "canPay": False,
        "emailVerified": False,
        "orgs": [
            {"type": "org", "name": ns, "fullname": ns} for ns in sorted(principal.namespaces or ())
        ],
        "auth": {
            "type": "access_token",
            "accessToken": {
                "displayName": principal.name,
                "role": "write" if writes else "read",
                "scopes": sorted(principal.scopes),
                "namespaces": sorted(principal.namespaces)
                if principal.namespaces is not None
                else None,
                "expiresAt": _iso(principal.expires_at),
            },
        },
    }
