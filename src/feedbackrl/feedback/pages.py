"""Server-rendered pages: log in with a token, pick a project, label with the keyboard.

Plain HTML forms do the work (they function without JavaScript); a small inline script in
`label.html` maps keys to the form's buttons. Each rendered form carries a fresh submission id,
so a double-click or a resent POST stores one label.

Responses are shown in a per-(item, labeller) shuffled order to spread position bias; buttons
and the ranking field are translated back to the item's stored response indices here.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from feedbackrl.feedback import labels as L
from feedbackrl.feedback.auth import COOKIE, check_csrf, csrf_token, request_token, signed_in
from feedbackrl.feedback.clips import PREFIX as CLIP_PREFIX
from feedbackrl.feedback.clips import get_clip
from feedbackrl.feedback.security import MAX_ID, Id, check_same_origin
from feedbackrl.feedback.store import (
    FeedbackError,
    Item,
    Labeller,
    Project,
    authenticate,
    project_for,
    visible_projects,
)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
router = APIRouter()


def display_order(item_id: int, labeller_id: int, k: int) -> list[int]:
    """Stored response indices in the order this labeller sees them (stable across reloads)."""
    order = list(range(k))
    random.Random(f"{item_id}:{labeller_id}").shuffle(order)
    return order


def ranking_from_order(order: str, shown: list[int]) -> list[int]:
    """'2 1 3' (display numbers, best first) -> stored indices; FeedbackError if it is not a permutation."""
    try:
        numbers = [int(x) for x in order.replace(",", " ").split()]
    except ValueError:
        numbers = []
    if sorted(numbers) != list(range(1, len(shown) + 1)):
        raise FeedbackError(f"order must list each of 1..{len(shown)} once, best first; got {order!r:.80}")
    return [shown[n - 1] for n in numbers]


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login")
def login(request: Request, token: str = Form(..., max_length=200)) -> Response:
    check_same_origin(request)  # login CSRF: a hostile page must not sign the victim in as someone else
    with request.app.state.sessions() as s:
        known = authenticate(s, token.strip()) is not None
    if not known:
        return templates.TemplateResponse(request, "login.html", {"error": "unknown token"}, status_code=401)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, token.strip(), httponly=True, samesite="strict", max_age=30 * 24 * 3600)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    check_same_origin(request)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response


@router.get("/", response_class=HTMLResponse)
def projects(request: Request) -> Response:
    with signed_in(request) as (s, who):
        rows = [(p, L.progress(s, who, p)) for p in visible_projects(s, who)]
        return templates.TemplateResponse(request, "projects.html", {"who": who, "rows": rows})


def _render_label(request: Request, s: Session, who: Labeller, project: Project, prefer: int | None = None,
                  error: str | None = None, status: int = 200) -> Response:
    item = L.next_item(s, who, project, prefer)
    shown = display_order(item.id, who.id, len(item.responses)) if item else []
    last = L.last_label(s, who, project)
    context = {"who": who, "project": project, "item": item, "shown": shown, "last": last, "error": error,
               "progress": L.progress(s, who, project), "csrf": csrf_token(request_token(request)),
               "submission_id": uuid.uuid4().hex, "clip_prefix": CLIP_PREFIX}
    return templates.TemplateResponse(request, "label.html", context, status_code=status)


@router.get("/projects/{project_id}", response_class=HTMLResponse)
def label_page(request: Request, project_id: Id,
               item: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None) -> Response:
    with signed_in(request) as (s, who):
        return _render_label(request, s, who, project_for(s, who, project_id), prefer=item)


@router.get("/projects/{project_id}/clips/{digest}")
def clip(request: Request, project_id: Id, digest: str) -> Response:
    """A clip of the project, for its members only (the page's cookie, or a bearer token)."""
    with signed_in(request) as (s, who):
        found = get_clip(s, project_for(s, who, project_id), digest)
        data, media_type = found.data, found.media_type
    # immutable: the URL is the content's hash; private: only members may see it
    return Response(data, media_type=media_type, headers={"Cache-Control": "private, max-age=86400, immutable"})


@router.post("/projects/{project_id}/label")
def label_form(request: Request, project_id: Id, csrf: str = Form(""), submission_id: str = Form(...),
               item_id: int = Form(..., ge=1, le=MAX_ID), choice: str = Form(..., max_length=16),
               order: str = Form("", max_length=400), reason: str = Form("", max_length=L.REASON_MAX)) -> Response:
    check_same_origin(request)
    check_csrf(request, csrf)
    with signed_in(request) as (s, who):
        project = project_for(s, who, project_id)
        try:
            ranking = None
            item = s.get(Item, item_id)
            if choice == "ranked" and item is not None and item.project_id == project.id:
                ranking = ranking_from_order(order, display_order(item_id, who.id, len(item.responses)))
            L.submit(s, who, project, L.Submission(submission_id, item_id, choice, ranking, reason.strip() or None))
        except FeedbackError as e:
            s.rollback()
            return _render_label(request, s, who, project, prefer=item_id, error=str(e), status=e.status)
    return RedirectResponse(f"/projects/{project_id}", status_code=303)


@router.post("/projects/{project_id}/undo")
def undo_form(request: Request, project_id: Id, csrf: str = Form(""),
              label_id: int = Form(..., ge=1, le=MAX_ID)) -> Response:
    check_same_origin(request)
    check_csrf(request, csrf)
    with signed_in(request) as (s, who):
        undone = L.undo(s, who, project_for(s, who, project_id), label_id)
    return RedirectResponse(f"/projects/{project_id}?item={undone['item_id']}", status_code=303)
