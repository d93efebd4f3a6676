"""The feedback database: projects, items, labellers (hashed tokens), memberships and labels.

The schema is owned by the Alembic migrations in `migrations/`; `open_db` upgrades to head, so a
fresh SQLite file or an empty PostgreSQL database is ready after one call. The models below mirror
the migrations (a test compares them).

Idempotency lives in the schema: a label carries a client-chosen `submission_id`, unique per
labeller, so a retried request can never insert twice; and a partial unique index allows one
active (not undone) label per labeller and item.

Tokens are 256-bit random strings (`secrets.token_urlsafe(32)`); only their SHA-256 is stored.
With that much entropy a plain hash is enough: there is nothing to brute-force, unlike passwords.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Engine,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    make_url,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

KINDS: tuple[str, ...] = ("pairwise", "ranking", "accept_reject")
NAME_MAX = 64
MIGRATIONS = Path(__file__).parent / "migrations"


class FeedbackError(ValueError):
    """A request the store refuses; `status` is the HTTP status the app answers with."""

    status = 422


class NotFound(FeedbackError):
    status = 404


class Forbidden(FeedbackError):
    status = 403


class Conflict(FeedbackError):
    status = 409


META_DEPTH = 16  # nesting levels of lists/dicts allowed in item metadata


def check_text(value: Any, where: str, depth: int = 0) -> None:
    """Refuse what no database or page should hold: NUL bytes, lone surrogates, deep nesting.

    PostgreSQL text cannot hold NUL and neither backend can encode a lone surrogate (a JSON
    "\\ud800" escape); a metadata tree nested hundreds deep breaks the pages that show it.
    Walks strings, dict keys and values and list items; raises FeedbackError (422) naming where.
    """
    if isinstance(value, str):
        if "\x00" in value:
            raise FeedbackError(f"{where} contains a NUL byte (\\u0000 at character {value.index(chr(0))}); "
                                "text may not hold one")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise FeedbackError(f"{where} contains a lone surrogate (U+{ord(value[e.start]):04X} at character "
                                f"{e.start}); send valid UTF-16 pairs or UTF-8") from None
    elif isinstance(value, dict | list):
        if depth >= META_DEPTH:
            raise FeedbackError(f"{where} is nested more than {META_DEPTH} levels deep")
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in pairs:
            if isinstance(key, str):
                check_text(key, f"{where} key {key[:40]!r}", depth)
            check_text(item, f"{where}[{key!r:.40}]", depth + 1)


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_MAX), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    overlap: Mapped[int] = mapped_column(Integer, default=1)  # labels wanted per item (>1 measures agreement)
    instructions: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (Index("ix_items_queue", "project_id", "labels_count"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    prompt: Mapped[str] = mapped_column(Text)
    responses: Mapped[list[str]] = mapped_column(JSON)  # 2 (pairwise), k >= 2 (ranking) or 1 (accept_reject)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # active non-skip labels, what counts towards `overlap`; submit and undo keep it in their transaction
    labels_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Labeller(Base):
    __tablename__ = "labellers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_MAX), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Membership(Base):
    __tablename__ = "memberships"
    __table_args__ = (UniqueConstraint("project_id", "labeller_id", name="uq_membership"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    labeller_id: Mapped[int] = mapped_column(ForeignKey("labellers.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Clip(Base):
    """A media file an item shows instead of text (`feedback/clips.py`): a response "clip:<digest>"."""

    __tablename__ = "clips"
    __table_args__ = (UniqueConstraint("project_id", "digest", name="uq_clip_digest"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of `data`, hex
    media_type: Mapped[str] = mapped_column(String(32))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


ACTIVE = text("retracted_at IS NULL")


class Label(Base):
    __tablename__ = "labels"
    __table_args__ = (
        UniqueConstraint("labeller_id", "submission_id", name="uq_label_submission"),
        Index("uq_label_active", "item_id", "labeller_id", unique=True,
              sqlite_where=ACTIVE, postgresql_where=ACTIVE),
        Index("ix_labels_project", "project_id", "labeller_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    labeller_id: Mapped[int] = mapped_column(ForeignKey("labellers.id", ondelete="CASCADE"))
    submission_id: Mapped[str] = mapped_column(String(64))
    choice: Mapped[str] = mapped_column(String(8))  # a/b/tie, ranked, accept/reject, or skip
    ranking: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)  # response indices, best first
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    retracted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)  # set by undo


# --- opening a database -----------------------------------------------------------------------


def normalize_url(db: str) -> str:
    """A SQLAlchemy URL, or a plain file path (-> SQLite). `postgresql://` uses psycopg 3."""
    if "://" not in db:
        return f"sqlite:///{Path(db).expanduser().resolve()}"
    if db.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + db.split("://", 1)[1]
    return db


def _sqlite_pragmas(engine: Engine) -> None:
    # pysqlite's own BEGIN is deferred: two read-then-write transactions can then deadlock and one
    # fails at once with "database is locked", busy timeout or not. BEGIN IMMEDIATE takes the write
    # lock up front, so concurrent writers queue on the busy timeout instead. SQLAlchemy documents
    # this recipe under "Serializable isolation / Savepoints / Transactional DDL" (pysqlite).
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _create_private(url: str) -> None:
    """Create a new SQLite file readable by its owner only (SQLite gives -wal/-shm the same mode)."""
    path = make_url(url).database
    if path and path != ":memory:" and not path.startswith("file:") and not os.path.exists(path):
        with contextlib.suppress(FileExistsError):  # another process created it meanwhile
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


CONNECTIONS_ENV = "FEEDBACKRL_DB_CONNECTIONS"
DEFAULT_CONNECTIONS = 40  # anyio's default thread count: the most sync requests the app runs at once
POOL_HEADROOM = 10  # connections beyond `connections` for work outside the request threads (e.g. startup)
POOL_TIMEOUT_S = 30


def pool_connections(connections: int | None = None) -> int:
    """The connection pool size: `connections`, else $FEEDBACKRL_DB_CONNECTIONS, else 40."""
    if connections is None:
        raw = os.environ.get(CONNECTIONS_ENV, "").strip()
        if not raw:
            return DEFAULT_CONNECTIONS
        if not raw.isdigit():
            raise FeedbackError(f"{CONNECTIONS_ENV}={raw!r:.40} is not a whole number; set it to 1..1000 "
                                f"(default {DEFAULT_CONNECTIONS})")
        connections = int(raw)
    if not 1 <= connections <= 1000:
        raise FeedbackError(f"database connections must be in 1..1000 (--connections or {CONNECTIONS_ENV}); "
                            f"got {connections}")
    return connections


def make_engine(db: str, connections: int | None = None) -> Engine:
    """Engine for `db` with a pool of `connections` (see `pool_connections`) plus POOL_HEADROOM.

    The app runs each request on one of `connections` threads and a request holds one connection
    while it runs, so no request waits for the pool; `pool_timeout` bounds the wait anyway (the app
    answers 503 past it). `pool_pre_ping` replaces connections the database closed (a restart).
    """
    url = normalize_url(db)
    pool = {"pool_size": pool_connections(connections), "max_overflow": POOL_HEADROOM,
            "pool_timeout": POOL_TIMEOUT_S, "pool_pre_ping": True}
    if url.startswith("sqlite"):
        _create_private(url)
        if make_url(url).database in (None, "", ":memory:"):
            pool = {}  # one in-memory database per connection: SQLAlchemy picks a singleton pool
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)
        _sqlite_pragmas(engine)
        return engine
    return create_engine(url, **pool)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations up to `revision` on `engine`."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def open_db(db: str, migrate: bool = True, connections: int | None = None) -> sessionmaker[Session]:
    """Engine for `db` (URL or SQLite path, a pool of `connections`), migrated to head; returns a session factory."""
    engine = make_engine(db, connections)
    if migrate:
        upgrade(engine)
    return sessionmaker(engine, expire_on_commit=False)


# --- tokens, labellers, projects ---------------------------------------------------------------


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _check_name(name: str, what: str) -> str:
    check_text(name, f"{what} name")
    name = name.strip()
    if not name or len(name) > NAME_MAX:
        raise FeedbackError(f"{what} name must be 1-{NAME_MAX} characters, got {name!r:.80}")
    return name


def create_labeller(s: Session, name: str, is_admin: bool = False) -> tuple[Labeller, str]:
    """A new labeller (or admin) -> (row, token). The token is shown once; only its hash is kept."""
    name = _check_name(name, "labeller")
    if s.scalar(select(Labeller).where(Labeller.name == name)):
        raise Conflict(f"labeller {name!r} already exists (rotate their token with rotate_token)")
    token = new_token()
    labeller = Labeller(name=name, token_hash=hash_token(token), is_admin=is_admin)
    s.add(labeller)
    s.flush()
    return labeller, token


def rotate_token(s: Session, name: str) -> str:
    labeller = get_labeller(s, name)
    token = new_token()
    labeller.token_hash = hash_token(token)
    return token


def revoke_labeller(s: Session, name: str) -> Labeller:
    """Lock a labeller out: their token stops working (replaced by one nobody holds), their admin
    right and project memberships go. Their labels stay. Undo with `rotate_token` and new invitations."""
    labeller = get_labeller(s, name)
    labeller.token_hash = hash_token(new_token())
    labeller.is_admin = False
    s.execute(delete(Membership).where(Membership.labeller_id == labeller.id))
    return labeller


def get_labeller(s: Session, name: str) -> Labeller:
    labeller = s.scalar(select(Labeller).where(Labeller.name == name))
    if labeller is None:
        raise NotFound(f"no labeller named {name!r}")
    return labeller


def authenticate(s: Session, token: str) -> Labeller | None:
    if not token:
        return None
    return s.scalar(select(Labeller).where(Labeller.token_hash == hash_token(token)))


def create_project(s: Session, name: str, kind: str, overlap: int = 1, instructions: str = "") -> Project:
    name = _check_name(name, "project")
    check_text(instructions, "instructions")
    if kind not in KINDS:
        raise FeedbackError(f"project kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if not 1 <= overlap <= 100:
        raise FeedbackError(f"overlap (labels wanted per item) must be in 1..100; got {overlap}")
    if s.scalar(select(Project).where(Project.name == name)):
        raise Conflict(f"project {name!r} already exists")
    project = Project(name=name, kind=kind, overlap=overlap, instructions=instructions)
    s.add(project)
    s.flush()
    return project


def get_project(s: Session, name: str) -> Project:
    project = s.scalar(select(Project).where(Project.name == name))
    if project is None:
        names = s.scalars(select(Project.name).order_by(Project.name)).all()
        raise NotFound(f"no project named {name!r}; projects: {', '.join(names) or 'none yet'}")
    return project


def add_member(s: Session, project: Project, labeller: Labeller) -> bool:
    """Give `labeller` access to `project`; False if they already had it."""
    exists = s.scalar(select(Membership).where(Membership.project_id == project.id,
                                               Membership.labeller_id == labeller.id))
    if exists:
        return False
    s.add(Membership(project_id=project.id, labeller_id=labeller.id))
    s.flush()
    return True


def visible_projects(s: Session, who: Labeller) -> list[Project]:
    query = select(Project).order_by(Project.id)
    if not who.is_admin:
        query = query.join(Membership, Membership.project_id == Project.id).where(Membership.labeller_id == who.id)
    return list(s.scalars(query))


def project_for(s: Session, who: Labeller, project_id: int) -> Project:
    """The project if `who` may see it. Others get the same 404 as a missing one (no probing)."""
    project = s.get(Project, project_id)
    allowed = project is not None and (who.is_admin or s.scalar(
        select(Membership.id).where(Membership.project_id == project_id, Membership.labeller_id == who.id)))
    if not allowed:
        raise NotFound(f"project {project_id} not found, or not shared with {who.name!r}")
    return project
