"""OpenID Connect, the relying party's side: discovery, JWKS, code and refresh grants, and the
ID token check (docs/sso.md).

Everything is fetched from the configured issuer only, through the guarded fetcher
(core/fetch.py): an identity provider on an internal address must be allow-listed in
``fetch.allow`` like any other internal source. The discovery document must name exactly the
configured issuer. An ID token passes only when its signature verifies with a key of the
provider's JWKS (asymmetric algorithms only: never ``none`` or an HMAC keyed with something
public), and its ``iss``, ``aud`` (and ``azp`` when several audiences), ``exp``, ``iat`` and
``nonce`` are right; PyJWT checks the signature and claims.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import jwt

from tensor_registry_server.core.errors import Unauthorized
from tensor_registry_server.core.fetch import (
    FetchError,
    FetchPolicy,
    SourceRefused,
    fetch_async,
    post_form,
)

if TYPE_CHECKING:
    from tensor_registry_server.settings import SsoSettings

# Asymmetric only: "none" and HS* (keyed with the client secret, or worse a public value) never.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
_MAX_DOCUMENT_BYTES = 1024 * 1024


class SsoError(Unauthorized):
    """A sign-in or re-check the provider's answer does not support (401, code sso_*)."""

    title = "Sign-in failed"


def pkce_pair() -> tuple[str, str]:
    """A PKCE verifier and its S256 challenge (RFC 7636)."""
    verifier = secrets.token_urlsafe(48)
    return verifier, s256(verifier)


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


def verify_id_token(
    token: str,
    keys: jwt.PyJWKSet,
    *,
    issuer: str,
    audience: str,
    nonce: str | None,
    now: float,
    leeway: float = 60.0,
) -> dict[str, Any]:
    """The claims of ``token`` once every check passed; SsoError (code sso_id_token_invalid)
    naming the first that failed. ``nonce`` None: none expected (a refresh grant's token)."""

    def refuse(why: str) -> SsoError:
        return SsoError(f"The identity provider's ID token was refused: {why}.",
                        code="sso_id_token_invalid")  # fmt: skip

    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise refuse("not a JWT") from None
    algorithm = header.get("alg")
    if algorithm not in ALGORITHMS:
        raise refuse(f"algorithm {algorithm!r} is not accepted")
    kid = header.get("kid")
    candidates = [k for k in keys.keys if kid is None or k.key_id == kid]
    if not candidates:
        raise refuse("signed with a key the provider does not publish")
    claims: dict[str, Any] | None = None
    for key in candidates:
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=audience,
                issuer=issuer,
                # exp/iat against the injected clock below.
                options={"require": ["iss", "aud", "sub", "exp", "iat"], "verify_exp": False,
                         "verify_iat": False, "verify_nbf": False},
            )  # fmt: skip
            break
        except jwt.InvalidSignatureError:
            continue
        except jwt.InvalidIssuerError:
            raise refuse("wrong issuer") from None
        except jwt.InvalidAudienceError:
            raise refuse("wrong audience") from None
        except jwt.PyJWTError as exc:
            raise refuse(type(exc).__name__) from None
    if claims is None:
        raise refuse("bad signature")
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != audience:
        raise refuse("several audiences and azp is not this client")
    if not isinstance(claims["exp"], int | float) or claims["exp"] + leeway <= now:
        raise refuse("expired")
    if not isinstance(claims["iat"], int | float) or claims["iat"] - leeway > now:
        raise refuse("issued in the future")
    if nonce is not None:
        got = claims.get("nonce")
        if not isinstance(got, str) or not hmac.compare_digest(got, nonce):
            raise refuse("wrong nonce")
    if not isinstance(claims["sub"], str) or not claims["sub"]:
        raise refuse("no subject")
    return claims


class OidcClient:
    """The provider's documents (cached ``metadata_cache_seconds``) and its token endpoint."""

    def __init__(
        self, sso: SsoSettings, policy: FetchPolicy, *, clock: Callable[[], float] = time.time
    ) -> None:
        if not sso.enabled or sso.issuer is None:
            raise ValueError("sso.issuer and sso.client_id must be set")
        self.sso = sso
        self.issuer = sso.issuer
        self.policy = policy
        self.clock = clock
        self._metadata: tuple[float, ProviderMetadata] | None = None
        self._keys: tuple[float, jwt.PyJWKSet] | None = None
        self._lock = asyncio.Lock()

    async def _get_json(self, url: str) -> dict[str, Any]:
        body = bytearray()
        try:
            async for chunk in fetch_async(
                url, self.policy, max_bytes=_MAX_DOCUMENT_BYTES, expect="json"
            ):
                body += chunk
            document = json.loads(body)
        except (FetchError, ValueError):
            raise SsoError(
                "The identity provider could not be reached or answered something unusable.",
                code="sso_provider_unavailable",
            ) from None
        if not isinstance(document, dict):
            raise SsoError("The identity provider answered something unusable.",
                           code="sso_provider_unavailable")  # fmt: skip
        return document

    async def metadata(self) -> ProviderMetadata:
        now = self.clock()
        if self._metadata and self._metadata[0] > now:
            return self._metadata[1]
        base = self.issuer.rstrip("/")
        doc = await self._get_json(f"{base}/.well-known/openid-configuration")
        if doc.get("issuer") != self.issuer:
            raise SsoError("The identity provider's discovery document names another issuer.",
                           code="sso_provider_unavailable")  # fmt: skip
        try:
            meta = ProviderMetadata(
                issuer=self.issuer,
                authorization_endpoint=str(doc["authorization_endpoint"]),
                token_endpoint=str(doc["token_endpoint"]),
                jwks_uri=str(doc["jwks_uri"]),
            )
        except KeyError:
            raise SsoError("The identity provider's discovery document is incomplete.",
                           code="sso_provider_unavailable") from None  # fmt: skip
        self._metadata = (now + self.sso.metadata_cache_seconds, meta)
        return meta

    async def keys(self, *, refresh: bool = False) -> jwt.PyJWKSet:
        now = self.clock()
        if not refresh and self._keys and self._keys[0] > now:
            return self._keys[1]
        async with self._lock:
            document = await self._get_json((await self.metadata()).jwks_uri)
            try:
                keys = jwt.PyJWKSet.from_dict(document)
            except jwt.PyJWTError:
                raise SsoError("The identity provider's JWKS holds no usable key.",
                               code="sso_provider_unavailable") from None  # fmt: skip
            self._keys = (now + self.sso.metadata_cache_seconds, keys)
            return keys

    async def validate(self, id_token: str, *, nonce: str | None) -> dict[str, Any]:
        """Check ``id_token``; a key id the cached JWKS lacks refetches it once (rotation)."""
        keys = await self.keys()
        try:
            kid = jwt.get_unverified_header(id_token).get("kid")
        except jwt.PyJWTError:
            kid = None
        if kid is not None and all(k.key_id != kid for k in keys.keys):
            keys = await self.keys(refresh=True)
        assert self.sso.client_id is not None
        return verify_id_token(
            id_token, keys, issuer=self.issuer, audience=self.sso.client_id, nonce=nonce,
            now=self.clock(), leeway=self.sso.clock_skew_seconds,
        )  # fmt: skip

    async def authorize_url(
        self, *, redirect_uri: str, state: str, nonce: str, challenge: str
    ) -> str:
        meta = await self.metadata()
        query = urlencode({
            "response_type": "code", "client_id": self.sso.client_id,
            "redirect_uri": redirect_uri, "scope": " ".join(self.sso.scopes), "state": state,
            "nonce": nonce, "code_challenge": challenge, "code_challenge_method": "S256",
            # offline_access (a refresh token) needs the person's consent at most providers.
            **({"prompt": "consent"} if "offline_access" in self.sso.scopes else {}),
        })  # fmt: skip
        separator = "&" if "?" in meta.authorization_endpoint else "?"
        return f"{meta.authorization_endpoint}{separator}{query}"

    async def exchange_code(self, code: str, *, verifier: str, redirect_uri: str) -> dict[str, Any]:
        return await self._token_request({
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        })  # fmt: skip

    async def refresh(self, refresh_token: str) -> dict[str, Any]:
        """A refresh grant's answer; SsoError code sso_refresh_refused when the provider says
        no (the person was disabled, or the grant revoked)."""
        return await self._token_request(
            {"grant_type": "refresh_token", "refresh_token": refresh_token}
        )

    async def _token_request(self, form: dict[str, str]) -> dict[str, Any]:
        meta = await self.metadata()
        form = {**form, "client_id": self.sso.client_id or ""}
        if self.sso.client_secret is not None:
            form["client_secret"] = self.sso.client_secret.get_secret_value()
        status, body = await _post_form(meta.token_endpoint, form, self.policy)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if status == 400 and isinstance(answer, dict) and answer.get("error") == "invalid_grant":
            raise SsoError("The identity provider refused the grant.", code="sso_refresh_refused")
        if status != 200 or not isinstance(answer, dict) or "id_token" not in answer:
            raise SsoError("The identity provider's token endpoint refused the sign-in.",
                           code="sso_token_refused")  # fmt: skip
        return answer


async def _post_form(url: str, form: dict[str, str], policy: FetchPolicy) -> tuple[int, bytes]:
    """POST a form through the fetcher (its address rules, no redirects); status and body."""
    try:
        return await post_form(url, form, policy, max_bytes=_MAX_DOCUMENT_BYTES)
    except FetchError as exc:
        refused = isinstance(exc, SourceRefused)
        raise SsoError(
            "The identity provider's token endpoint is refused by fetch rules."
            if refused
            else "The identity provider's token endpoint could not be reached.",
            code="sso_provider_unavailable",
        ) from None
