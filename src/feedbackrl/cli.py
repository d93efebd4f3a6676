"""The `feedbackrl` command: demo, train, eval, serve, verify, config, tasks, monitor, release, redteam, label,
judge."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from feedbackrl.cli_errors import ReportsUserErrors, fail, user_errors
from feedbackrl.cli_judge import judge_app
from feedbackrl.cli_label import label_app
from feedbackrl.cli_verify import verify_app

app = typer.Typer(help="RL post-training from verifiable rewards and human feedback.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=ReportsUserErrors)
app.add_typer(verify_app, name="verify")
app.add_typer(label_app, name="label")
app.add_typer(judge_app, name="judge")

DEMO_RECIPE = "reverse_grpo.toml"


def _run(recipe: Path | None, overrides: list[str], out: Path, resume: Path | None) -> None:
    from feedbackrl.config import load_config
    from feedbackrl.train.run import run

    run(load_config(recipe, overrides), out, resume=resume)


def demo_recipe_path() -> Path:
    return Path(str(resources.files("feedbackrl") / "recipes" / DEMO_RECIPE))


@app.command()
def demo(out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/demo"),
         set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. algo.steps=50")] = None) -> None:
    """Build a tiny model, SFT it on noisy demos, GRPO it against the truthful verifier, report."""
    _run(demo_recipe_path(), set_ or [], out, None)


@app.command()
def train(recipe: Annotated[Path, typer.Argument(help="recipe TOML file")],
          out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/train"),
          set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. algo.lr=1e-4")] = None,
          resume: Annotated[Path | None, typer.Option(help="checkpoint dir or run dir to continue")] = None) -> None:
    """Run any recipe."""
    _run(recipe, set_ or [], out, resume)


@app.command("eval")
def eval_(model: Annotated[str, typer.Argument(help="model dir, checkpoint dir or hub id")],
          recipe: Annotated[Path | None, typer.Option(help="recipe whose task and eval sections to use")] = None,
          set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. task.name=addition")] = None,
          out: Annotated[Path | None, typer.Option(help="write the result JSON here")] = None,
          video: Annotated[Path | None, typer.Option(help="control runs: a clip of the first held-out episode "
                                                     "(.gif or .mp4)")] = None,
          max_steps: Annotated[int, typer.Option(min=1, help="control runs: the clip's episode is cut here")] = 500,
          ) -> None:
    """Evaluate a checkpoint on a task's held-out problems (greedy pass@1 and pass@k); a control run (its dir or
    a checkpoint) on its greedy held-out episodes, with --video a clip of one."""
    from feedbackrl.train.run import control_checkpoint, eval_control

    ckpt = control_checkpoint(model)
    if ckpt is not None:
        if recipe is not None or set_:
            fail("a control checkpoint is evaluated with the config it was trained with: drop --recipe and --set")
        result = eval_control(ckpt, video, max_steps)
    elif video is not None:
        fail(f"--video records a control policy; {model} is not a control run or checkpoint")
    else:
        from feedbackrl.config import load_config
        from feedbackrl.envs.registry import make_task
        from feedbackrl.models.load import load_policy, load_tokenizer
        from feedbackrl.train.run import model_task, run_eval, set_threads

        cfg = load_config(recipe, set_ or [])
        set_threads(cfg.train.threads)
        policy, tokenizer = load_policy(model), load_tokenizer(model)
        result = run_eval(policy, tokenizer, model_task(cfg, make_task(cfg.task), tokenizer), cfg).to_dict()
    text = json.dumps(result, indent=2)
    if out:
        out.write_text(text)
    typer.echo(text)


@app.command()
def config(recipe: Annotated[Path | None, typer.Argument(help="recipe TOML (defaults if omitted)")] = None,
           set_: Annotated[list[str] | None, typer.Option("--set")] = None) -> None:
    """Print the resolved configuration (all keys, with defaults filled in)."""
    from feedbackrl.config import load_config

    typer.echo(load_config(recipe, set_ or []).model_dump_json(indent=2))


def _options(fn: object) -> str:
    """A factory's options as 'name=default' (keyword-only ones for reward sources, all for tasks)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(fn):
        fields = [f for f in dataclasses.fields(fn) if f.init and f.name != "name"]
        return ", ".join(f.name if f.default is dataclasses.MISSING else f"{f.name}={f.default!r}" for f in fields)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("ctx", "name")]
    return ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)


@app.command()
def tasks() -> None:
    """List the tasks, reward sources and algorithms a recipe can name, with their options; installed packages'
    tasks and reward sources (entry point groups feedbackrl.tasks and feedbackrl.rewards) too."""
    import inspect

    from feedbackrl.config import ALGO_CONFIGS, ConfigError
    from feedbackrl.envs.registry import TASKS, installed_tasks, task_factory
    from feedbackrl.rewards.registry import REWARDS, installed_sources, load_installed

    def first_line(e: Exception) -> str:
        return str(e).splitlines()[0]

    typer.echo("tasks ([task] name = ..., options in [task.options]; or 'package.module:Class'):")
    for name, factory in TASKS.items():
        doc = (inspect.getdoc(factory) or "").split("\n")[0]
        typer.echo(f"  {name}: {doc}\n      options: {_options(factory) or 'none'}")
    for name, value in installed_tasks().items():
        try:
            factory = task_factory(name)
        except ConfigError as e:
            typer.echo(f"  {name}: installed ({value}), cannot be loaded: {first_line(e)}")
            continue
        doc = (inspect.getdoc(factory) or "").split("\n")[0]
        typer.echo(f"  {name}: installed ({value}): {doc}\n      options: {_options(factory) or 'none'}")
    typer.echo("\nreward sources ([reward] source = ..., with its options):")
    for name, value in installed_sources().items():
        try:
            load_installed(name)
        except ConfigError as e:
            typer.echo(f"  {name}: installed ({value}), cannot be loaded: {first_line(e)}")
    for name, src in REWARDS.items():
        typer.echo(f"  {name}: {src.summary}\n      options: {_options(src.build) or 'none'}")
    typer.echo("\nalgorithms ([algo] name = ...):")
    for cfg in ALGO_CONFIGS:
        fields = {k: f for k, f in cfg.model_fields.items() if k != "name"}
        typer.echo(f"  {cfg.model_fields['name'].default}: " + "; ".join(
            f"{k}={f.default!r} ({f.description})" for k, f in fields.items()))


@app.command()
def serve(model: Annotated[str, typer.Argument(help="model dir, checkpoint dir (checkpoints/step_N), or 'tiny' "
                                                    "for a freshly built tiny model")],
          port: Annotated[int, typer.Option(help="TCP port; 0 = any free port")] = 8765,
          name: Annotated[str, typer.Option(help="the model name /v1/models lists and clients send")] = "policy",
          host: Annotated[str, typer.Option(help="interface to bind; anything but loopback exposes the policy, "
                                                 "unauthenticated, to the network")] = "127.0.0.1") -> None:
    """Serve a policy as an OpenAI-compatible endpoint: /v1/chat/completions (streamed or not), /v1/models and
    /inference/v1/generate (token ids in, token ids and log-probs out). Needs the feedback extra."""
    import tempfile

    try:
        from feedbackrl.serve import server
        from feedbackrl.serve.openai_api import create_app
    except ImportError as e:
        fail(f"feedbackrl serve needs FastAPI and uvicorn: pip install 'feedbackrl[feedback]' ({e})")
    from transformers.utils import logging as hf_logging

    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.models.tiny import make_tiny

    hf_logging.disable_progress_bar()
    try:
        sock = server.bind(host, port)
    except server.ServeError as e:
        fail(str(e))
    try:
        path = str(make_tiny(tempfile.mkdtemp(prefix="feedbackrl-tiny-"))) if model == "tiny" else model
        policy, tokenizer = load_policy(path), load_tokenizer(path)
    except user_errors() as e:
        sock.close()
        fail(str(e))
    if host not in server.LOOPBACK:
        typer.echo(f"warning: serving on {host}, beyond this machine, with no authentication", err=True)
    typer.echo(f"serving {model} as {name!r} on {server.url(sock)}/v1 (OpenAI-compatible; Ctrl-C stops)", err=True)
    server.serve(create_app(policy.eval(), tokenizer, name), sock)


@app.command()
def monitor(run_dir: Annotated[Path, typer.Argument(help="a finished (or running) run's output directory")],
            as_json: Annotated[bool, typer.Option("--json", help="one alert per line as JSON")] = False) -> None:
    """Replay a run's metrics.jsonl and samples.jsonl through the reward-hacking and health detectors."""
    from feedbackrl.monitors.replay import replay

    alerts = replay(run_dir)
    for a in alerts:
        if as_json:
            typer.echo(json.dumps(a.to_dict()))
            continue
        typer.echo(f"step {a.step:>5}  {a.detector:<22} {a.kind:<8} {a.statistic:.3f} (threshold {a.threshold:g})  "
                   f"{a.message}")
        for ex in a.examples:
            typer.echo(f"{'':>13}e.g. {ex[:100]!r}")
    if not as_json:
        typer.echo(f"{len(alerts)} alert(s) in {run_dir}")


@app.command()
def release(run_dir: Annotated[Path, typer.Argument(help="the run's output directory; its report.json gets 'release'")],
            threshold: Annotated[float, typer.Option(help="release only if the mean cost's upper bound is under this")],
            delta: Annotated[float, typer.Option(help="the bound holds with probability 1 - delta, in (0, 0.5]")] = 0.1,
            costs: Annotated[Path | None, typer.Option(help="JSONL, one {\"cost\": x} per held-out completion "
                                                             "(default RUN_DIR/safety_eval.jsonl)")] = None) -> None:
    """High-confidence release test (HC-RLHF): exit 0 if released, 1 if refused, 2 on bad input."""
    from feedbackrl.data.rows import DatasetError
    from feedbackrl.train.release import ReleaseError, release_run

    try:
        decision, safety = release_run(run_dir, threshold=threshold, delta=delta, costs=costs)
    except (ReleaseError, DatasetError) as e:
        fail(str(e))
    typer.echo(decision.reason)
    for scenario, r in safety.get("violation_rates", {}).get("by_scenario", {}).items():
        typer.echo(f"  {scenario}: violation rate {r['rate']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (n {r['n']})")
    for name, r in safety.get("refusals", {}).items():
        if r:
            typer.echo(f"  {name.replace('_', ' ')}: {r['rate']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (n {r['n']})")
    raise typer.Exit(0 if decision.released else 1)


@app.command()
def redteam(model: Annotated[str, typer.Argument(help="run dir (its latest checkpoint, else sft_policy), checkpoint "
                                                    "or model dir")],
            recipe: Annotated[Path, typer.Option(help="recipe with the secret task (and its [cost]; default "
                                                      "secret_leak)")],
            out: Annotated[Path, typer.Option(help="JSONL of the requests found; load it with task.options.extra")],
            rounds: Annotated[int, typer.Option(help="mutation rounds", min=0)] = 6,
            population: Annotated[int, typer.Option(help="parents kept each round (the best so far)", min=1)] = 8,
            children: Annotated[int, typer.Option(help="new candidates scored each round", min=1)] = 24,
            trials: Annotated[int, typer.Option(help="sampled completions per candidate, each a fresh code word",
                                                min=1)] = 8,
            keep_at: Annotated[float, typer.Option(help="keep candidates whose violation rate reaches this",
                                                   min=0.001, max=1.0)] = 0.5,
            limit: Annotated[int | None, typer.Option(help="write at most this many (best first)", min=1)] = None,
            seed: Annotated[int, typer.Option(help="seeds the search and the sampling")] = 0,
            set_: Annotated[list[str] | None, typer.Option("--set", help="override a recipe key")] = None) -> None:
    """Red-team a policy: search for extraction prompts that make it leak the secret; write them as a scenario."""
    from feedbackrl.redteam import red_team_model

    result = red_team_model(model, recipe, out, set_ or [], seed=seed, rounds=rounds, population=population,
                            children=children, trials=trials, keep_at=keep_at, limit=limit)
    summary = result.to_dict()
    written = len(result.found[:limit])
    typer.echo(f"{summary['found']} request(s) at violation rate >= {keep_at} among {summary['evaluated']} scored "
               f"(best {summary['found_best_rate']:.2f}; the task's own templates' best "
               f"{summary['seed_best_rate']:.2f}); {written} written to {out}")


if __name__ == "__main__":  # `python -m feedbackrl.cli`, e.g. under `torchrun -m`
    app()
