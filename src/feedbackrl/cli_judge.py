"""`feedbackrl judge quality`: measure a judge on held-out reversal pairs before rewarding with it."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from feedbackrl.cli_errors import ReportsUserErrors

judge_app = typer.Typer(help="LLM judges: measure them before training on them.", no_args_is_help=True,
                        cls=ReportsUserErrors)

CRITERION = "the response is the task's word written backwards, letter for letter"


@judge_app.command()
def quality(base_url: Annotated[str, typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1; "
                                                       "'scripted' serves a rule-backed judge on loopback")] = "",
            local_model: Annotated[str, typer.Option(help="instead of an endpoint: a local model as the judge (a "
                                                          "model dir, .gguf file or 'smollm2'), greedy")] = "",
            max_new_tokens: Annotated[int, typer.Option(help="local model only: tokens per judge reply")] = 64,
            model: Annotated[str, typer.Option(help="model name the endpoint serves")] = "judge",
            pairs: Annotated[int, typer.Option(help="held-out reversal pairs")] = 200,
            noise: Annotated[float, typer.Option(help="scripted judge only: P(random answer)")] = 0.0,
            position_bias: Annotated[float, typer.Option(help="scripted judge only: P(says A regardless)")] = 0.0,
            timeout: Annotated[float, typer.Option(help="seconds per request")] = 30.0) -> None:
    """Agreement with the gold check, position-bias rate and self-consistency, as JSON."""
    from contextlib import nullcontext

    from feedbackrl.envs.procedural.reverse import ReverseTask
    from feedbackrl.rewards.judge import Criterion, PairwiseJudge, PointwiseJudge, Rubric
    from feedbackrl.rewards.judge_backends import CachedChat, HFChat, OpenAIChat
    from feedbackrl.rewards.judge_quality import judge_quality, reversal_pairs

    if bool(base_url) == bool(local_model):
        raise typer.BadParameter("give exactly one of --base-url (an endpoint) and --local-model (a local model), "
                                 f"got base_url={base_url!r}, local_model={local_model!r}")
    task = ReverseTask()
    server = nullcontext(None)
    if base_url == "scripted":
        from feedbackrl.feedback.judge_server import RuleJudge, chat_app
        from feedbackrl.feedback.server import LiveServer

        rule = RuleJudge(lambda t, r: float(r == t.removesuffix("=")[::-1]), ("reversed",), noise=noise,
                         position_bias=position_bias)
        server = LiveServer(chat_app(rule))
    with server as live:
        url = live.url + "/v1" if live is not None else base_url
        backend = HFChat(local_model, max_new_tokens) if local_model else OpenAIChat(model, base_url=url,
                                                                                   timeout=timeout)
        chat = CachedChat(backend)
        rubric = Rubric((Criterion("reversed", 1.0, CRITERION),), task="Judge the answer to a word-reversal task.")
        result = judge_quality(PairwiseJudge(chat, CRITERION), PointwiseJudge(chat, rubric),
                               reversal_pairs(task.heldout(pairs)), lambda p, c: task.verify(p, c).score)
        result["judge_tokens"] = chat.stats.prompt_tokens + chat.stats.completion_tokens
    where = {"local_model": local_model} if local_model else {"endpoint": base_url, "model": model}
    typer.echo(json.dumps({**where, **result}, indent=2))
