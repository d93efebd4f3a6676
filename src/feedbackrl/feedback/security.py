"""Browser-facing hardening of the labelling app: response headers, the same-origin check on
cookie-authenticated forms, and the bounds of numeric ids.

Headers on every response: a Content-Security-Policy (scripts only with the per-response nonce
the label page's inline script carries, no plugins, no base-uri, forms post only here, and
`frame-ancestors 'none'`), X-Frame-Options DENY, X-Content-Type-Options nosniff and
Referrer-Policy same-origin, so the one-key label page cannot be framed for clickjacking and no
other site learns ids through the Referer. (Not no-referrer: under it a browser sends
`Origin: null` on the app's own form posts, which the origin check below must refuse.) The
interactive API docs load their scripts from a CDN, so they get the other headers but no CSP.

Forms authenticated by the cookie (log in, log out, label, undo) must come from this origin: a
browser sends `Origin` (or `Sec-Fetch-Site`) on cross-site posts, which are refused with 403.
Login CSRF (a hostile page logging the victim in as the attacker) is refused the same way.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Request
from pydantic import Field
from starlette.datastructures import MutableHeaders

from feedbackrl.feedback.store import Forbidden

MAX_ID = 2**31 - 1  # ids are INTEGER columns (PostgreSQL: 32-bit); beyond this nothing can match
Id = Annotated[int, Field(ge=1, le=MAX_ID, description=f"a row id, 1..{MAX_ID}")]
_DOCS = ("/api/docs", "/api/docs/oauth2-redirect", "/api/redoc")


def content_security_policy(nonce: str) -> str:
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class SecurityHeaders:
    """ASGI middleware: a CSP nonce in `request.state.csp_nonce`, and the headers above on every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})["csp_nonce"] = nonce
        docs = scope["path"] in _DOCS

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if not docs:
                    headers["Content-Security-Policy"] = content_security_policy(nonce)
                headers["X-Frame-Options"] = "DENY"
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "same-origin"
            await send(message)

        await self.app(scope, receive, send_with_headers)


def check_same_origin(request: Request) -> None:
    """Refuse (403) a form post that a browser says came from another site."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden(f"cross-site form post refused (Sec-Fetch-Site: {site}); use the app's own pages")
    host = request.headers.get("host", "")
    for header in ("origin", "referer"):
        value = request.headers.get(header)
        if value is not None:
            if value == "null" or urlsplit(value).netloc != host:
                raise Forbidden(f"cross-site form post refused ({header.title()}: {value[:100]}, this app is "
                                f"{host}); use the app's own pages")
            return  # Origin decides when present; Referer only stands in for it
