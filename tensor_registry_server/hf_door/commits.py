"""The 40-hex "commit" the Hugging Face door gives each source version and each artifact.

The Hub names every snapshot of a repo by a git commit id, and its clients key their cache on it
(``snapshots/<commit>/``, ``refs/<revision>``), so one id must stand for one immutable set of
files: a ready version's files never change, nor do a ready artifact's. The id is the row's UUID
(32 hex) followed by 8 hex of sha1 over what kind of row it is and that UUID: deterministic,
stable across restarts and replicas, different for a version and an artifact, and read back by
one primary-key lookup (a commit the door gets as a revision needs no scan of the model's rows).
It is not a secret (artifact and version ids are shown by /api/v1 to the same readers).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SOURCE = "source"
VARIANT = "variant"
_KINDS = (SOURCE, VARIANT)


def _tag(kind: str, row_id: uuid.UUID) -> str:
    return hashlib.sha1(  # noqa: S324 - an identifier like git's, not a security digest
        f"tensor-registry:hf-door:{kind}:".encode() + row_id.bytes
    ).hexdigest()[:8]


def commit_id(kind: str, row_id: uuid.UUID | str) -> str:
    """The commit of a source version (``kind`` SOURCE, the version's id) or of an artifact
    (VARIANT, the artifact's id)."""
    row = row_id if isinstance(row_id, uuid.UUID) else uuid.UUID(str(row_id))
    return row.hex + _tag(kind, row)


@dataclass(frozen=True)
class CommitRef:
    kind: str
    row_id: uuid.UUID


def parse_commit(value: str) -> CommitRef | None:
    """The row a commit names, or None when ``value`` is not one of this door's commits."""
    if not COMMIT_RE.match(value):
        return None
    row = uuid.UUID(hex=value[:32])
    for kind in _KINDS:
        if value[32:] == _tag(kind, row):
            return CommitRef(kind, row)
    return None


def git_blob_oid(sha256: str, size: int) -> tuple[str, int]:
    """The git object id of the LFS pointer file the Hub would keep for a file with this sha256
    and size, and the pointer's size: every file is presented as an LFS file, whose identity is
    its sha256 (what the registry records), so no byte is read to answer a listing."""
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
    data = pointer.encode()
    oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's id
    return oid, len(data)
