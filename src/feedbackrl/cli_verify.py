"""`feedbackrl verify ...`: try a reward source by hand; prints one JSON verdict on stdout."""

from __future__ import annotations

import typer

verify_app = typer.Typer(help="Try a reward source by hand; prints one JSON verdict.", no_args_is_help=True)
