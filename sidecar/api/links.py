"""`GET` and `POST /a/{token}`: a notification's one-tap link. The URL is the credential: no API
token, and no browser check either (a page elsewhere that knows the URL could as well POST it
itself). A `GET` only shows what the link would do (link previews and chat unfurlers fetch
URLs), the `POST` does it, once (`sidecar.notify.service` decides). A browser (`Accept:
text/html`) gets a small page; anything else, JSON.
"""

from __future__ import annotations

from html import escape

from aiohttp import web

from sidecar.agent.approvals import AlreadyAnswered
from sidecar.api import httpio
from sidecar.api.approvals import approval_conflict
from sidecar.api.openapi import HTML, Media, Operation
from sidecar.core.shapes import ApprovalDecided, Error, LinkInfo
from sidecar.notify.service import Notifier, Opened

# The page names nothing outside itself, sends no referrer (the URL is a secret), is never
# framed, cached or indexed, and its one form goes back to its own URL.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Robots-Tag": "noindex, nofollow",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
}
STYLE = (
    "body{font:16px/1.4 system-ui,sans-serif;max-width:32em;margin:2em auto;padding:0 1em;"
    "background:#111;color:#eee}code{display:block;background:#222;padding:.6em;"
    "white-space:pre-wrap;word-break:break-all}button{font-size:1.1em;padding:.5em 1.5em}"
    ".allow{background:#2a6}.deny{background:#a33}p.dim{color:#999}"
)
GONE = "This link no longer works: the request is over, or the link expired."
UNKNOWN = "No such link."
PATH_PARAMETER = {"name": "token", "in": "path", "required": True, "schema": {"type": "string"}}


def _wants_html(request: web.Request) -> bool:
    return "text/html" in request.headers.get("Accept", "")


def _page(title: str, body: str, status: int) -> web.Response:
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="robots" content="noindex"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>"
    )
    return web.Response(
        text=html, status=status, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
    )


def _about(opened: Opened) -> str:
    a = opened.approval
    if a is None:
        return ""
    return f"<p>{escape(a.tool)}</p><code>{escape(a.summary)}</code>"


def _closed(request: web.Request, opened: Opened) -> web.Response:
    """404, 409 (naming the first answer) or 410."""
    html = _wants_html(request)
    if opened.status == 409 and opened.first is not None and opened.link is not None:
        first = opened.first
        conflict = approval_conflict(AlreadyAnswered(opened.link.approval_id, first, None))
        if not html:
            return httpio.answer(conflict, 409, PAGE_HEADERS)
        text = f"It was answered already: {first.decision} (by {first.by})."
        return _page("Already answered", f"<p>{escape(text)}</p>", 409)
    status, text = (404, UNKNOWN) if opened.status == 404 else (410, GONE)
    if not html:
        return httpio.answer(Error(error=text), status, PAGE_HEADERS)
    return _page("Link not valid", f"<p>{escape(text)}</p>", status)


def link_operations(notifier: Notifier) -> list[Operation]:
    async def show(request: web.Request) -> web.Response:
        opened = notifier.open_link(request.match_info["token"])
        if opened.status != 200 or opened.link is None or opened.approval is None:
            return _closed(request, opened)
        decision = opened.link.decision
        if not _wants_html(request):
            a = opened.approval
            info = LinkInfo(
                id=a.id, decision=decision, tool=a.tool, summary=a.summary, since=a.since
            )
            return httpio.answer(info, headers=PAGE_HEADERS)
        verb = decision.capitalize()
        body = (
            f"{_about(opened)}<p class=dim>{escape(notifier.sleeve_id)} asks. This link works "
            f'once.</p><form method="post"><button class="{decision}" type="submit">{verb}'
            "</button></form>"
        )
        return _page(f"{verb} this request?", body, 200)

    async def decide(request: web.Request) -> web.Response:
        opened = notifier.answer_link(request.match_info["token"])
        if opened.status != 200 or opened.link is None:
            return _closed(request, opened)
        decision = opened.link.decision
        if not _wants_html(request):
            done = ApprovalDecided(id=opened.link.approval_id, decision=decision, by="link")
            return httpio.answer(done, headers=PAGE_HEADERS)
        title = "Allowed" if decision == "allow" else "Denied"
        return _page(title, f"{_about(opened)}<p class=dim>The agent has been told.</p>", 200)

    text = (
        "A notification's one-tap link (`SIDECAR_PUBLIC_URL/a/<token>`): the URL is the "
        "credential, bound to one permission request and one decision; no API token. A browser "
        "(`Accept: text/html`) gets a page for every status below, anything else JSON. 404: not "
        "a link of this sidecar; 409: the request was answered already (the answer names "
        "`decision` and `by`); 410: the request is over (withdrawn), the link expired (24 h), "
        "or it was made before the supervisor restarted."
    )
    return [
        Operation(
            "GET",
            "/a/{token}",
            show,
            "getLink",
            "notify",
            "What a one-tap link would do; decides nothing",
            {200: (LinkInfo, Media("browsers: the confirmation page", HTML))},
            description=text + " Link previews fetch URLs: a GET never decides.",
            errors=(404, 409, 410),
            public=True,
            capability=True,
            parameters=(PATH_PARAMETER,),
        ),
        Operation(
            "POST",
            "/a/{token}",
            decide,
            "postLink",
            "notify",
            "Answer the permission request as the link says, once (`by: link`)",
            {200: (ApprovalDecided, Media("browsers: what was done", HTML))},
            description=text + " Any body is ignored.",
            errors=(404, 409, 410),
            public=True,
            capability=True,
            parameters=(PATH_PARAMETER,),
        ),
    ]
