"""Who is asking: the one API-key dependency of the query API and the dashboard.

A request names its key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (the
Bearer token wins when both are sent); :meth:`projections.keys.ApiKeys.resolve` finds its
tenant or operator. No key, or one not in the keys file: ``401`` with
``WWW-Authenticate: Bearer``, the same answer either way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Header, HTTPException

from projections.keys import ApiKeys, Principal


def principal_of(keys: ApiKeys) -> Callable[..., Awaitable[Principal]]:
    """The FastAPI dependency that resolves a request's key against ``keys``."""

    async def principal(
        authorization: Annotated[str | None, Header()] = None,
        x_api_key: Annotated[str | None, Header()] = None,
    ) -> Principal:
        key = x_api_key
        if authorization and authorization.lower().startswith("bearer "):
            key = authorization[7:].strip()
        found = keys.resolve(key)
        if found is None:
            raise HTTPException(401, "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
        return found

    return principal
