"""What the OCI door reads: who asks, which source or variant a tag or digest names, its tags,
and which stored file a blob digest is.

Access (docs/front-doors.md, "OCI distribution"):
- Credentials: the registry's API token as the password of Basic auth (any user name), the API
  token itself as a Bearer, or a bearer from the token flow
  (tensor_registry_server.oci_door.bearer). None or a
  bad one: 401 ``UNAUTHORIZED`` with the ``WWW-Authenticate: Bearer realm=…,service=…`` challenge.
- Scopes, as on ``/api/v1``: a source's manifest and files need ``models:read`` (what reads a
  version's files there); a variant's need ``resolve`` (what hands out an artifact's URLs there).
- Namespaces, as on ``/api/v1``: a repository in a namespace the token is not limited to answers
  403 ``DENIED``, the same whether it exists or not, so nothing about it leaks.
- A blob is served only when a ready version or ready artifact *of this repository* lists a file
  with that sha256: a digest of another repository's file is unknown here.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tensor_registry.formats.variant import Variant, parse_door_name
from tensor_registry_server.auth import Principal, authenticate_secret, authenticate_token_id
from tensor_registry_server.core.db import utcnow
from tensor_registry_server.core.errors import AppError, Invalid
from tensor_registry_server.models.schemas import validate_name
from tensor_registry_server.oci_door import bearer, modelpack
from tensor_registry_server.oci_door.errors import (
    OciError,
    blob_unknown,
    denied,
    manifest_unknown,
    name_unknown,
)
from tensor_registry_server.oci_door.modelpack import Document, File, Subject
from tensor_registry_server.resolve.refs import parse_ref, ready_version
from tensor_registry_server.rows.aliases import Alias
from tensor_registry_server.rows.artifacts import Artifact, ArtifactFile, ArtifactStatus
from tensor_registry_server.rows.models import Model
from tensor_registry_server.rows.versions import Version, VersionFile, VersionStatus
from tensor_registry_server.settings import Settings

SERVICE = "tensor-registry"
BEARER_TTL_SECONDS = 300
DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
# A tag, as the distribution spec defines it.
TAG_RE = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$")
# Versions (newest first) searched when a manifest or config is asked for by digest.
MAX_SUBJECT_VERSIONS = 500
MAX_SCOPES = 16
MAX_TAGS_PAGE = 1000
SOURCE_SCOPE = "models:read"
VARIANT_SCOPE = "resolve"


def challenge(settings: Settings, repository: str | None = None) -> str:
    """The ``WWW-Authenticate`` value: where the token flow starts (the registry's public URL,
    never the request's ``Host``: clients send their credentials there)."""
    realm = f"{settings.public_base_url.rstrip('/')}/v2/token"
    value = f'Bearer realm="{realm}",service="{SERVICE}"'
    if repository is not None:
        value += f',scope="repository:{repository}:pull"'
    return value


def unauthorized(settings: Settings, repository: str | None, message: str) -> OciError:
    return OciError(
        401,
        "UNAUTHORIZED",
        message,
        headers={"WWW-Authenticate": challenge(settings, repository)},
    )


def basic_secret(authorization: str) -> str | None:
    """The password of a ``Basic`` header; None when it is not one."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic" or not value.strip() or len(value) > 4096:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon and password else None


async def authenticate(
    session: AsyncSession,
    settings: Settings,
    authorization: str | None,
    repository: str | None = None,
    *,
    allow_flow_bearer: bool = True,
) -> Principal:
    """The caller: Basic with the API token as password, the API token or a flow bearer as
    Bearer. Anything else: 401 with the challenge."""
    if not authorization:
        raise unauthorized(settings, repository, "authentication required")
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    try:
        if scheme.lower() == "basic":
            secret = basic_secret(authorization)
            if secret is None:
                raise unauthorized(settings, repository, "malformed Basic credentials")
            return await authenticate_secret(session, secret)
        if scheme.lower() == "bearer" and value:
            if value.startswith(bearer.PREFIX):
                if not allow_flow_bearer:
                    raise unauthorized(settings, repository, "a bearer cannot mint another")
                token_id = bearer.token_id_of(settings.signing_key_bytes(), value)
                if token_id is None:
                    raise unauthorized(settings, repository, "invalid or expired bearer token")
                return await authenticate_token_id(session, token_id)
            return await authenticate_secret(session, value)
    except AppError as exc:  # tensor_registry_server.auth's 401s: unknown, revoked or expired
        raise unauthorized(settings, repository, exc.detail) from exc
    raise unauthorized(settings, repository, "authentication required")


def requested_scopes(scopes: Iterable[str]) -> list[tuple[str, list[str]]]:
    """``repository:NAME:ACTIONS`` scopes of a token request (others are ignored)."""
    found: list[tuple[str, list[str]]] = []
    for scope in list(scopes)[:MAX_SCOPES]:
        for item in scope.split(" ")[:MAX_SCOPES]:
            kind, _, rest = item.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and name and len(name) <= 256:
                found.append((name, [a for a in actions.split(",") if a][:8]))
    return found


def granted_access(principal: Principal, scopes: Iterable[str]) -> list[dict[str, Any]]:
    """What a bearer for these scopes lets the caller do: ``pull`` of each repository in a
    namespace it may read with a scope that reads something (push never)."""
    readable = principal.has_scope(SOURCE_SCOPE) or principal.has_scope(VARIANT_SCOPE)
    access = []
    for name, actions in requested_scopes(scopes):
        namespace = name.split("/", 1)[0]
        if readable and "pull" in actions and principal.can_access_namespace(namespace):
            access.append({"type": "repository", "name": name, "actions": ["pull"]})
    return access


def mint_bearer(settings: Settings, principal: Principal) -> bearer.Bearer:
    ttl = BEARER_TTL_SECONDS
    if principal.expires_at is not None:
        left = int((principal.expires_at - utcnow()).total_seconds())
        ttl = max(1, min(ttl, left))
    return bearer.mint(settings.signing_key_bytes(), principal.token_id, ttl)


def check_repository(principal: Principal, repository: str) -> str:
    """The repository name (``namespace/name``), allowed for this caller, or NAME_UNKNOWN /
    DENIED. The namespace is checked before any lookup: the answer for another namespace
    is the same whether the repository exists or not."""
    try:
        name = validate_name(repository)
    except ValueError as exc:
        raise name_unknown(repository) from exc
    if not principal.can_access_namespace(name.split("/", 1)[0]):
        raise denied(f"this token is not allowed in namespace '{name.split('/', 1)[0]}'")
    if not (principal.has_scope(SOURCE_SCOPE) or principal.has_scope(VARIANT_SCOPE)):
        raise denied(f"this token needs the '{SOURCE_SCOPE}' or '{VARIANT_SCOPE}' scope")
    return name


def require_kind(principal: Principal, kind: str) -> None:
    scope = SOURCE_SCOPE if kind == "version" else VARIANT_SCOPE
    if not principal.has_scope(scope):
        what = "a source" if kind == "version" else "a tensorized variant"
        raise denied(f"reading {what} needs the '{scope}' scope")


async def model_row(session: AsyncSession, name: str) -> tuple[uuid.UUID, str]:
    row = (await session.execute(select(Model.id, Model.name).where(Model.name == name))).first()
    if row is None:
        raise name_unknown(name)
    return row[0], row[1]


def _version_subject(model: str, version: Version, files: Iterable[File]) -> Subject:
    return Subject(
        kind="version",
        id=str(version.id),
        model=model,
        version=version.number,
        created_at=version.finalized_at or version.created_at,
        storage=version.storage,
        files=tuple(sorted(files, key=lambda f: f.path)),
        architecture=version.architecture,
        parameter_count=version.parameter_count,
    )


def _artifact_subject(model: str, artifact: Artifact, files: Iterable[File]) -> Subject:
    return Subject(
        kind="artifact",
        id=str(artifact.id),
        model=model,
        version=artifact.version_number,
        created_at=artifact.ready_at or artifact.created_at,
        storage=artifact.storage,
        files=tuple(sorted(files, key=lambda f: f.path)),
        variant=Variant(
            artifact.dtype, artifact.format, artifact.tensor_parallel_size, artifact.encrypted
        ),
        parameter_count=artifact.parameter_count,
        tensorizer_version=artifact.tensorizer_version,
    )


_VERSION_FILE_COLUMNS = (
    VersionFile.path,
    VersionFile.size,
    VersionFile.sha256,
    VersionFile.storage_key,
)
_ARTIFACT_FILE_COLUMNS = (
    ArtifactFile.path,
    ArtifactFile.size,
    ArtifactFile.sha256,
    ArtifactFile.storage_key,
)


async def subject_by_tag(
    session: AsyncSession, model_id: uuid.UUID, model: str, tag: str
) -> Subject:
    """The ready version or artifact a tag names, or MANIFEST_UNKNOWN."""
    if not TAG_RE.match(tag):
        raise manifest_unknown(model, tag)
    name = parse_door_name(tag)
    try:
        ref = parse_ref(name.ref)
    except Invalid as exc:
        raise manifest_unknown(model, tag) from exc
    version = await ready_version(session, model_id, ref)
    if version is None:
        raise manifest_unknown(model, tag)
    if name.variant is None:
        rows = await session.execute(
            select(*_VERSION_FILE_COLUMNS).where(VersionFile.version_id == version.id)
        )
        return _version_subject(model, version, (File(*r) for r in rows))
    v = name.variant
    artifact = (
        await session.scalars(
            select(Artifact)
            .where(
                Artifact.version_id == version.id,
                Artifact.status == ArtifactStatus.READY,
                Artifact.dtype == v.dtype,
                Artifact.format == v.format,
                Artifact.tensor_parallel_size == v.tensor_parallel_size,
                Artifact.encrypted == v.encrypted,
            )
            .order_by(Artifact.created_at.desc())
            .limit(1)
        )
    ).first()
    if artifact is None:
        raise manifest_unknown(model, tag)
    rows = await session.execute(
        select(*_ARTIFACT_FILE_COLUMNS).where(ArtifactFile.artifact_id == artifact.id)
    )
    return _artifact_subject(model, artifact, (File(*r) for r in rows))


async def _ready_versions(session: AsyncSession, model_id: uuid.UUID) -> list[Version]:
    return list(
        await session.scalars(
            select(Version)
            .where(Version.model_id == model_id, Version.status == VersionStatus.READY)
            .order_by(Version.number.desc())
            .limit(MAX_SUBJECT_VERSIONS)
        )
    )


async def _ready_artifacts(session: AsyncSession, version_ids: list[uuid.UUID]) -> list[Artifact]:
    if not version_ids:
        return []
    return list(
        await session.scalars(
            select(Artifact).where(
                Artifact.version_id.in_(version_ids), Artifact.status == ArtifactStatus.READY
            )
        )
    )


async def subjects(
    session: AsyncSession, model_id: uuid.UUID, model: str, kinds: set[str]
) -> list[Subject]:
    """Every ready version (newest first, at most MAX_SUBJECT_VERSIONS) and their ready
    artifacts, of the kinds asked for: what a digest may name. Two statements for the files."""
    versions = await _ready_versions(session, model_id)
    found: list[Subject] = []
    if "version" in kinds and versions:
        by_version: dict[uuid.UUID, list[File]] = {v.id: [] for v in versions}
        rows = await session.execute(
            select(VersionFile.version_id, *_VERSION_FILE_COLUMNS).where(
                VersionFile.version_id.in_(list(by_version))
            )
        )
        for row in rows:
            by_version[row[0]].append(File(*row[1:]))
        found += [_version_subject(model, v, by_version[v.id]) for v in versions]
    if "artifact" in kinds:
        artifacts = await _ready_artifacts(session, [v.id for v in versions])
        if artifacts:
            by_artifact: dict[uuid.UUID, list[File]] = {a.id: [] for a in artifacts}
            rows = await session.execute(
                select(ArtifactFile.artifact_id, *_ARTIFACT_FILE_COLUMNS).where(
                    ArtifactFile.artifact_id.in_(list(by_artifact))
                )
            )
            for row in rows:
                by_artifact[row[0]].append(File(*row[1:]))
            found += [_artifact_subject(model, a, by_artifact[a.id]) for a in artifacts]
    return found


def allowed_kinds(principal: Principal) -> set[str]:
    kinds = set()
    if principal.has_scope(SOURCE_SCOPE):
        kinds.add("version")
    if principal.has_scope(VARIANT_SCOPE):
        kinds.add("artifact")
    return kinds


async def manifest_by_digest(
    session: AsyncSession, model_id: uuid.UUID, model: str, digest: str, kinds: set[str]
) -> tuple[Subject, Document]:
    if DIGEST_RE.match(digest):
        for subject in await subjects(session, model_id, model, kinds):
            document = modelpack.manifest(subject)
            if document.digest == digest:
                return subject, document
    raise manifest_unknown(model, digest)


async def tags(session: AsyncSession, model_id: uuid.UUID) -> list[str]:
    """Every name a tag may be here, in lexical order (the spec's order for ``n``/``last``):
    each ready version's number, the aliases on ready versions, ``latest``, and for each ready
    artifact each of those names of its version with the variant's suffix."""
    versions = await _ready_versions(session, model_id)
    if not versions:
        return []
    refs: dict[uuid.UUID, list[str]] = {v.id: [str(v.number)] for v in versions}
    refs[versions[0].id].append("latest")
    aliases = await session.execute(
        select(Alias.name, Alias.version_id).where(Alias.model_id == model_id)
    )
    for alias, version_id in aliases:
        if version_id in refs:
            refs[version_id].append(alias)
    names = {ref for names in refs.values() for ref in names}
    for artifact in await _ready_artifacts(session, list(refs)):
        suffix = Variant(
            artifact.dtype, artifact.format, artifact.tensor_parallel_size, artifact.encrypted
        ).suffix
        names.update(f"{ref}.{suffix}" for ref in refs[artifact.version_id])
    return sorted(names)


def page(all_tags: list[str], n: str | None, last: str | None) -> tuple[list[str], bool]:
    """The tags after ``last``, at most ``n`` (bounded by MAX_TAGS_PAGE), and whether more
    follow. A malformed ``n`` is refused like the spec's registries do (400)."""
    if last is not None:
        all_tags = [t for t in all_tags if t > last]
    if n is None:
        return all_tags, False
    if not n.isdigit() or len(n) > 6:
        raise OciError(400, "PAGINATION_NUMBER_INVALID", "n must be a non-negative integer")
    limit = min(int(n), MAX_TAGS_PAGE)
    return all_tags[:limit], len(all_tags) > limit


async def find_blob(
    session: AsyncSession,
    model_id: uuid.UUID,
    model: str,
    digest: str,
    principal: Principal,
) -> tuple[Subject, File] | Document:
    """The stored file a digest names in this repository (with the subject it belongs to, a
    source's first), or the generated config blob of one of its manifests. BLOB_UNKNOWN when
    nothing here has it; DENIED when only a kind the token may not read has it."""
    match = DIGEST_RE.match(digest)
    if match is None:
        raise OciError(400, "DIGEST_INVALID", "provided digest is not sha256:<64 hex>")
    sha = match.group(1)
    kinds = allowed_kinds(principal)
    hidden = False
    version_row = (
        await session.execute(
            select(Version, *_VERSION_FILE_COLUMNS)
            .join(VersionFile, VersionFile.version_id == Version.id)
            .where(
                Version.model_id == model_id,
                Version.status == VersionStatus.READY,
                VersionFile.sha256 == sha,
            )
            .order_by(Version.number.desc())
            .limit(1)
        )
    ).first()
    if version_row is not None:
        if "version" in kinds:
            file = File(*version_row[1:])
            return _version_subject(model, version_row[0], [file]), file
        hidden = True
    artifact_row = (
        await session.execute(
            select(Artifact, *_ARTIFACT_FILE_COLUMNS)
            .join(ArtifactFile, ArtifactFile.artifact_id == Artifact.id)
            .join(Version, Version.id == Artifact.version_id)
            .where(
                Artifact.model_id == model_id,
                Artifact.status == ArtifactStatus.READY,
                Version.status == VersionStatus.READY,
                ArtifactFile.sha256 == sha,
            )
            .order_by(Artifact.created_at.desc())
            .limit(1)
        )
    ).first()
    if artifact_row is not None:
        if "artifact" in kinds:
            file = File(*artifact_row[1:])
            return _artifact_subject(model, artifact_row[0], [file]), file
        hidden = True
    for subject in await subjects(session, model_id, model, kinds):
        document = modelpack.config(subject)
        if document.digest == digest:
            return document
    if hidden:
        raise denied("this blob belongs only to what this token's scopes may not read")
    raise blob_unknown(model, digest)


async def read_manifest(
    session: AsyncSession, principal: Principal, repository: str, reference: str
) -> tuple[str, Subject, Document]:
    """The manifest a tag or digest names in this repository, for this caller's scopes."""
    model_id, model = await model_row(session, repository)
    if reference.startswith("sha256:"):
        subject, document = await manifest_by_digest(
            session, model_id, model, reference, allowed_kinds(principal)
        )
        return model, subject, document
    subject = await subject_by_tag(session, model_id, model, reference)
    require_kind(principal, subject.kind)
    return model, subject, modelpack.manifest(subject)


async def read_blob(
    session: AsyncSession, principal: Principal, repository: str, digest: str
) -> tuple[str, tuple[Subject, File] | Document]:
    model_id, model = await model_row(session, repository)
    return model, await find_blob(session, model_id, model, digest, principal)


async def read_tags(
    session: AsyncSession, repository: str, n: str | None, last: str | None
) -> tuple[str, list[str], bool]:
    model_id, model = await model_row(session, repository)
    found, more = page(await tags(session, model_id), n, last)
    return model, found, more
