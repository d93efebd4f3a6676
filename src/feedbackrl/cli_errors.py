"""How every `feedbackrl` command reports bad input: `error: <message>` on stderr, exit status 2.

Each command group is a `ReportsUserErrors` group (`typer.Typer(cls=ReportsUserErrors)`): an
exception of a `user_errors()` class that leaves a command becomes that one message, never a
traceback. The modules that read user input raise those classes with the file, field or value and
the fix in the message; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import click
import typer
from typer.core import TyperGroup


class UserInputError(ValueError):
    """Bad input read by a command itself (a JSON file of specs, tests ...), the message naming it."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception classes that mean bad input or a missing package, not a bug (imported when one is raised:
    `feedbackrl --help` does not pay for torch)."""
    from feedbackrl.config import ConfigError
    from feedbackrl.data.rows import DatasetError
    from feedbackrl.models.chat import ChatTemplateError
    from feedbackrl.models.gguf import GGUFError
    from feedbackrl.models.load import ModelLoadError
    from feedbackrl.models.lora import LoRAError
    from feedbackrl.models.policy import PrecisionError
    from feedbackrl.rewards.code import BadTests
    from feedbackrl.rewards.instructions import ConstraintError
    from feedbackrl.rewards.python_fn import RewardFunctionError
    from feedbackrl.rewards.sandbox import SandboxUnavailable
    from feedbackrl.train.checkpoint import CheckpointError
    from feedbackrl.train.sft import SFTUnavailable

    # the OSErrors a path given on the command line raises: their message names the path
    return (UserInputError, ConfigError, DatasetError, ModelLoadError, CheckpointError, SFTUnavailable, GGUFError,
            LoRAError, ChatTemplateError, PrecisionError, BadTests, ConstraintError, SandboxUnavailable,
            RewardFunctionError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of a file given on the command line; a UserInputError naming it (and `what` it is) if it
    cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserInputError(f"{what} {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise UserInputError(f"{what} {str(path)!r} cannot be read: {e.strerror or e}") from None


def read_json(path: Path, what: str) -> Any:
    """The JSON value in a file given on the command line; a UserInputError naming it if it is not JSON."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserInputError(f"{what} {str(path)!r} is not valid JSON (line {e.lineno} column {e.colno}: "
                             f"{e.msg})") from None
    except RecursionError:  # json recurses once per nesting level
        raise UserInputError(f"{what} {str(path)!r} nests too deeply to be read") from None


def fail(msg: str) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


class ReportsUserErrors(TyperGroup):
    """A command group whose commands report `user_errors()` as one `error: ...` line and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except Exception as e:
            if isinstance(e, user_errors()):
                fail(str(e))
            raise
