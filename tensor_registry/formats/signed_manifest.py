"""Signed artifact manifests (``manifest.sig.json``) and the compatibility key.

Format: a DSSE envelope (https://github.com/secure-systems-lab/dsse) whose payload is an
in-toto Statement v1. The statement's ``subject`` lists every file of the artifact by sha256
(what generic in-toto/DSSE verifiers check), its predicate (``PREDICATE_TYPE``) carries what
this registry adds: the artifact's variant, the layout manifest's sha256 (it holds the BLAKE3
chunk digests, so every byte a load reads is covered), the compatibility key and the
provenance (source version and its file digests, job, toolchain, GPU, times).
The signature is Ed25519 over DSSE's pre-authentication encoding; ``keyid`` is the sha256 of
the raw 32-byte public key.

Why not the OpenSSF model-signing format as is: its key-based signer and verifier (model_signing
1.x) take elliptic-curve (ECDSA P-256/384/521) keys, not Ed25519, and its predicate describes
files only. We keep its envelope (DSSE) and statement (in-toto v1, file subjects with sha256
digests) so any DSSE verifier holding the public key checks the signature and the file
digests; only the predicate is ours (docs/trust.md).

Torch-free and server-free: the light client, the worker and the API import this module;
``cryptography`` is imported when a signature is checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MANIFEST_FILE = "manifest.sig.json"
# The artifact's OpenSSF Model Signing signature (tensor_registry/formats/model_signature.py):
# signed after this manifest and over it, so this manifest never lists it.
SIGNATURE_FILE = "model.sig"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tensor-registry.dev/artifact-manifest/v1"
# A source version's signed file list (GET .../versions/{n}/manifest): same envelope and
# statement, its own predicate (model, version number, files, finalized_at, source).
VERSION_PREDICATE_TYPE = "https://tensor-registry.dev/version-manifest/v1"
# The keys document's signed copy (GET /.well-known/tensor-registry/keys, ``signed``).
KEYS_PREDICATE_TYPE = "https://tensor-registry.dev/keys/v1"
# What a ref resolved to, signed per resolve answer (``binding``): model, ref, version,
# artifact, the alias's move, issued_at and expires_at (docs/trust.md).
BINDING_PREDICATE_TYPE = "https://tensor-registry.dev/ref-binding/v1"
ALGORITHM = "ed25519"
# A manifest is input to the client: bounded before it is parsed.
MAX_MANIFEST_BYTES = 16 << 20
ENDORSEMENT_CONTEXT = b"tensor-registry key endorsement v1\x00"


class ManifestError(Exception):
    """A manifest that cannot be trusted; ``code`` is stable (docs/trust.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


# ---------------------------------------------------------------------------------------------
# DSSE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def key_id(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise ManifestError("bad_manifest", f"{what} is not a base64 string")
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError):
        try:
            return base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise ManifestError("bad_manifest", f"{what} is not valid base64") from None


def envelope(payload: bytes, signatures: list[tuple[str, bytes]]) -> bytes:
    return (
        json.dumps(
            {
                "payloadType": PAYLOAD_TYPE,
                "payload": b64(payload),
                "signatures": [{"keyid": kid, "sig": b64(sig)} for kid, sig in signatures],
            },
            indent=1,
        ).encode()
        + b"\n"
    )


def ed25519_verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def endorsement_message(public_key: bytes) -> bytes:
    """What an older key signs to vouch for a newer one (key rotation, docs/trust.md)."""
    return ENDORSEMENT_CONTEXT + public_key


# ---------------------------------------------------------------------------------------------
# The statement


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class SignedManifest:
    """A manifest whose signature checked out against a trusted key."""

    key_id: str
    statement: dict[str, Any]

    @property
    def predicate(self) -> dict[str, Any]:
        return dict(self.statement["predicate"])

    @property
    def artifact(self) -> dict[str, Any]:
        return dict(self.predicate.get("artifact") or {})

    @property
    def artifact_id(self) -> str:
        return str(self.artifact.get("id"))

    @property
    def compatibility_key(self) -> str | None:
        value = self.predicate.get("compatibility_key")
        return str(value) if value else None

    @property
    def files(self) -> dict[str, ManifestFile]:
        return {
            str(f["path"]): ManifestFile(str(f["path"]), int(f["size"]), str(f["sha256"]).lower())
            for f in self.predicate["files"]
        }

    def check_files(self, files: Iterable[tuple[str, int, str]], *, what: str) -> None:
        """``files`` (path, size, sha256) are exactly the signed files (the manifest and
        ``model.sig`` aside)."""
        signed = self.files
        given = {
            path: (size, sha.lower())
            for path, size, sha in files
            if path not in (MANIFEST_FILE, SIGNATURE_FILE)
        }
        for path, (size, sha) in sorted(given.items()):
            entry = signed.get(path)
            if entry is None:
                raise ManifestError(
                    "manifest_mismatch", f"{what} has {path}, which the signed manifest lacks"
                )
            if (entry.size, entry.sha256) != (size, sha):
                raise ManifestError(
                    "content_mismatch",
                    f"{path}: {what} has {size} bytes with sha256 {sha}; the signed manifest "
                    f"says {entry.size} bytes with sha256 {entry.sha256}",
                )
        missing = sorted(set(signed) - set(given))
        if missing:
            raise ManifestError(
                "manifest_mismatch", f"{what} lacks signed file(s): {', '.join(missing)}"
            )


def statement(
    *,
    files: Iterable[ManifestFile],
    predicate: Mapping[str, Any],
    predicate_type: str = PREDICATE_TYPE,
) -> bytes:
    listed = sorted(files, key=lambda f: f.path)
    body = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f.path, "digest": {"sha256": f.sha256}} for f in listed],
        "predicateType": predicate_type,
        "predicate": {
            **predicate,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in listed],
        },
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def verify(
    data: bytes, trusted: Mapping[str, bytes], *, predicate_type: str = PREDICATE_TYPE
) -> SignedManifest:
    """Check a ``manifest.sig.json`` against ``trusted`` (key id → raw Ed25519 public key);
    ``predicate_type`` ``VERSION_PREDICATE_TYPE`` checks a version manifest instead."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError("bad_manifest", f"a manifest of {len(data):,} bytes is implausible")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ManifestError("bad_manifest", f"the signed manifest is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("payloadType") != PAYLOAD_TYPE:
        raise ManifestError("bad_manifest", "not a DSSE envelope of an in-toto statement")
    payload = unb64(raw.get("payload"), "payload")
    signatures = raw.get("signatures")
    if not isinstance(signatures, list) or not signatures or len(signatures) > 16:
        raise ManifestError("signature_invalid", "the manifest carries no signature")
    message = pae(PAYLOAD_TYPE, payload)
    seen: list[str] = []
    good: str | None = None
    for entry in signatures:
        if not isinstance(entry, dict) or not isinstance(entry.get("keyid"), str):
            raise ManifestError("bad_manifest", "a signature entry has no keyid")
        kid = entry["keyid"].lower()
        seen.append(kid)
        public = trusted.get(kid)
        if public is None:
            continue
        if not ed25519_verify(public, unb64(entry.get("sig"), "signature"), message):
            raise ManifestError(
                "signature_invalid",
                f"the manifest's signature by trusted key {kid[:16]}… does not verify: "
                "its content was changed after signing",
            )
        good = kid
        break
    if good is None:
        raise ManifestError(
            "untrusted_signing_key",
            f"the manifest is signed by key(s) {', '.join(k[:16] + '…' for k in seen)}, none of "
            "which is trusted (pin the registry's keys with `tensor-registry trust`, or set "
            "TENSOR_REGISTRY_TRUSTED_KEYS)",
        )
    try:
        body = json.loads(payload)
    except ValueError:
        raise ManifestError("bad_manifest", "the signed payload is not JSON") from None
    if (
        not isinstance(body, dict)
        or body.get("_type") != STATEMENT_TYPE
        or body.get("predicateType") != predicate_type
        or not isinstance(body.get("predicate"), dict)
    ):
        raise ManifestError("bad_manifest", f"the signed payload is not a {predicate_type}")
    files = body["predicate"].get("files")
    if not isinstance(files, list) or not all(
        isinstance(f, dict)
        and isinstance(f.get("path"), str)
        and isinstance(f.get("size"), int)
        and isinstance(f.get("sha256"), str)
        and len(f["sha256"]) == 64
        for f in files
    ):
        raise ManifestError("bad_manifest", "the signed manifest's file list is malformed")
    subjects = {
        s.get("name"): (s.get("digest") or {}).get("sha256")
        for s in body.get("subject") or []
        if isinstance(s, dict)
    }
    if subjects != {f["path"]: f["sha256"] for f in files}:
        raise ManifestError("bad_manifest", "the statement's subjects and files disagree")
    return SignedManifest(key_id=good, statement=body)


# ---------------------------------------------------------------------------------------------
# The compatibility key

COMPATIBILITY_VERSION = "tensor-registry-compat-v1"


def compatibility_key(
    *,
    architecture: str | None,
    config_sha256: str | None,
    dtype: str,
    format: str,
    tensor_parallel_size: int,
    quantization: Any = None,
    vllm_version: str | None = None,
    gpu_arch: str | None = None,
) -> str:
    """A digest over what decides whether loaded weights may be reused for another request.

    The architecture and the config.json digest (the model's shape and hyper-parameters), the
    dtype, the format, the tensor-parallel size and the quantization config; for the ``vllm``
    format also the vLLM version and GPU architecture, because vLLM's serializer writes its own
    module layout and the weights it post-processes per device. Nothing else enters it (not
    the artifact id, times or toolchain of an ``hf`` artifact), so two artifacts that are
    interchangeable get the same key.
    """
    facts: dict[str, Any] = {
        "v": COMPATIBILITY_VERSION,
        "architecture": architecture,
        "config_sha256": config_sha256.lower() if config_sha256 else None,
        "dtype": dtype,
        "format": format,
        "tensor_parallel_size": int(tensor_parallel_size),
        "quantization": quantization,
    }
    if format == "vllm":
        facts["vllm_version"] = vllm_version
        facts["gpu_arch"] = gpu_arch
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def config_facts(config: bytes | None) -> tuple[str | None, Any]:
    """(architecture, quantization config) read from a config.json's bytes."""
    if not config:
        return None, None
    try:
        parsed = json.loads(config)
    except ValueError:
        return None, None
    if not isinstance(parsed, dict):
        return None, None
    architectures = parsed.get("architectures")
    architecture = (
        str(architectures[0]) if isinstance(architectures, list) and architectures else None
    )
    return architecture, parsed.get("quantization_config")
