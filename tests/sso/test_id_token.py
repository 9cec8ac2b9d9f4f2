"""The ID token check with keys made here: what passes, and each way a token is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from tensor_registry_server.core.oidc import SsoError, verify_id_token

ISSUER = "https://idp.example.test"
CLIENT = "tensor-registry"
NOW = 1_800_000_000.0


def keypair(kid: str) -> tuple[Any, dict[str, Any]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    return key, {**public, "kid": kid, "use": "sig", "alg": "RS256"}


SIGNING, SIGNING_JWK = keypair("k1")
OTHER, _ = keypair("k1")  # same kid, another key: a forged signature
EC_KEY = ec.generate_private_key(ec.SECP256R1())
EC_JWK = {**json.loads(ECAlgorithm.to_jwk(EC_KEY.public_key())), "kid": "e1", "alg": "ES256"}
KEYS = jwt.PyJWKSet.from_dict({"keys": [SIGNING_JWK, EC_JWK]})


def claims(**changes: Any) -> dict[str, Any]:
    base = {"iss": ISSUER, "aud": CLIENT, "sub": "alice", "iat": int(NOW) - 10,
            "exp": int(NOW) + 600, "nonce": "n-123", "groups": ["ml"]}  # fmt: skip
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def token(key: Any = SIGNING, alg: str = "RS256", kid: str = "k1", **changes: Any) -> str:
    return jwt.encode(claims(**changes), key, algorithm=alg, headers={"kid": kid})


def hs256_with_the_public_key() -> str:
    """The algorithm-confusion forgery: HMAC keyed with the provider's public key."""
    from cryptography.hazmat.primitives import serialization

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = part(json.dumps({"alg": "HS256", "kid": "k1", "typ": "JWT"}).encode())
    body = part(json.dumps(claims()).encode())
    pem = SIGNING.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    mac = hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{part(mac)}"


def check(raw: str, nonce: str | None = "n-123") -> dict[str, Any]:
    return verify_id_token(raw, KEYS, issuer=ISSUER, audience=CLIENT, nonce=nonce, now=NOW,
                           leeway=60)  # fmt: skip


def test_a_good_token_passes_with_rsa_and_ec_keys() -> None:
    assert check(token())["groups"] == ["ml"]
    assert check(token(EC_KEY, "ES256", "e1"))["sub"] == "alice"
    # several audiences: azp must be this client
    assert check(token(aud=[CLIENT, "other"], azp=CLIENT))["sub"] == "alice"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (lambda: token(iss="https://evil.example.test"), "wrong issuer"),
        (lambda: token(aud="someone-else"), "wrong audience"),
        (lambda: token(aud=[CLIENT, "other"]), "azp"),
        (lambda: token(OTHER), "bad signature"),
        (lambda: token(kid="unknown"), "key the provider does not publish"),
        (lambda: token(nonce="n-456"), "wrong nonce"),
        (lambda: token(nonce=None), "wrong nonce"),
        (lambda: token(exp=int(NOW) - 61), "expired"),
        (lambda: token(iat=int(NOW) + 3600, exp=int(NOW) + 7200), "future"),
        (lambda: token(exp=None), "MissingRequiredClaimError"),
        (lambda: jwt.encode(claims(), key="", algorithm="none"), "algorithm 'none'"),
        (lambda: hs256_with_the_public_key(), "algorithm 'HS256'"),
        (lambda: "not.a.jwt", "not a JWT"),
    ],
)
def test_each_bad_token_is_refused_and_says_why(raw: Any, why: str) -> None:
    with pytest.raises(SsoError) as caught:
        check(raw())
    assert caught.value.code == "sso_id_token_invalid"
    assert why in str(caught.value), str(caught.value)


def test_expiry_allows_the_configured_clock_skew_only() -> None:
    assert check(token(exp=int(NOW) - 59))["sub"] == "alice"
    with pytest.raises(SsoError, match="expired"):
        check(token(exp=int(NOW) - 61))


def test_a_refresh_grant_token_needs_no_nonce() -> None:
    assert check(token(nonce=None), nonce=None)["sub"] == "alice"
    assert time.time() > 0
