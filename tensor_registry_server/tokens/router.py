from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from tensor_registry_server.auth import CurrentToken
from tensor_registry_server.core.db import SessionDep
from tensor_registry_server.core.pagination import Cursor, Limit
from tensor_registry_server.core.schemas import ListOut
from tensor_registry_server.rows.tokens import ApiToken
from tensor_registry_server.tokens import service
from tensor_registry_server.tokens.schemas import TokenCreate, TokenCreated, TokenOut

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
async def create_token(
    body: TokenCreate, session: SessionDep, principal: CurrentToken, response: Response
) -> TokenCreated:
    """Mint a token (needs `tokens:write` or `admin`): at most the minter's scopes, within its
    namespaces, expiring no later than the minter (422 `expiry_exceeds_parent`). Revoking the
    minter revokes it."""
    token, secret = await service.create_token(session, principal, body)
    response.headers["Location"] = f"/api/v1/tokens/{token.id}"
    response.headers["Cache-Control"] = "no-store"
    return TokenCreated.model_validate(
        {**TokenOut.model_validate(token).model_dump(), "token": secret}
    )


@router.get("", response_model=ListOut[TokenOut])
async def list_tokens(
    session: SessionDep, principal: CurrentToken, cursor: Cursor = None, limit: Limit = 50
) -> ListOut[TokenOut]:
    page = await service.list_tokens(session, principal, cursor=cursor, limit=limit)
    return ListOut[TokenOut](
        items=[TokenOut.model_validate(t) for t in page.items], next_cursor=page.next_cursor
    )


@router.get("/self", response_model=TokenOut)
async def whoami(session: SessionDep, principal: CurrentToken) -> TokenOut:

    token = await session.get(ApiToken, principal.token_id)
    return TokenOut.model_validate(token)


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_token(
    token_id: uuid.UUID, session: SessionDep, principal: CurrentToken
) -> Response:
    await service.revoke_token(session, principal, token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
