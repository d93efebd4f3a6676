"""`feedbackrl label ...`: serve the labelling app and manage its database.

These commands open the database directly (whoever holds the database URL is the operator); the
web app's admin token grants the same powers over HTTP. Every command migrates the database to
the latest schema first, so the first command on a new SQLite file creates it.

The feedback modules (FastAPI, SQLAlchemy) are imported inside each command: they need the
`feedback` extra, and `feedbackrl --help` must not pay for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from feedbackrl.cli_errors import ReportsUserErrors, fail

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

label_app = typer.Typer(help="Human feedback: labelling web app, projects, import, fill, export.",
                        no_args_is_help=True, cls=ReportsUserErrors)

DbOption = Annotated[str, typer.Option("--db", envvar="FEEDBACKRL_DB",
                                       help="SQLAlchemy URL (postgresql://user@host/db) or SQLite file path")]
DEFAULT_DB = "feedback.db"


@contextmanager
def _session(db: str) -> Iterator[Session]:
    try:
        from sqlalchemy.exc import OperationalError

        from feedbackrl.feedback.store import FeedbackError, open_db
    except ImportError as e:
        fail(f"{e.name} is missing: install the feedback extra, pip install -e '.[feedback]'")
    try:
        with open_db(db)() as s:
            yield s
    except FeedbackError as e:
        fail(str(e))
    except OperationalError as e:
        fail(f"cannot use database {db!r}: {e.orig}")


@label_app.command()
def serve(db: DbOption = DEFAULT_DB,
          host: Annotated[str, typer.Option(help="interface to bind; 0.0.0.0 exposes it to the network")] = "127.0.0.1",
          port: Annotated[int, typer.Option(help="TCP port")] = 8000,
          connections: Annotated[int, typer.Option(
              envvar="FEEDBACKRL_DB_CONNECTIONS", min=1, max=1000,
              help="database connections in the pool, and requests handled at once (one thread each); "
                   "the pool may open 10 more")] = 40) -> None:
    """Run the labelling web app (migrates the database first)."""
    import uvicorn

    from feedbackrl.feedback.app import create_app

    typer.echo(f"labelling app on http://{host}:{port}/ (database {db}, {connections} connections)")
    uvicorn.run(create_app(db, connections=connections), host=host, port=port, log_level="warning")


@label_app.command("admin-token")
def admin_token(db: DbOption = DEFAULT_DB,
                name: Annotated[str, typer.Option(help="admin account name")] = "admin",
                rotate: Annotated[bool, typer.Option(help="replace the token of an existing admin")] = False) -> None:
    """Create an admin account and print its token (shown once; only its hash is stored)."""
    from feedbackrl.feedback.store import create_labeller, get_labeller, rotate_token

    with _session(db) as s:
        if rotate:
            if not get_labeller(s, name).is_admin:
                fail(f"{name!r} is a labeller, not an admin")
            token = rotate_token(s, name)
        else:
            token = create_labeller(s, name, is_admin=True)[1]
        s.commit()
    typer.echo(token)


@label_app.command()
def revoke(labeller: Annotated[str, typer.Argument(help="labeller name")], db: DbOption = DEFAULT_DB) -> None:
    """Lock a labeller out: their token stops working, admin right and invitations go; labels stay."""
    from feedbackrl.feedback.store import revoke_labeller

    with _session(db) as s:
        revoke_labeller(s, labeller)
        s.commit()
    typer.echo(f"{labeller!r} is revoked: their token no longer works (`label invite --new-token` to restore)")


@label_app.command("create-project")
def create_project_cmd(
        name: Annotated[str, typer.Argument(help="unique project name")],
        kind: Annotated[str, typer.Option(help="pairwise, ranking or accept_reject")] = "pairwise",
        overlap: Annotated[int, typer.Option(help="labels wanted per item (2+ measures agreement)")] = 1,
        instructions: Annotated[str, typer.Option(help="shown to labellers above each item")] = "",
        db: DbOption = DEFAULT_DB) -> None:
    """Create a project."""
    from feedbackrl.feedback.store import create_project

    with _session(db) as s:
        project = create_project(s, name, kind, overlap, instructions)
        s.commit()
        typer.echo(f"project {project.name!r} (id {project.id}, {project.kind}, overlap {project.overlap})")


@label_app.command()
def invite(project: Annotated[str, typer.Argument(help="project name")],
           labeller: Annotated[str, typer.Argument(help="labeller name (created if new)")],
           new_token: Annotated[bool, typer.Option(help="replace an existing labeller's token")] = False,
           db: DbOption = DEFAULT_DB) -> None:
    """Give a labeller access to a project; prints their token when they are new (or --new-token)."""
    from feedbackrl.feedback.store import NotFound, add_member, create_labeller, get_labeller, get_project
    from feedbackrl.feedback.store import rotate_token as rotate

    with _session(db) as s:
        p = get_project(s, project)
        try:
            who, token = get_labeller(s, labeller), None
            if new_token:
                token = rotate(s, labeller)
        except NotFound:
            who, token = create_labeller(s, labeller)
        add_member(s, p, who)
        s.commit()
    typer.echo(token if token else f"{labeller!r} can now label {project!r} (their existing token still works)")


@label_app.command("import")
def import_(project: Annotated[str, typer.Argument(help="project name")],
            file: Annotated[Path, typer.Argument(help='JSONL: {"prompt": ..., "responses": [...]} per line')],
            db: DbOption = DEFAULT_DB) -> None:
    """Add items from a JSONL file (all rows or none)."""
    from feedbackrl.data.rows import read_jsonl
    from feedbackrl.feedback.items import add_items
    from feedbackrl.feedback.store import FeedbackError, get_project

    if not file.is_file():
        fail(f"no such file: {file}")
    rows = read_jsonl(file)
    with _session(db) as s:
        p = get_project(s, project)
        try:
            ids = add_items(s, p, rows)
        except FeedbackError as e:
            raise FeedbackError(f"{file}: {e}") from None
    typer.echo(f"imported {len(ids)} item(s) into {project!r}")


@label_app.command()
def fill(project: Annotated[str, typer.Argument(help="project name")],
         model: Annotated[str, typer.Option(help="policy checkpoint or model directory")],
         prompts: Annotated[Path, typer.Option(help="prompts: .jsonl with a 'prompt' field, or one per line")],
         samples: Annotated[int, typer.Option(help="completions per prompt (K)", min=1, max=64)] = 2,
         max_new_tokens: Annotated[int, typer.Option(help="tokens per completion", min=1)] = 64,
         temperature: Annotated[float, typer.Option(help="sampling temperature", min=0.01)] = 1.0,
         seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
         db: DbOption = DEFAULT_DB) -> None:
    """Sample K completions per prompt from a checkpoint and add them as items.

    pairwise: K//2 disjoint pairs per prompt; ranking: one item of the distinct samples;
    accept_reject: one item per sample. Identical samples are dropped.
    """
    from feedbackrl.feedback.items import add_items, read_prompts, sample_items
    from feedbackrl.feedback.store import get_project
    from feedbackrl.models.load import ModelLoadError

    if not prompts.is_file():
        fail(f"no such file: {prompts}")
    with _session(db) as s:
        p = get_project(s, project)
        kind = p.kind
        s.commit()  # release the database while the model samples
        try:
            rows = sample_items(model, read_prompts(prompts), samples, kind, max_new_tokens, temperature, seed)
        except ModelLoadError as e:
            fail(str(e))
        ids = add_items(s, p, rows)
    typer.echo(f"added {len(ids)} item(s) to {project!r} from {model}")


@label_app.command()
def export(project: Annotated[str, typer.Argument(help="project name")],
           out: Annotated[Path, typer.Option(help="output JSONL file")],
           format: Annotated[str, typer.Option(help="pairs, rankings or labels (raw)")] = "pairs",
           db: DbOption = DEFAULT_DB) -> None:
    """Write the project's labels as a preference dataset (see feedbackrl.data.preferences)."""
    from feedbackrl.data.rows import write_jsonl
    from feedbackrl.feedback.export import FORMATS, export_rows
    from feedbackrl.feedback.store import get_project

    if format not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}; got {format!r}")
    with _session(db) as s:
        rows = export_rows(s, get_project(s, project), format)  # type: ignore[arg-type]
    write_jsonl(rows, out)
    typer.echo(f"wrote {len(rows)} {format} row(s) to {out}")
