"""Sign-in with OpenID Connect: the routes (service.py beside it has the protocol)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from fastapi.responses import RedirectResponse

from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.deps import SettingsDep
from tensor_registry_server.sso import service
from tensor_registry_server.sso.schemas import PersonOut, SsoConfigOut, SsoRedeem, SsoSession

# Sign-in comes before any token: no bearer declared on these routes.
router = APIRouter(prefix="/api/v1/sso", tags=["sso"])
_PUBLIC: dict[str, object] = {"security": []}
_NO_STORE = {"Cache-Control": "no-store"}


@router.get("/config", response_model=SsoConfigOut, openapi_extra=_PUBLIC)
async def sso_config(settings: SettingsDep) -> SsoConfigOut:
    """Whether sign-in with the identity provider is on (no token needed: the sign-in page
    asks)."""
    return SsoConfigOut(enabled=settings.sso.enabled, issuer=settings.sso.issuer)


@router.get("/login", status_code=302, response_class=RedirectResponse, openapi_extra=_PUBLIC)
async def sso_login(
    session: SessionDep,
    settings: SettingsDep,
    code_challenge: Annotated[str, Query(max_length=128)],
    client: Literal["web", "cli"] = "web",
    redirect_uri: Annotated[str | None, Query(max_length=512)] = None,
    state: Annotated[str | None, Query(max_length=256)] = None,
) -> RedirectResponse:
    """Start a sign-in: a redirect to the identity provider. `code_challenge`: the client's
    PKCE S256 challenge; `redirect_uri` (CLI only): its loopback listener."""
    url = await service.start(
        session, settings, client=client, code_challenge=code_challenge,
        redirect_uri=redirect_uri, client_state=state,
    )  # fmt: skip
    return RedirectResponse(url, status_code=302, headers=_NO_STORE)


@router.get("/callback", status_code=302, response_class=RedirectResponse, openapi_extra=_PUBLIC)
async def sso_callback(
    session: SessionDep,
    settings: SettingsDep,
    state: Annotated[str, Query(max_length=256)],
    code: Annotated[str | None, Query(max_length=2048)] = None,
    error: Annotated[str | None, Query(max_length=256)] = None,
) -> RedirectResponse:
    """The identity provider's redirect back; sends the browser on to the client with a
    one-time code (or `error`)."""
    url = await service.finish(session, settings, state=state, code=code, error=error)
    return RedirectResponse(url, status_code=302, headers=_NO_STORE)


@router.post("/token", response_model=SsoSession, openapi_extra=_PUBLIC)
async def sso_token(
    body: SsoRedeem, session: SessionDep, settings: SettingsDep, response: Response
) -> SsoSession:
    """Redeem the one-time code with the PKCE verifier: a session token of the person,
    valid `sso.session_seconds` and within the person's roles."""
    token, secret, person = await service.redeem(
        session, settings, code=body.code, code_verifier=body.code_verifier
    )
    response.headers.update(_NO_STORE)
    assert token.expires_at is not None
    return SsoSession(
        token=secret, token_id=token.id, expires_at=token.expires_at,
        person=PersonOut.model_validate(person),
    )  # fmt: skip
