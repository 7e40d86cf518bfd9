"""Who may ask: one middleware that refuses what a web page elsewhere makes a browser send here
(CSRF, WebSocket hijacking, DNS rebinding) and checks the API tokens, plus the hook that turns a
browser's one-time `?token=` into a cookie. One middleware, not two: a layer costs a coroutine
frame per request on the hottest path (/health).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Collection
from typing import Literal
from urllib.parse import urlsplit

from aiohttp import typedefs, web
from aiohttp.web_urldispatcher import AbstractResource

from sidecar.api.httpio import error

COOKIE = "sidecar_token"
#: Request keys: the caller's role (`admin`, `viewer`, or `public` on a public route), and the
#: token to set as a cookie in the answer.
ROLE = web.RequestKey("role", str)
NEW_COOKIE = web.RequestKey("sidecar_new_cookie", str)
Role = Literal["admin", "viewer"]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
AUTH_HEADERS = {"WWW-Authenticate": 'Bearer realm="sidecar"'}


def _is_local_host(host: str) -> bool:
    """An IP literal or localhost: a name no DNS answer can point elsewhere."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
        if name == "localhost" or name.endswith(".localhost"):
            return True
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _browser_refusal(request: web.Request, allowed: frozenset[str], have_token: bool) -> str | None:
    """Why a browser's request must be refused, or None.

    A browser names the page's origin on every WebSocket handshake and cross-origin-capable
    request, and says it is a browser with Sec-Fetch-Site. Such a request passes when its origin
    is this server's own (the Host it asked for) or listed in SIDECAR_ALLOWED_ORIGINS. With no
    token set, a browser must also have asked for an IP address or localhost: a DNS name could
    be rebound to this machine by the page that made the request. Clients that are not browsers
    (the envoy, curl) send neither header and are not affected.
    """
    origin = request.headers.get("Origin")
    if (origin is None and "Sec-Fetch-Site" not in request.headers) or "*" in allowed:
        return None
    listed = origin is not None and origin.rstrip("/").lower() in allowed
    if origin is not None and not listed:
        own = urlsplit(origin).netloc.lower() == request.host.lower()
        if origin == "null" or not own:
            return f"cross-origin request from {origin} refused"
    if not have_token and not listed and not _is_local_host(request.host):
        return (
            f"a browser asked for {request.host}, which is not an IP address or localhost; "
            "set SIDECAR_TOKEN to serve browsers by name"
        )
    return None


def _token_role(request: web.Request, tokens: dict[str, Role]) -> tuple[Role | None, str | None]:
    """Which role the request's token grants, and the token itself (None: no valid token)."""
    candidates: list[str] = []
    auth = request.headers.get("Authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            candidates.append(value.strip())
    if "token" in request.query:
        candidates.append(request.query["token"])
    if COOKIE in request.cookies:
        candidates.append(request.cookies[COOKIE])
    for candidate in candidates:
        given = candidate.encode("utf-8", "surrogateescape")
        # Compare against every configured token, in constant time, whatever matches.
        matched: Role | None = None
        for token, role in tokens.items():
            if hmac.compare_digest(given, token.encode("utf-8")) and matched is None:
                matched = role
        if matched is not None:
            return matched, candidate
    return None, None


def make_guard(
    *,
    allowed_origins: frozenset[str],
    token: str | None,
    view_token: str | None,
    public: Collection[AbstractResource],
    capability: Collection[AbstractResource] = (),
) -> typedefs.Middleware:
    """The middleware: the browser checks, then the tokens (every route but the `public` ones,
    named by their resources, so a route with a variable part is matched as a whole). It sets
    `request[ROLE]`: `admin`, `viewer`, or `public` on a public route. A `capability` route's
    URL is its credential (a notification's link): neither check applies, since whoever can
    make a browser send it knows the URL, and could send it as well."""
    tokens: dict[str, Role] = {}
    if token:
        tokens[token] = "admin"
    if view_token:
        tokens[view_token] = "viewer"
    have_token = bool(token)
    public = frozenset(public)  # an identity set: a lookup per request
    capability = frozenset(capability)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        if capability and request.match_info.route.resource in capability:
            request[ROLE] = "public"
            return await handler(request)
        if "Origin" in headers or "Sec-Fetch-Site" in headers:  # a browser (else: nothing to check)
            refusal = _browser_refusal(request, allowed_origins, have_token)
            if refusal is not None:
                return error(403, refusal)
        if not tokens or request.match_info.route.resource in public:
            request[ROLE] = "admin" if not tokens else "public"
            return await handler(request)
        role, used = _token_role(request, tokens)
        if role is None:
            given = (
                "Authorization" in request.headers
                or "token" in request.query
                or COOKIE in request.cookies
            )
            message = (
                "invalid token"
                if given
                else "authentication required: Authorization: Bearer <token>"
            )
            return error(401, message, **AUTH_HEADERS)
        if role == "viewer" and request.method not in ("GET", "HEAD"):
            return error(403, "the view token is read-only")
        request[ROLE] = role
        if "token" not in request.query or used is None:
            return await handler(request)
        # A browser passes ?token= once; the cookie carries it from then on. An answer the
        # handler streams (prepared itself) gets it from the handler (`set_token_cookie`).
        request[NEW_COOKIE] = used
        response = await handler(request)
        if not response.prepared:
            set_token_cookie(request, response)
        return response

    return guard


def set_token_cookie(request: web.Request, response: web.StreamResponse) -> None:
    """The cookie for a `?token=` request, on an answer not yet sent; a handler that streams
    its answer calls this before `prepare` (ttyd's page: a browser lands there with ?token=,
    and the page's WebSocket then needs the cookie)."""
    token = request.get(NEW_COOKIE)
    if token is not None:
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
