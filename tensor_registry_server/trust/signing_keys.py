"""The registry's manifest-signing keys (Ed25519), with rotation, and its model-signing key
(ECDSA P-256) for ``model.sig``.

- The signing key: ``security.manifest_signing_key`` (base64 of the 32-byte Ed25519 seed, a
  ``SecretStr``), else, in the embedded default, ``data_dir/secrets/manifest-signing.key``
  generated once (mode 0600, directory 0700), beside the other secrets. Never in the database,
  a job payload or a log; only its public half leaves this module.
- Rotation: ``security.manifest_previous_keys`` lists earlier private keys (verification and
  endorsement only, never used to sign a manifest) and ``security.manifest_retired_public_keys``
  earlier public keys (verification only). Every key is published at
  ``GET /.well-known/tensor-registry/keys``; the active key comes endorsed by each previous
  private key (an Ed25519 signature over ``endorsement_message(active)``), so a client that
  pinned an older key accepts the new one without a manual step (docs/trust.md).
- The model-signing key: ``security.model_signing_key`` (a P-256 private key, PEM or base64),
  else ``data_dir/secrets/model-signing.key`` generated once like the seed. OpenSSF Model
  Signing's key-based verifier takes elliptic-curve keys only, not Ed25519, hence a second key.
  Its public half is served as PEM at ``GET /.well-known/tensor-registry/model-signing.pem``
  and listed in the keys document (``model_signing_keys``), endorsed by every manifest key.
  Rotation: the new key in ``model_signing_key``, the old one's public PEM in
  ``model_signing_previous_public_keys`` (still published, so older model.sig files verify).
- Identity: ``security.registry_id``, else ``data_dir/secrets/registry-id`` generated once
  beside the key. Nodes pin keys and remember alias moves under it, never under the URL or
  port the registry happens to answer on. The keys document carries it, with a signed copy
  of itself (``signed``: a DSSE envelope by the active key) so a node believes a key's
  ``retired`` status only when a key it trusts says so.
"""

from __future__ import annotations

import base64
import contextlib
import os
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_der_private_key,
    load_pem_private_key,
)

from tensor_registry.formats import model_signature
from tensor_registry.formats.signed_manifest import (
    ALGORITHM,
    KEYS_PREDICATE_TYPE,
    PAYLOAD_TYPE,
    endorsement_message,
    envelope,
    key_id,
    pae,
    statement,
    unb64,
)
from tensor_registry_server.settings import Settings

KEY_FILE = "manifest-signing.key"
MODEL_SIGNING_KEY_FILE = "model-signing.key"
REGISTRY_ID_FILE = "registry-id"


def _private(seed_b64: str, what: str) -> Ed25519PrivateKey:
    try:
        seed = unb64(seed_b64.strip(), what)
    except Exception:
        raise ValueError(f"{what} is not base64") from None
    if len(seed) != 32:
        raise ValueError(f"{what} must be the base64 of a 32-byte Ed25519 seed")
    return Ed25519PrivateKey.from_private_bytes(seed)


def _public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _new_seed() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _new_p256_pem() -> str:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


_MAKERS = {KEY_FILE: _new_seed, MODEL_SIGNING_KEY_FILE: _new_p256_pem}


@lru_cache
def _generated_secret(secrets_dir: Path, name: str) -> str:
    """The embedded default's key file ``name``, created once; concurrent first starts (the API
    and its worker) agree because the file is published with link(), which fails for the loser."""
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        os.chmod(secrets_dir, 0o700)
    path = secrets_dir / name
    if not path.exists():
        tmp = secrets_dir / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(_MAKERS[name]().strip() + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


@lru_cache
def _generated_registry_id(secrets_dir: Path) -> str:
    """The embedded default's identity, created once (published with link(), as the key)."""
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = secrets_dir / REGISTRY_ID_FILE
    if not path.exists():
        tmp = secrets_dir / f".{REGISTRY_ID_FILE}.{os.getpid()}.tmp"
        tmp.write_text(f"tr-{uuid.uuid4().hex}\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


@dataclass(frozen=True)
class PublicKey:
    key_id: str
    public_key: bytes
    status: str  # "active" | "previous" | "retired"
    endorsements: tuple[tuple[str, bytes], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "keyid": self.key_id,
            "algorithm": ALGORITHM,
            "public_key": base64.b64encode(self.public_key).decode(),
            "status": self.status,
            "endorsements": [
                {"keyid": kid, "sig": base64.b64encode(sig).decode()}
                for kid, sig in self.endorsements
            ],
        }


class ManifestKeys:
    """The active signing key and every key a manifest may still be verified with."""

    def __init__(
        self,
        active: Ed25519PrivateKey,
        previous: list[Ed25519PrivateKey],
        retired: list[bytes],
        registry_id: str = "",
    ) -> None:
        self._active = active
        self._signers = [active, *previous]
        self.registry_id = registry_id
        active_public = _public_bytes(active)
        self.active_id = key_id(active_public)
        endorsements = tuple(
            (key_id(_public_bytes(p)), p.sign(endorsement_message(active_public))) for p in previous
        )
        keys = [PublicKey(self.active_id, active_public, "active", endorsements)]
        for p in previous:
            keys.append(PublicKey(key_id(_public_bytes(p)), _public_bytes(p), "previous"))
        for raw in retired:
            keys.append(PublicKey(key_id(raw), raw, "retired"))
        seen: set[str] = set()
        self.public: list[PublicKey] = []
        for k in keys:
            if k.key_id not in seen:
                seen.add(k.key_id)
                self.public.append(k)

    def __repr__(self) -> str:  # never the private key
        return f"ManifestKeys(active={self.active_id[:16]}…, keys={len(self.public)})"

    def sign(self, payload: bytes) -> bytes:
        """The DSSE envelope (``manifest.sig.json`` bytes) of ``payload``."""
        return envelope(payload, [(self.active_id, self._active.sign(pae(PAYLOAD_TYPE, payload)))])

    def trusted(self) -> dict[str, bytes]:
        """The keys a signature is accepted from: the active and previous ones. A retired key is
        published (nodes learn to drop it) but vouches for nothing here either."""
        return {k.key_id: k.public_key for k in self.public if k.status != "retired"}

    def retired(self) -> dict[str, bytes]:
        """The keys this registry retired: refused whoever else lists them (docs/trust.md)."""
        return {k.key_id: k.public_key for k in self.public if k.status == "retired"}

    def endorse(self, message: bytes) -> list[tuple[str, bytes]]:
        """Signatures over ``message`` by the active and every previous key (what vouches for
        the model-signing keys to a client that pinned any of them)."""
        return [(key_id(_public_bytes(k)), k.sign(message)) for k in self._signers]

    def document(
        self, issued_at: str = "", blob_origins: list[str] | None = None
    ) -> dict[str, Any]:
        """The keys document, with ``signed``: the same facts (identity, keys, statuses, the
        origins its resolve answers' URLs may point at) as a DSSE envelope by the active key,
        what a node believes a status change (and a blob host) from."""
        keys = [k.to_json() for k in self.public]
        predicate = {
            "registry_id": self.registry_id,
            "active": self.active_id,
            "keys": [
                {"keyid": k["keyid"], "public_key": k["public_key"], "status": k["status"]}
                for k in keys
            ],
            "issued_at": issued_at,
            "blob_origins": list(blob_origins or []),
        }
        signed = self.sign(
            statement(files=[], predicate=predicate, predicate_type=KEYS_PREDICATE_TYPE)
        )
        return {
            "registry_id": self.registry_id,
            "active": self.active_id,
            "keys": keys,
            "blob_origins": list(blob_origins or []),
            "signed": signed.decode(),
        }


_loaded: dict[int, tuple[Settings, ManifestKeys]] = {}


def manifest_keys(settings: Settings) -> ManifestKeys:
    """The keys of ``settings`` (built once per settings object)."""
    found = _loaded.get(id(settings))
    if found is not None and found[0] is settings:
        return found[1]
    keys = _load(settings)
    _loaded[id(settings)] = (settings, keys)
    return keys


def _load(settings: Settings) -> ManifestKeys:
    security = settings.security
    configured = security.manifest_signing_key
    if configured is not None:
        seed = configured.get_secret_value()
    else:
        seed = _generated_secret((settings.data_dir / "secrets").resolve(), KEY_FILE)
    active = _private(seed, "security.manifest_signing_key")
    registry_id = security.registry_id or _generated_registry_id(
        (settings.data_dir / "secrets").resolve()
    )
    previous = [
        _private(s.get_secret_value(), "security.manifest_previous_keys entry")
        for s in security.manifest_previous_keys
    ]
    retired = []
    for text in security.manifest_retired_public_keys:
        raw = unb64(text.strip(), "security.manifest_retired_public_keys entry")
        if len(raw) != 32:
            raise ValueError("security.manifest_retired_public_keys entries are 32-byte keys")
        retired.append(raw)
    return ManifestKeys(active, previous, retired, registry_id)


def public_key_b64(seed_b64: str) -> str:
    """The base64 public key of a base64 seed (what an operator lists on rotation)."""
    return base64.b64encode(_public_bytes(_private(seed_b64, "seed"))).decode()


def foreign_keys(settings: Settings) -> dict[str, bytes]:
    """``security.trusted_manifest_keys``: key id → raw public key."""
    keys: dict[str, bytes] = {}
    for text in settings.security.trusted_manifest_keys:
        raw = unb64(text.strip(), "security.trusted_manifest_keys entry")
        if len(raw) != 32:
            raise ValueError("security.trusted_manifest_keys entries are 32-byte Ed25519 keys")
        keys[key_id(raw)] = raw
    return keys


# ---------------------------------------------------------------------------------------------
# The model-signing key (ECDSA P-256): model.sig, the OpenSSF Model Signing signature


def _p256_private(text: str, what: str) -> ec.EllipticCurvePrivateKey:
    """A P-256 private key from PEM (PKCS#8 or SEC1) or the base64 of that PEM or of its DER."""
    data = text.strip().encode()
    if not data.startswith(b"-----BEGIN"):
        try:
            data = base64.b64decode(data, validate=True)
        except ValueError:
            raise ValueError(f"{what} is neither PEM nor base64") from None
    try:
        key = (
            load_pem_private_key(data, None)
            if data.startswith(b"-----BEGIN")
            else load_der_private_key(data, None)
        )
    except (ValueError, TypeError):
        raise ValueError(f"{what} is not an unencrypted private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise ValueError(f"{what} must be an elliptic-curve P-256 private key")
    return key


@dataclass(frozen=True)
class ModelSigningKey:
    hint: str  # sha256 (hex) of the PEM: what model.sig names its key by
    pem: bytes
    status: str  # "active" | "previous"


class ModelSigningKeys:
    """The active P-256 key signing ``model.sig`` and the earlier public keys still published
    (rotation: ``security.model_signing_previous_public_keys``), each endorsed by the manifest
    keys so a client that pinned those trusts them."""

    def __init__(
        self, active: ec.EllipticCurvePrivateKey, previous: list[bytes], manifest: ManifestKeys
    ) -> None:
        self._active = active
        active_pem = model_signature.public_pem(active.public_key())
        self.active_hint = model_signature.key_hint(active_pem)
        self.public = [ModelSigningKey(self.active_hint, active_pem, "active")]
        for pem in previous:
            hint = model_signature.key_hint(pem)
            if all(k.hint != hint for k in self.public):
                self.public.append(ModelSigningKey(hint, pem, "previous"))
        self._manifest = manifest

    def __repr__(self) -> str:  # never the private key
        return f"ModelSigningKeys(active={self.active_hint[:16]}…, keys={len(self.public)})"

    @property
    def active_pem(self) -> bytes:
        return self.public[0].pem

    def pem(self, hint: str) -> bytes | None:
        return next((k.pem for k in self.public if k.hint == hint), None)

    def sign(self, files: list[tuple[str, str]], *, name: str) -> bytes:
        """``model.sig`` over ``files`` ((path, sha256), the signature itself excluded)."""
        return model_signature.sign(self._active, files, name=name)

    def document(self) -> list[dict[str, Any]]:
        return [
            {
                "keyid": k.hint,
                "algorithm": model_signature.ALGORITHM,
                "public_key_pem": k.pem.decode(),
                "status": k.status,
                "endorsements": [
                    {"keyid": kid, "sig": base64.b64encode(sig).decode()}
                    for kid, sig in self._manifest.endorse(
                        model_signature.endorsement_message(k.pem)
                    )
                ],
            }
            for k in self.public
        ]


_loaded_oms: dict[int, tuple[Settings, ModelSigningKeys]] = {}


def model_signing_keys(settings: Settings) -> ModelSigningKeys:
    """The model-signing keys of ``settings`` (built once per settings object)."""
    found = _loaded_oms.get(id(settings))
    if found is not None and found[0] is settings:
        return found[1]
    security = settings.security
    if security.model_signing_key is not None:
        text = security.model_signing_key.get_secret_value()
    else:
        text = _generated_secret((settings.data_dir / "secrets").resolve(), MODEL_SIGNING_KEY_FILE)
    active = _p256_private(text, "security.model_signing_key")
    previous = []
    for pem in security.model_signing_previous_public_keys:
        try:
            key = model_signature.load_public_pem(pem.strip().encode() + b"\n")
        except ValueError:
            raise ValueError(
                "security.model_signing_previous_public_keys entries are P-256 public keys (PEM)"
            ) from None
        previous.append(model_signature.public_pem(key))
    keys = ModelSigningKeys(active, previous, manifest_keys(settings))
    _loaded_oms[id(settings)] = (settings, keys)
    return keys
