"""Request-scoped database sessions and who is asking: a bearer token (API) or a cookie (pages).

The JSON API under /api takes the Authorization header only, never the cookie, so no page on
another site can make a browser call it with the labeller's credentials. Pages take the cookie
(or the header); their forms carry a CSRF token derived from the labeller's token (a cross-site
page cannot read the cookie, so cannot compute it), must come from this origin
(`security.check_same_origin`), and the cookie is SameSite=Strict and HttpOnly.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from sqlalchemy.orm import Session

from feedbackrl.feedback.store import FeedbackError, Forbidden, Labeller, authenticate, hash_token

COOKIE = "feedbackrl_token"


class Unauthorized(FeedbackError):
    status = 401


def request_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    if request.url.path.startswith("/api"):
        return ""  # the API ignores the cookie: a browser attaches it to cross-site requests too
    return request.cookies.get(COOKIE, "")


@contextmanager
def signed_in(request: Request, admin: bool = False) -> Iterator[tuple[Session, Labeller]]:
    """(session, labeller) for this request's token; commits on success, rolls back on error.

    Handlers open this inside their own body, so one request's transaction starts and ends on one
    thread. Holding a SQLite write lock across a hop between threadpool threads could starve.
    """
    with request.app.state.sessions() as s:
        who = authenticate(s, request_token(request))
        if who is None:
            raise Unauthorized("missing or unknown token: send 'Authorization: Bearer <token>' "
                               "(ask an admin for an invitation)")
        if admin and not who.is_admin:
            raise Forbidden(f"{who.name!r} is not an admin; this needs the admin token")
        yield s, who
        s.commit()


def csrf_token(token: str) -> str:
    return hash_token("csrf:" + token)


def check_csrf(request: Request, sent: str) -> None:
    if not hmac.compare_digest(csrf_token(request_token(request)), sent or ""):
        raise Forbidden("the form's CSRF token does not match your session; reload the page")
