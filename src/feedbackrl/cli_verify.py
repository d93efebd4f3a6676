"""`feedbackrl verify ...`: try a reward source by hand; prints one JSON verdict on stdout."""

from __future__ import annotations

from pathlib import Path

import typer

from feedbackrl.cli_errors import ReportsUserErrors, UserInputError, read_json, read_text

verify_app = typer.Typer(help="Try a reward source by hand; prints one JSON verdict.", no_args_is_help=True,
                         cls=ReportsUserErrors)


# Reward modules are imported inside each command: `feedbackrl --help` stays fast, and a command
# only pays for its own dependencies (math pulls in SymPy).


@verify_app.command("math")
def verify_math(
    response: str = typer.Option(..., help="The model's completion, e.g. 'so \\boxed{1/2}'."),
    answer: str = typer.Option(..., help="The gold answer, e.g. '\\frac{1}{2}'."),
    timeout_s: float = typer.Option(3.0, help="Time bound on parsing and comparing, in seconds."),
) -> None:
    """Extract the final answer from RESPONSE and check it against the gold ANSWER."""
    from feedbackrl.rewards.math import MathVerifier
    from feedbackrl.rewards.verdict import Problem

    typer.echo(MathVerifier(timeout_s=timeout_s)(Problem(prompt="", answer=answer), response).to_json())


@verify_app.command("constraints")
def verify_constraints(
    response: str = typer.Option(..., help="The model's completion."),
    constraints: Path = typer.Option(..., help='JSON file with a list of specs: [{"id": "no_commas"}, ...].'),
) -> None:
    """Check RESPONSE against instruction-following constraints; score = fraction satisfied."""
    from feedbackrl.rewards.instructions import ConstraintError, ConstraintsVerifier
    from feedbackrl.rewards.verdict import Problem

    specs = read_json(constraints, "bad constraints file")
    try:
        verifier = ConstraintsVerifier.from_specs(specs)
    except ConstraintError as e:
        raise UserInputError(f"bad constraints file {str(constraints)!r}: {e}") from None
    typer.echo(verifier(Problem(prompt="", answer=specs), response).to_json())


@verify_app.command("code")
def verify_code(
    program: Path = typer.Option(..., help="Python file to run (a ```python block in it is extracted)."),
    tests: Path = typer.Option(..., help='JSON tests: {"io": [{"input", "output"}, ...], "asserts": [...]}.'),
    timeout: float = typer.Option(2.0, min=0.05, help="Wall-clock seconds per test."),
) -> None:
    """Run PROGRAM against TESTS in the code sandbox; score = fraction of tests passed."""
    from feedbackrl.rewards.code import BadTests, CodeVerifier, parse_tests
    from feedbackrl.rewards.verdict import Problem

    source, spec = read_text(program, "program"), read_json(tests, "tests file")
    try:
        parse_tests(spec)
    except BadTests as e:
        raise UserInputError(f"bad tests file {str(tests)!r}: {e}") from None
    verifier = CodeVerifier(timeout_s=timeout)
    typer.echo(verifier(Problem(prompt="", answer=spec), source).to_json())
