"""The labelling web app: a JSON API under /api (bearer tokens) and server-rendered pages.

`create_app(db)` migrates the database to head and serves it. Access rules: an admin token may
create projects and labellers, invite labellers and add items; a labeller sees only the projects
they were invited to, and only their own labels. A project someone may not see answers 404, the
same as one that does not exist.

The API authenticates by the Authorization header only (see `auth`); `security` adds the response
headers and the same-origin check on forms. Every refusal is a JSON ``{"error": message}`` with a
4xx status: 400 malformed JSON, 401 no or bad token, 403 not an admin / bad CSRF token /
cross-site form, 404 unknown or foreign project/item/label, 409
conflict (submission id reused for a different label, item already labelled), 413 body too
large, 422 a well-formed request with a bad value (wrong choice for the item's kind, an id out of
range, a NUL byte or lone surrogate in text, metadata nested too deep, no JSON Content-Type, ...).
A 503 (database unreachable, or no pooled connection within the pool timeout) stored nothing and
may be retried.
"""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from feedbackrl.feedback import labels as L
from feedbackrl.feedback.auth import signed_in
from feedbackrl.feedback.clips import add_clip, decode
from feedbackrl.feedback.export import FORMATS, export_rows, labelled_pairs
from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.security import MAX_ID, Id, SecurityHeaders
from feedbackrl.feedback.store import (
    Conflict,
    FeedbackError,
    Item,
    Label,
    NotFound,
    Project,
    add_member,
    create_labeller,
    create_project,
    get_labeller,
    open_db,
    project_for,
    revoke_labeller,
    visible_projects,
)

BODY_LIMIT = 4 * 1024 * 1024  # bytes; item imports are the big requests


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProjectIn(Strict):
    name: str = Field(min_length=1, max_length=64, description="unique project name")
    kind: Literal["pairwise", "ranking", "accept_reject"]
    overlap: int = Field(1, ge=1, le=100, description="labels wanted per item")
    instructions: str = Field("", max_length=10_000, description="shown to labellers above each item")


class LabellerIn(Strict):
    name: str = Field(min_length=1, max_length=64)
    admin: bool = False


class MemberIn(Strict):
    labeller: str = Field(min_length=1, max_length=64, description="name of an existing labeller")


class ItemsIn(Strict):
    items: list[dict[str, Any]] = Field(max_length=10_000)


class ClipIn(Strict):
    data: str = Field(min_length=1, max_length=BODY_LIMIT, description="the clip's bytes, base64")
    media_type: str = Field("image/gif", max_length=32, description="image/gif (clips.MEDIA_TYPES)")


class LabelIn(Strict):
    submission_id: str = Field(min_length=1, max_length=64, description="client-chosen; reuse it on retries")
    item_id: Id
    choice: str = Field(max_length=16)
    ranking: list[int] | None = Field(None, max_length=100)
    reason: str | None = Field(None, max_length=L.REASON_MAX)


class UndoIn(Strict):
    label_id: Id | None = None


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before any handler runs."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                response = JSONResponse({"error": f"request body over {self.limit} bytes"}, status_code=413)
                await response(scope, receive, send)
                return
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    for e in errors:
        if e.get("type") == "json_invalid":
            return 400, f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}"
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg')}")
    return 422, "; ".join(parts)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(FeedbackError)
    async def feedback_error(request: Request, exc: FeedbackError) -> Response:
        if request.url.path.startswith("/api"):
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        if exc.status == 401:  # a page without a valid cookie: go and log in
            return RedirectResponse("/login", status_code=303)
        return HTMLResponse(f"<p>error: {html.escape(str(exc))}</p><p><a href='/'>back</a></p>",
                            status_code=exc.status)

    @app.exception_handler(OverflowError)
    async def overflow_error(request: Request, exc: OverflowError) -> Response:
        # a number too large for the database that the bounds on ids did not catch; nothing stored
        return JSONResponse({"error": f"a number in the request is out of range: {exc}"}, status_code=422)

    @app.exception_handler(IntegrityError)
    async def integrity_error(request: Request, exc: IntegrityError) -> Response:
        # a race the checks before the write could not see (e.g. two admins creating one name)
        return JSONResponse({"error": f"conflicting concurrent write, nothing stored: {exc.orig}"}, status_code=409)

    @app.exception_handler(PoolTimeout)
    @app.exception_handler(OperationalError)
    async def database_unavailable(request: Request, exc: Exception) -> Response:
        # no connection within the pool timeout, or the database went away mid-request: the
        # transaction was rolled back, so the client may retry (a submit with the same submission_id)
        reason = exc.orig if isinstance(exc, OperationalError) else exc
        return JSONResponse({"error": f"database unavailable, nothing stored; retry: {reason}"}, status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        status, message = _validation_message(exc)
        return JSONResponse({"error": message}, status_code=status)


def request_threads(sessions: sessionmaker[Session]) -> int | None:
    """How many requests may run at once: the engine's pool size (None for a pool without one)."""
    size = getattr(sessions.kw["bind"].pool, "size", None)
    return size() if callable(size) else None


def create_app(db_url: str | None = None, sessions: sessionmaker[Session] | None = None,
               connections: int | None = None) -> FastAPI:
    """The app for `db_url` (migrated to head on creation, a pool of `connections`), or for an open
    session factory. It runs as many requests at once as the pool has connections (see `store.make_engine`)."""
    from feedbackrl.feedback.pages import router as pages

    sessions = sessions if sessions is not None else open_db(db_url or "feedback.db", connections=connections)
    threads = request_threads(sessions)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Sync handlers run on anyio's default thread limiter (40 threads). One thread per pooled
        # connection: more threads would only queue on the pool, fewer would leave connections idle.
        if threads is not None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        yield

    # strict_content_type (FastAPI >= 0.132, also the default there): a JSON body without a JSON
    # Content-Type is refused, so a cross-site "simple" request cannot post JSON.
    app = FastAPI(title="feedbackrl labelling", docs_url="/api/docs", openapi_url="/api/openapi.json",
                  strict_content_type=True, lifespan=lifespan)
    app.state.sessions = sessions
    app.add_middleware(BodyLimit, limit=BODY_LIMIT)
    app.add_middleware(SecurityHeaders)  # outermost: its headers are on every response, 413s included
    _install_errors(app)
    _api_routes(app)
    app.include_router(pages)
    return app


def _api_routes(app: FastAPI) -> None:
    @app.get("/api/me")
    def me(request: Request) -> dict:
        with signed_in(request) as (_, who):
            return {"name": who.name, "is_admin": who.is_admin}

    @app.get("/api/projects")
    def projects(request: Request) -> list[dict]:
        with signed_in(request) as (s, who):
            return [_project_dict(p) for p in visible_projects(s, who)]

    @app.post("/api/projects", status_code=201)
    def new_project(request: Request, body: ProjectIn) -> dict:
        with signed_in(request, admin=True) as (s, _):
            return _project_dict(create_project(s, body.name, body.kind, body.overlap, body.instructions))

    @app.post("/api/labellers", status_code=201)
    def new_labeller(request: Request, body: LabellerIn) -> dict:
        with signed_in(request, admin=True) as (s, _):
            labeller, token = create_labeller(s, body.name, body.admin)
            return {"id": labeller.id, "name": labeller.name, "token": token}

    @app.delete("/api/labellers/{name}")
    def revoke(request: Request, name: str) -> dict:
        """Lock a labeller out (admin): token, admin right and memberships go; their labels stay."""
        with signed_in(request, admin=True) as (s, who):
            if name == who.name:
                raise Conflict("you cannot revoke yourself; another admin can")
            revoke_labeller(s, name)
            return {"revoked": name}

    @app.post("/api/projects/{project_id}/members")
    def invite(request: Request, project_id: Id, body: MemberIn) -> dict:
        with signed_in(request, admin=True) as (s, who):
            added = add_member(s, project_for(s, who, project_id), get_labeller(s, body.labeller))
            return {"project_id": project_id, "labeller": body.labeller, "added": added}

    @app.post("/api/projects/{project_id}/items", status_code=201)
    def items(request: Request, project_id: Id, body: ItemsIn) -> dict:
        with signed_in(request, admin=True) as (s, who):
            return {"item_ids": add_items(s, project_for(s, who, project_id), body.items)}

    @app.post("/api/projects/{project_id}/clips", status_code=201)
    def clip(request: Request, project_id: Id, body: ClipIn, response: Response) -> dict:
        """Upload a clip (admin) -> its reference for item responses; the same bytes again are stored once."""
        with signed_in(request, admin=True) as (s, who):
            ref, created = add_clip(s, project_for(s, who, project_id), decode(body.data), body.media_type)
        if not created:
            response.status_code = 200
        return {"ref": ref, "created": created}

    @app.get("/api/projects/{project_id}/next")
    def next_item(request: Request, project_id: Id) -> dict:
        with signed_in(request) as (s, who):
            project = project_for(s, who, project_id)
            item = L.next_item(s, who, project)
            return {"item": L.item_dict(item, project) if item else None}

    @app.get("/api/projects/{project_id}/items/{item_id}")
    def item(request: Request, project_id: Id, item_id: Id) -> dict:
        with signed_in(request) as (s, who):
            project = project_for(s, who, project_id)
            found = s.get(Item, item_id)
            if found is None or found.project_id != project.id:
                raise NotFound(f"item {item_id} not found in project {project_id}")
            return L.item_dict(found, project)

    @app.get("/api/projects/{project_id}/progress")
    def progress(request: Request, project_id: Id) -> dict:
        with signed_in(request) as (s, who):
            return L.progress(s, who, project_for(s, who, project_id))

    @app.post("/api/projects/{project_id}/labels", status_code=201)
    def submit(request: Request, project_id: Id, body: LabelIn, response: Response) -> dict:
        with signed_in(request) as (s, who):
            label, created = L.submit(s, who, project_for(s, who, project_id), L.Submission(**body.model_dump()))
        if not created:
            response.status_code = 200  # a replay: the label was already stored
        return {"label": label, "created": created}

    @app.get("/api/projects/{project_id}/labels")
    def labels(request: Request, project_id: Id) -> list:
        """Your labels in the project (an admin gets everyone's), oldest first, undone ones included."""
        with signed_in(request) as (s, who):
            project = project_for(s, who, project_id)
            query = select(Label).where(Label.project_id == project.id).order_by(Label.id)
            if not who.is_admin:
                query = query.where(Label.labeller_id == who.id)
            return [L.label_dict(x) for x in s.scalars(query)]

    @app.post("/api/projects/{project_id}/undo")
    def undo(request: Request, project_id: Id, body: UndoIn) -> dict:
        with signed_in(request) as (s, who):
            return {"undone": L.undo(s, who, project_for(s, who, project_id), body.label_id)}

    @app.get("/api/projects/{project_id}/status")
    def status(request: Request, project_id: Id) -> dict:
        """Queue counts for the project (admin): items, open items, labels, last label id."""
        with signed_in(request, admin=True) as (s, who):
            return L.queue_status(s, project_for(s, who, project_id))

    @app.get("/api/projects/{project_id}/export")
    def export(request: Request, project_id: Id, format: str = "pairs",
               since_id: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
               ties: bool = False) -> list:
        """The project's labels as dataset rows (admin); `since_id` (pairs only) returns only newer labels,
        `ties` (pairs only) adds tie labels as rows marked "tie"."""
        if format not in FORMATS:
            raise FeedbackError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
        with signed_in(request, admin=True) as (s, who):
            project = project_for(s, who, project_id)
            if format == "pairs":
                return labelled_pairs(s, project, since_id, ties)
            return export_rows(s, project, format)  # type: ignore[arg-type]


def _project_dict(p: Project) -> dict:
    return {"id": p.id, "name": p.name, "kind": p.kind, "overlap": p.overlap}
