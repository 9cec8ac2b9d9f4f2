"""What the node asked for against what is signed: the answer's description of the artifact,
the request's model, version and variant, and the ref's signed binding (fresh, no rollback)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from tensor_registry.api.resolution import Resolution
from tensor_registry.formats.signed_manifest import (
    BINDING_PREDICATE_TYPE,
    MANIFEST_FILE,
    ManifestError,
    SignedManifest,
    verify,
)
from tensor_registry.trust.clock import CLOCK_SKEW_SECONDS, signed_time
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.seen_aliases import SeenAliases


def asked_for(resolution: Resolution) -> tuple[str | None, str, dict[str, Any]]:
    """What the node asked for (the request's own parameters, never the answer): the model,
    the ref and the variant filters given."""
    params = resolution.params
    filters: dict[str, Any] = {}
    for name in ("dtype", "format"):
        if params.get(name) is not None:
            filters[name] = str(params[name])
    if params.get("tensor_parallel_size") is not None:
        filters["tensor_parallel_size"] = int(params["tensor_parallel_size"])
    if params.get("encrypted") is not None:
        filters["encrypted"] = str(params["encrypted"]).lower() in ("true", "1")
    if params.get("artifact_id") is not None:
        filters["id"] = str(params["artifact_id"])
    model = params.get("model")
    return (str(model) if model is not None else None), str(params.get("ref", "latest")), filters


def check_answer(signed: SignedManifest, resolution: Resolution) -> None:
    """The answer's unsigned description of the artifact (model, version, dtype, format, TP
    size, encryption) is the signed one, so whatever a caller derives from the answer (the
    `vllm serve` command, the plugin's config) is derived from signed facts."""
    artifact, answer = signed.artifact, resolution.data.get("artifact") or {}
    pairs = {
        "model": (resolution.data.get("model"), artifact.get("model")),
        "version": (resolution.data.get("version"), artifact.get("version")),
        "dtype": (answer.get("dtype"), artifact.get("dtype")),
        "format": (answer.get("format"), artifact.get("format")),
        "tensor_parallel_size": (
            answer.get("tensor_parallel_size"),
            artifact.get("tensor_parallel_size"),
        ),
        "encrypted": (
            bool((answer.get("encryption") or {}).get("enabled")),
            bool((artifact.get("encryption") or {}).get("enabled")),
        ),
    }
    for name, (got, want) in pairs.items():
        if got != want:
            raise TrustError(
                f"the resolve answer says {name} {got!r}; the signed manifest says {want!r}",
                code="manifest_mismatch",
            )


def check_request(signed: SignedManifest, resolution: Resolution) -> None:
    """The signed manifest is what the node asked for: the model, the version a number ref
    names and every variant filter given. An intercepting proxy that answers with another
    namespace's validly signed artifact, or an older version's, is refused here."""
    model, ref, filters = asked_for(resolution)
    artifact = signed.artifact
    if model is not None and artifact.get("model") != model:
        raise TrustError(
            f"the signed manifest is for model {artifact.get('model')!r}, but {model!r} was "
            "asked for: the answer is another model's artifact",
            code="ref_mismatch",
        )
    if ref.isdigit() and artifact.get("version") != int(ref):
        raise TrustError(
            f"the signed manifest is for version {artifact.get('version')} of {model}, but "
            f"version {ref} was asked for",
            code="ref_mismatch",
        )
    signed_variant = {
        "id": signed.artifact_id,
        "dtype": artifact.get("dtype"),
        "format": artifact.get("format"),
        "tensor_parallel_size": artifact.get("tensor_parallel_size"),
        "encrypted": bool((artifact.get("encryption") or {}).get("enabled")),
    }
    for name, value in filters.items():
        if signed_variant[name] != value:
            raise TrustError(
                f"the signed manifest's {name} is {signed_variant[name]!r}, but {value!r} was "
                "asked for",
                code="ref_mismatch",
            )


def check_binding(
    resolution: Resolution,
    signed: SignedManifest,
    manifest: bytes,
    keys: Mapping[str, bytes],
    *,
    now: float,
    seen: SeenAliases | None = None,
) -> dict[str, Any] | None:
    """The answer's signed ``binding``: what the ref resolved to, signed for a short while.
    Required for an alias or ``latest`` (a number is bound by the manifest itself); checked
    whenever present: it names the model, ref, version and artifact asked for and signed, its
    subject is this manifest, it has not expired (CLOCK_SKEW_SECONDS allowed either way), and
    an alias's move is not older than one this node saw (SeenAliases). Returns its predicate."""
    model, ref, _ = asked_for(resolution)
    text = resolution.data.get("binding")
    if text is None:
        if ref.isdigit():
            return None
        raise TrustError(
            f"the answer for {model}:{ref} carries no signed binding of the ref to its "
            "artifact (a proxy stripped it, or the registry predates bindings)",
            code="unsigned_binding",
        )
    if not isinstance(text, str):
        raise TrustError("the answer's binding is not a string", code="bad_binding")
    try:
        bound = verify(text.encode(), keys, predicate_type=BINDING_PREDICATE_TYPE)
    except ManifestError as exc:
        if ref.isdigit() and exc.code == "untrusted_signing_key":
            # A number is bound by the manifest; the registry's active key, which signs
            # bindings, need not be among keys configured for older artifacts.
            return None
        raise TrustError(f"the answer's signed binding: {exc.message}", code=exc.code) from None
    predicate = bound.predicate
    subject = {f.path: f.sha256 for f in bound.files.values()}
    expected = {
        "model": (predicate.get("model"), model),
        "ref": (predicate.get("ref"), ref),
        "version": (predicate.get("version"), signed.artifact.get("version")),
        "artifact": ((predicate.get("artifact") or {}).get("id"), signed.artifact_id),
        "manifest": (subject.get(MANIFEST_FILE), hashlib.sha256(manifest).hexdigest()),
    }
    if signed.predicate.get("registry_id") is not None:
        expected["registry"] = (predicate.get("registry_id"), signed.predicate["registry_id"])
    for what, (got, want) in expected.items():
        if got != want:
            raise TrustError(
                f"the signed binding's {what} is {got!r}, not {want!r}: the answer binds "
                "another request or artifact",
                code="ref_mismatch",
            )
    expires = signed_time(predicate.get("expires_at"), "the binding's expires_at")
    issued = signed_time(predicate.get("issued_at"), "the binding's issued_at")
    if now > expires + CLOCK_SKEW_SECONDS:
        raise TrustError(
            f"the signed binding of {model}:{ref} expired at {predicate.get('expires_at')} "
            f"(more than {CLOCK_SKEW_SECONDS} s ago by this node's clock): a replayed answer",
            code="binding_expired",
        )
    if issued > now + CLOCK_SKEW_SECONDS:
        raise TrustError(
            f"the signed binding of {model}:{ref} was issued at {predicate.get('issued_at')}, "
            f"more than {CLOCK_SKEW_SECONDS} s in this node's future: fix the clock",
            code="binding_not_yet_valid",
        )
    alias = predicate.get("alias")
    if not ref.isdigit() and ref != "latest":
        if not isinstance(alias, dict) or alias.get("name") != ref:
            raise TrustError(
                f"the signed binding of {model}:{ref} does not name the alias's move",
                code="bad_binding",
            )
        (seen or SeenAliases()).check_and_record(
            str(predicate.get("registry_id") or predicate.get("registry")),
            str(predicate.get("model")),
            alias,
            version=int(predicate["version"]),
            artifact=signed.artifact_id,
        )
    return predicate
