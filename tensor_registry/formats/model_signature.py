"""``model.sig``: an OpenSSF Model Signing (OMS) v1 signature over an artifact's files.

The format the reference verifier reads (``model_signing verify key --signature DIR/model.sig
--public_key KEY.pem DIR``, model-signing 1.x, its default options): a Sigstore bundle
(``application/vnd.dev.sigstore.bundle.v0.3+json``) holding a DSSE envelope over an in-toto
Statement v1 with predicate ``https://model_signing/signature/v1.0``:

- ``predicate.resources``: every signed file as ``{name, algorithm: "sha256", digest}``, sorted
  as the reference sorts paths; ``predicate.serialization``: ``{method: "files", hash_type:
  "sha256", allow_symlinks: false, ignore_paths}`` — the "files" serialization the verifier
  recomputes, one sha256 per file, so the registry builds the statement from the digests it
  already recorded and never reads a byte again;
- ``subject``: one entry, the artifact's name and the sha256 over the resources' raw digests
  in that order (the reference checks it);
- the signature: ECDSA P-256 with SHA-256 (DER) over DSSE's pre-authentication encoding, the
  bundle's ``verificationMaterial.publicKey.hint`` the sha256 (hex) of the public key's PEM.
  The reference's key-based verifier takes elliptic-curve keys only, hence a key of its own
  beside the registry's Ed25519 manifest key (docs/trust.md).

``ignore_paths`` names what may sit beside the files without being signed: this signature,
what git leaves (the reference ignores those by default), hf's ``.cache/huggingface`` and the
node's own state directory ``NODE_STATE_DIR`` (``.cache/tensor-registry``: the pull record, the
key file of an encrypted artifact, an export's keys document). The reference verifier honours a
signed ``ignore_paths`` with prefix semantics (``path.is_relative_to(ignore_path)``): a name in
it is ignored as a file AND as a directory of anything. So it names directories only, never a
loose file beside the artifact's (a ``tensorizer.key/`` directory of planted files would pass).
A pulled directory verifies as is, and any other added file is refused. This package's own
directory verifier (``directory_files``) is exact inside the state directory.

One home: the worker and the backfill write it (tensor_registry_server/trust/statements.py), the
client checks it
(tensor_registry/trust/) with ``cryptography`` only — no model_signing, protobuf or sigstore
on a serving node.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_registry.formats.signed_manifest import SIGNATURE_FILE, ManifestError, pae, unb64

__all__ = ["SIGNATURE_FILE", "SignedModel", "sign", "verify"]
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
ALGORITHM = "ecdsa-p256-sha256"
PEM_MEDIA_TYPE = "application/x-pem-file"
# What the client writes into a pulled or exported folder, all in one directory of node state
# (beside hf's .cache/huggingface, the same convention): the pull record, the key file of an
# encrypted artifact (pull, mode 0600), the exporting registry's keys document (export).
NODE_STATE_DIR = ".cache/tensor-registry"
PULL_RECORD = f"{NODE_STATE_DIR}/pull.json"
KEYFILE_PATH = f"{NODE_STATE_DIR}/tensorizer.key"
KEYS_FILE = f"{NODE_STATE_DIR}/keys.json"
# Where a client before NODE_STATE_DIR wrote them (top level): still read (as regular files
# only) from a folder it pulled or exported.
LEGACY_NODE_FILES = {
    PULL_RECORD: ".tensor-registry.json",
    KEYFILE_PATH: "tensorizer.key",
    KEYS_FILE: "keys.json",
}
# What the reference verifier ignores by default (model_signing.hashing.Config).
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
# What `hf download --local-dir` keeps beside the files it downloads (its resume metadata and a
# .gitignore): a folder. Signed as ignored, so a folder fetched through the HF door verifies.
HF_LOCAL_DIR_CACHE = ".cache/huggingface"
# The signed ignore_paths, in this order: no loose file name beside model.sig (the reference
# verifier would ignore a directory by that name, and anything under it).
IGNORED_PATHS = (*GIT_PATHS, SIGNATURE_FILE, HF_LOCAL_DIR_CACHE, NODE_STATE_DIR)
# What this package's own verifier ignores as exactly these regular files (a directory by one of
# these names, or any other file under NODE_STATE_DIR, is an unsigned file).
NODE_FILES = frozenset(
    {SIGNATURE_FILE, PULL_RECORD, KEYFILE_PATH, KEYS_FILE, *LEGACY_NODE_FILES.values()}
)
# What it ignores as a directory, with everything under it (git's, hf's: not ours).
IGNORED_DIRECTORIES = (*GIT_PATHS, HF_LOCAL_DIR_CACHE)
# A signature is input to the client: bounded before it is parsed.
MAX_SIGNATURE_BYTES = 16 << 20
MAX_RESOURCES = 100_000
ENDORSEMENT_CONTEXT = b"tensor-registry model-signing key v1\x00"


def key_hint(public_pem: bytes) -> str:
    """What the bundle names its key by (as model_signing): sha256 of the public key's PEM."""
    return hashlib.sha256(public_pem).hexdigest()


def public_pem(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return bytes(public_key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))


def load_public_pem(pem: bytes) -> Any:
    """A P-256 public key from PEM; ValueError for anything else."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(pem)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("a model-signing key is an elliptic-curve P-256 public key")
    return key


def endorsement_message(public_pem: bytes) -> bytes:
    """What the registry's Ed25519 manifest keys sign to vouch for a model-signing key, so a
    client that pinned those trusts this one too (docs/trust.md)."""
    return ENDORSEMENT_CONTEXT + public_pem


def _path_key(path: str) -> tuple[str, ...]:
    # The reference sorts pathlib.PurePosixPath objects: by components, not by string.
    return tuple(path.split("/"))


def ignored_by_reference(path: str, ignore_paths: Iterable[str]) -> bool:
    """Whether the reference verifier ignores ``path`` (relative, POSIX) given ``ignore_paths``:
    ``PurePosixPath(path).is_relative_to(p)`` for any, i.e. ``p`` itself or anything under it."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in ignore_paths)


def node_file(directory: Path, path: str) -> Path | None:
    """The node's own file ``path`` (``PULL_RECORD``, ``KEYFILE_PATH``, ``KEYS_FILE``) in a
    pulled or exported ``directory``: at its place under ``NODE_STATE_DIR``, else where a client
    before it wrote it (top level); a regular file only (a directory or a link by that name is
    never taken), None when there is none."""
    for candidate in (path, LEGACY_NODE_FILES.get(path)):
        if candidate is None:
            continue
        where = directory / candidate
        try:
            if stat.S_ISREG(os.lstat(where).st_mode):
                return where
        except OSError:
            continue
    return None


def drop_legacy_node_file(directory: Path, path: str) -> None:
    """Remove the top-level file where a client before ``NODE_STATE_DIR`` kept the node file
    ``path``, once it is written at ``path``: a regular file only (a link is not followed, a
    directory is left), so the folder verifies with the reference verifier, whose signed
    ignore_paths no longer name it."""
    legacy = directory / LEGACY_NODE_FILES[path]
    try:
        if stat.S_ISREG(os.lstat(legacy).st_mode):
            legacy.unlink()
    except FileNotFoundError:
        pass


def _root_digest(resources: Iterable[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for _, sha in resources:
        digest.update(bytes.fromhex(sha))
    return digest.hexdigest()


def statement(files: Iterable[tuple[str, str]], *, name: str) -> bytes:
    """The in-toto statement over ``files`` ((path, sha256) pairs; the signature itself and
    any ignored name must not be among them)."""
    listed = sorted(((p, s.lower()) for p, s in files), key=lambda f: _path_key(f[0]))
    for path, _ in listed:
        if ignored_by_reference(path, IGNORED_PATHS):
            raise ValueError(f"{path} would be ignored by a verifier: it cannot be signed")
    body = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": _root_digest(listed)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {
                "method": "files",
                "hash_type": "sha256",
                "allow_symlinks": False,
                "ignore_paths": list(IGNORED_PATHS),
            },
            "resources": [
                {"name": path, "algorithm": "sha256", "digest": sha} for path, sha in listed
            ],
        },
    }
    return json.dumps(body, indent=2).encode()


def bundle(payload: bytes, signature: bytes, hint: str) -> bytes:
    """The Sigstore bundle (``model.sig`` bytes) of a signed statement."""
    return (
        json.dumps(
            {
                "mediaType": BUNDLE_MEDIA_TYPE,
                "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
                "dsseEnvelope": {
                    "payload": base64.b64encode(payload).decode(),
                    "payloadType": PAYLOAD_TYPE,
                    "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}],
                },
            },
            indent=1,
        ).encode()
        + b"\n"
    )


def sign(private_key: Any, files: Iterable[tuple[str, str]], *, name: str) -> bytes:
    """``model.sig`` over ``files`` ((path, sha256)), signed with a P-256 private key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    payload = statement(files, name=name)
    signature = private_key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
    return bundle(payload, signature, key_hint(public_pem(private_key.public_key())))


# ---------------------------------------------------------------------------------------------
# Verification (the client)


@dataclass(frozen=True)
class SignedModel:
    """A ``model.sig`` whose signature checked out against a trusted key."""

    key_hint: str
    name: str
    files: dict[str, str]  # path → sha256
    ignore_paths: tuple[str, ...]

    def check_files(self, files: Mapping[str, str], *, what: str) -> None:
        """``files`` (path → sha256) are exactly the signed ones."""
        given = {p: s.lower() for p, s in files.items() if p != SIGNATURE_FILE}
        for path in sorted(given):
            signed = self.files.get(path)
            if signed is None:
                raise ManifestError(
                    "manifest_mismatch", f"{what} has {path}, which {SIGNATURE_FILE} does not sign"
                )
            if signed != given[path]:
                raise ManifestError(
                    "content_mismatch",
                    f"{path}: {what} has sha256 {given[path]}; {SIGNATURE_FILE} signs {signed}",
                )
        missing = sorted(set(self.files) - set(given))
        if missing:
            raise ManifestError(
                "manifest_mismatch", f"{what} lacks file(s) {SIGNATURE_FILE} signs: {missing}"
            )


def bundle_hint(data: bytes) -> str | None:
    """The key hint a bundle names (unsigned: it only picks the key to try)."""
    try:
        hint = json.loads(data)["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, TypeError, KeyError):
        return None
    return str(hint).lower() if hint else None


def _ecdsa_verify(public_key: Any, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def verify(data: bytes, trusted: Mapping[str, bytes]) -> SignedModel:
    """Check a ``model.sig`` against ``trusted`` (key hint → P-256 public key PEM): the
    bundle's form, the ECDSA signature over the DSSE PAE, the statement's form and its root
    digest. Returns the signed (path → sha256) list; raises ManifestError."""
    if len(data) > MAX_SIGNATURE_BYTES:
        raise ManifestError("bad_signature", f"a {SIGNATURE_FILE} of {len(data):,} bytes")
    try:
        raw = json.loads(data)
    except ValueError:
        raise ManifestError("bad_signature", f"{SIGNATURE_FILE} is not JSON") from None
    envelope = raw.get("dsseEnvelope") if isinstance(raw, dict) else None
    if (
        not isinstance(envelope, dict)
        or raw.get("mediaType") != BUNDLE_MEDIA_TYPE
        or envelope.get("payloadType") != PAYLOAD_TYPE
    ):
        raise ManifestError(
            "bad_signature", f"{SIGNATURE_FILE} is not a Sigstore bundle of an in-toto statement"
        )
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or len(signatures) != 1:
        raise ManifestError("signature_invalid", f"{SIGNATURE_FILE} must carry one signature")
    payload = unb64(envelope.get("payload"), "payload")
    first = signatures[0] if isinstance(signatures[0], dict) else {}
    signature = unb64(first.get("sig"), "signature")
    hint = bundle_hint(data)
    # The hint is unsigned: it only picks which trusted key to try.
    candidates = {h: pem for h, pem in trusted.items() if hint is None or h == hint}
    if not candidates:
        raise ManifestError(
            "untrusted_signing_key",
            f"{SIGNATURE_FILE} is signed by model-signing key {str(hint)[:16]}…, which is not "
            "trusted (pin the registry's keys with `tensor-registry trust`)",
        )
    message = pae(PAYLOAD_TYPE, payload)
    good = next(
        (
            h
            for h, pem in candidates.items()
            if _ecdsa_verify(load_public_pem(pem), signature, message)
        ),
        None,
    )
    if good is None:
        raise ManifestError(
            "signature_invalid",
            f"the signature of {SIGNATURE_FILE} does not verify: it was changed after signing",
        )
    return _parse_statement(payload, good)


def _parse_statement(payload: bytes, hint: str) -> SignedModel:
    def bad(why: str) -> ManifestError:
        return ManifestError("bad_signature", f"{SIGNATURE_FILE}: {why}")

    try:
        body = json.loads(payload)
    except ValueError:
        raise bad("the signed payload is not JSON") from None
    if not isinstance(body, dict) or body.get("_type") != STATEMENT_TYPE:
        raise bad("the payload is not an in-toto Statement v1")
    if body.get("predicateType") != PREDICATE_TYPE:
        raise bad(f"the predicate is not {PREDICATE_TYPE}")
    predicate = body.get("predicate")
    subjects = body.get("subject")
    if not isinstance(predicate, dict) or not isinstance(subjects, list) or len(subjects) != 1:
        raise bad("one subject and a predicate are expected")
    serialization = predicate.get("serialization") or {}
    if (serialization.get("method"), serialization.get("hash_type")) != ("files", "sha256"):
        raise bad("only the sha256 'files' serialization is read")
    resources = predicate.get("resources")
    if not isinstance(resources, list) or len(resources) > MAX_RESOURCES:
        raise bad("the resource list is malformed")
    files: dict[str, str] = {}
    ordered: list[tuple[str, str]] = []
    for entry in resources:
        if (
            not isinstance(entry, dict)
            or entry.get("algorithm") != "sha256"
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("digest"), str)
            or len(entry["digest"]) != 64
        ):
            raise bad("a resource is malformed")
        try:
            bytes.fromhex(entry["digest"])
        except ValueError:
            raise bad("a resource digest is not hex") from None
        name = entry["name"]
        if name in files or name.startswith("/") or ".." in name.split("/"):
            raise bad(f"resource {name!r} is repeated or leaves the directory")
        files[name] = entry["digest"].lower()
        ordered.append((name, files[name]))
    subject = subjects[0] if isinstance(subjects[0], dict) else {}
    if (subject.get("digest") or {}).get("sha256") != _root_digest(ordered):
        raise bad("the subject's digest is not the resources' digest")
    ignore = serialization.get("ignore_paths") or []
    return SignedModel(
        key_hint=hint,
        name=str(subject.get("name")),
        files=files,
        ignore_paths=tuple(str(p) for p in ignore if isinstance(p, str)),
    )


def directory_files(directory: Path) -> list[str]:
    """The regular files under ``directory`` (relative POSIX paths) that no signature covers
    unless it signs them: git's and hf's directories skipped (as the reference verifier does),
    the node's own files (``NODE_FILES``) skipped as exactly those regular files — a directory
    by one of their names is walked, and any other file under ``NODE_STATE_DIR`` is listed,
    where the reference verifier's prefix rule would ignore it. A symbolic link is refused
    (ManifestError)."""
    found: list[str] = []
    for root, dirs, names in os.walk(directory, followlinks=False):
        rel_root = Path(root).relative_to(directory)
        for entry in [*dirs, *names]:
            rel = (rel_root / entry).as_posix()
            if ignored_by_reference(rel, IGNORED_DIRECTORIES):
                if entry in dirs:
                    dirs.remove(entry)
                continue
            mode = os.lstat(Path(root) / entry).st_mode
            if stat.S_ISLNK(mode):
                raise ManifestError(
                    "manifest_mismatch", f"{directory / rel} is a symbolic link: not verified"
                )
            if stat.S_ISREG(mode) and rel not in NODE_FILES:
                found.append(rel)
    return sorted(found)
