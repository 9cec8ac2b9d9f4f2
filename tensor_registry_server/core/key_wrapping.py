"""Envelope encryption of artifact keys under the master key.

Each encrypted artifact has its own random 32-byte tensorizer key. The database stores it only
wrapped: AES-256-GCM under a key derived from the master key, with the artifact id as associated
data (a wrapped key copied onto another artifact row does not unwrap). The master key comes from
settings and never reaches the database or a log.
"""

from __future__ import annotations

import hashlib
import os
import uuid

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
_VERSION = b"\x01"


def _kek(master_key: bytes) -> bytes:
    return hashlib.sha256(b"tensor-registry key-wrapping v1\x00" + master_key).digest()


def new_key_id() -> str:
    return uuid.uuid4().hex


def wrap_key(master_key: bytes, key: bytes, *, artifact_id: uuid.UUID) -> bytes:
    if len(key) != KEY_BYTES:
        raise ValueError("tensorizer keys are exactly 32 bytes")
    nonce = os.urandom(12)
    return _VERSION + nonce + AESGCM(_kek(master_key)).encrypt(nonce, key, artifact_id.bytes)


def unwrap_key(master_key: bytes, wrapped: bytes, *, artifact_id: uuid.UUID) -> bytes:
    if not wrapped or wrapped[:1] != _VERSION:
        raise ValueError("unknown wrapped-key format")
    nonce, ciphertext = wrapped[1:13], wrapped[13:]
    return AESGCM(_kek(master_key)).decrypt(nonce, ciphertext, artifact_id.bytes)
