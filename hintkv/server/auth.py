"""Bearer-token authentication and the tenant identity derived from it.

With no API keys configured the server is open and every client is the anonymous tenant.
A tenant is (who is calling, which cache namespace they asked for): sessions and their KV
never cross tenants. The key itself is never used as an identifier, only a digest of it,
so it cannot leak through logs, metrics or cache keys.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from hintkv.server.errors import APIError

ANONYMOUS = "anonymous"


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(request: Request, api_keys: tuple[str, ...]) -> str | None:
    """The caller's key (None if it sent none); a 401 if we have keys and it is not one."""
    token = bearer_token(request)
    if not api_keys:
        return token
    # bytes, not str: compare_digest refuses str with non-ASCII characters (a header byte >= 0x80 read as latin-1)
    # the header's own bytes back (Starlette decoded them as latin-1): a key with a non-ASCII character, sent as UTF-8
    # as httpx, requests and curl send it, then matches the key's UTF-8 (review rev_rev28_a A2: it never did)
    sent = None if token is None else token.encode("latin-1", "surrogateescape")
    if sent is None or not any(hmac.compare_digest(sent, key.encode("utf-8", "surrogateescape")) for key in api_keys):
        raise APIError(
            401,
            "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
            type="authentication_error",
            code="invalid_api_key",
        )
    return token


def key_identity(api_key: str | None) -> str:
    if api_key is None:
        return ANONYMOUS
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


def tenant_of(api_key: str | None, cache_salt: str | None) -> str:
    """The tenant string of a request: the caller's identity, then its cache namespace if any.

    The salt enters as a digest, so a tenant is always `[a-z0-9-]+` or that plus
    `/salt-<hex>`: no client string (a salt holding a separator) can reach into another
    tenant's name, and the session registry's keys stay unambiguous.
    """
    identity = key_identity(api_key)
    if cache_salt is None:
        return identity
    digest = hashlib.sha256(cache_salt.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{identity}/salt-{digest}"


def caller_of(tenant: str) -> str:
    """The caller's identity in a tenant string (`tenant_of`'s part before its salt): what the load gate's rate and
    concurrency limits count, since a salt is a KV namespace the client picks freely per request (review rev26 A15)."""
    return tenant.partition("/")[0]
