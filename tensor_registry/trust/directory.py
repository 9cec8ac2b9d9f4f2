"""Offline: a pulled or downloaded directory against its signed manifest and ``model.sig``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from tensor_registry.formats import model_signature
from tensor_registry.formats.digests import sha256_file
from tensor_registry.formats.paths import require_relative_path
from tensor_registry.formats.signed_manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ManifestError,
    SignedManifest,
    verify,
)
from tensor_registry.trust.errors import TrustError


def verify_directory(
    directory: Path,
    keys: Mapping[str, bytes],
    *,
    artifact_id: str | None = None,
    allow_missing: Iterable[str] = (),
    hash_weights: bool = True,
    model_keys: Mapping[str, bytes] | None = None,
) -> SignedManifest:
    """Offline: ``directory``'s ``manifest.sig.json`` verifies with ``keys``, every signed
    file in it has the signed size and sha256 (files in ``allow_missing`` may be absent), and
    it holds no other file (git's and hf's directories and the node's own files aside, exactly:
    ``model_signature.directory_files``).
    Its ``model.sig``, when present and ``model_keys`` (hint → P-256 PEM) are given, verifies
    with one of them over exactly those files and the manifest.
    ``hash_weights=False`` checks weights by size only: for a caller that verifies their
    chunks against the signed layout while loading (one pass over the bytes, not two)."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise TrustError(f"{directory} has no {MANIFEST_FILE}", code="unsigned_artifact")
    data = path.read_bytes()
    try:
        signed = verify(data, keys)
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    if artifact_id is not None and signed.artifact_id != artifact_id:
        raise TrustError(
            f"the signed manifest is for artifact {signed.artifact_id}, not {artifact_id}",
            code="manifest_mismatch",
        )
    skipped = set(allow_missing)
    present: list[tuple[str, int, str]] = []
    for name, entry in signed.files.items():
        local = directory / require_relative_path(name, what="a file path in the signed manifest")
        if not local.is_file():
            if name in skipped:
                present.append((name, entry.size, entry.sha256))
                continue
            raise TrustError(f"{local} is missing", code="manifest_mismatch")
        size = local.stat().st_size
        if size != entry.size:
            digest = "0" * 64
        elif not hash_weights and name.endswith(".tensors"):
            digest = entry.sha256
        else:
            digest = sha256_file(local)
        present.append((name, size, digest))
    try:
        signed.check_files(present, what=str(directory))
        known = {*signed.files, MANIFEST_FILE}
        added = [p for p in model_signature.directory_files(directory) if p not in known]
        if added:
            raise ManifestError(
                "manifest_mismatch",
                f"{directory} has {', '.join(added)}, which no signature of the artifact covers",
            )
        oms = directory / SIGNATURE_FILE
        if model_keys and oms.is_file():
            digests = {name: sha for name, _, sha in present}
            digests[MANIFEST_FILE] = hashlib.sha256(data).hexdigest()
            with oms.open("rb") as fh:
                bundle = fh.read(model_signature.MAX_SIGNATURE_BYTES + 1)
            model_signature.verify(bundle, model_keys).check_files(digests, what=str(directory))
    except ManifestError as exc:
        raise TrustError.of(exc) from None
    return signed
