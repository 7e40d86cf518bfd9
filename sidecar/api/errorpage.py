"""What a browser gets when it opens a page (the dashboard, its terminal, the API reference) that
the sidecar cannot serve: a small HTML page saying what happened and what to do, instead of the
API's JSON error. A 401 carries a form for the token; a 503 loads itself again every few
seconds, so the dashboard's terminal frame comes back by itself when ttyd does.
"""

from __future__ import annotations

import html
import json

from aiohttp import web

PAGES = frozenset({"/", "/api", "/terminal", "/terminal/"})
RETRY = 2  # seconds between a 503 page's tries
CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'"
STYLE = (
    "body{margin:0;padding:2em;background:#0d1117;color:#d6dde6;"
    "font:15px/1.5 system-ui,'DejaVu Sans',sans-serif}h1{font-size:18px}"
    "p{max-width:44em}input,button{font:inherit;padding:3px 8px;border-radius:4px;"
    "border:1px solid #30363d;background:#161b22;color:#d6dde6}"
)
WHAT_TO_DO = {
    401: "This page needs the sleeve's token. Open the link `sleeve run` printed (it ends in "
    "<code>?token=…</code>), or paste the token here:",
    403: "This token may look but not do this: use the sleeve's API token, not its view token. "
    "A page from another address is refused too: open it from the sidecar's own.",
    503: f"It is starting or restarting: this page tries again every {RETRY} seconds by itself.",
}
ELSE = "Reload the page to try again; if it keeps failing, the sidecar's log says why."


def wanted(request: web.Request, response: web.StreamResponse) -> bool:
    """Whether this error answer goes to a person's browser opening one of the pages."""
    return (
        response.status >= 400
        and request.method in ("GET", "HEAD")
        and request.path in PAGES
        and "text/html" in request.headers.get("Accept", "")
        and isinstance(response, web.Response)
        and response.content_type == "application/json"
    )


def page(request: web.Request, response: web.Response) -> web.Response:
    """`response` (a JSON error) as a page that says it in words."""
    raw = response.body if isinstance(response.body, bytes) else b"{}"
    try:
        said = str(json.loads(raw).get("error") or response.reason)
    except (ValueError, AttributeError):
        said = response.reason
    status = response.status
    if status == 401 and "token" in request.query:
        said = "the token in this link is not this sleeve's"
    form = ""
    if status == 401:
        form = (
            '<form method="get" autocomplete="off"><input name="token" type="password" '
            'aria-label="token" placeholder="token" required> <button>open</button></form>'
        )
    refresh = f'<meta http-equiv="refresh" content="{RETRY}">' if status == 503 else ""
    body = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{refresh}'
        f"<title>sleeve: {status}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(_sentence(said))}</h1>"
        f"<p>{WHAT_TO_DO.get(status, ELSE)}</p>{form}</body></html>"
    )
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}
    headers.update({k: v for k, v in response.headers.items() if k in ("Retry-After",)})
    if "WWW-Authenticate" in response.headers:
        headers["WWW-Authenticate"] = response.headers["WWW-Authenticate"]
    return web.Response(
        status=status, text=body, content_type="text/html", charset="utf-8", headers=headers
    )


def _sentence(said: str) -> str:
    text = said.strip() or "the sidecar could not answer"
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")
