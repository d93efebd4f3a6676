"""`feedbackrl judge quality`: measure a judge on held-out gold-checkable pairs before rewarding with it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from feedbackrl.cli_errors import ReportsUserErrors

judge_app = typer.Typer(help="LLM judges: measure them before training on them.", no_args_is_help=True,
                        cls=ReportsUserErrors)

CRITERION = "the response is the task's word written backwards, letter for letter"


@dataclass(frozen=True)
class GoldTask:
    """Held-out pairs the gold check separates, and what the judge is told about them."""

    name: str  # the rubric criterion's name
    criterion: str
    description: str  # the rubric's task line
    answer: Callable[[str], str]  # the gold answer from the question the judge is shown ("abc", "12+34")
    build: Callable[[int], tuple[Any, list[Any]]]  # n -> (the task, whose verify is gold; n held-out pairs)


def _reversal_pairs(n: int) -> tuple[Any, list[Any]]:
    from feedbackrl.envs.procedural.reverse import ReverseTask
    from feedbackrl.rewards.judge_quality import reversal_pairs

    task = ReverseTask()
    return task, reversal_pairs(task.heldout(n))


def _addition_pairs(n: int) -> tuple[Any, list[Any]]:
    from feedbackrl.envs.procedural.addition import AdditionTask, wrong_sum
    from feedbackrl.rewards.judge_quality import gold_pairs

    task = AdditionTask(digits=2)
    return task, gold_pairs(task.heldout(n), wrong_sum)


TASKS = {
    "reverse": GoldTask("reversed", CRITERION, "Judge the answer to a word-reversal task.", lambda q: q[::-1],
                        _reversal_pairs),
    "addition": GoldTask("correct", "the response is the correct sum of the two numbers in the task",
                         "Judge the answer to an addition problem.",
                         lambda q: str(sum(int(x) for x in q.split("+"))), _addition_pairs),
}


@judge_app.command()
def quality(base_url: Annotated[str, typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1; "
                                                       "'scripted' serves a rule-backed judge on loopback")] = "",
            local_model: Annotated[str, typer.Option(help="instead of an endpoint: a local model as the judge (a "
                                                          "model dir, .gguf file or 'smollm2'), greedy")] = "",
            max_new_tokens: Annotated[int, typer.Option(help="local model only: tokens per judge reply")] = 64,
            scoring: Annotated[str, typer.Option(help="local model only: 'generate' (the judge writes a JSON "
                                                      "verdict) or 'logprob' (log-probs of Yes/No and A/B, "
                                                      "no text generated)")] = "generate",
            task: Annotated[str, typer.Option(help="the gold-checked pairs: 'reverse' (word reversals) or "
                                                   "'addition' (two-digit sums, right vs wrong)")] = "reverse",
            reference: Annotated[bool, typer.Option(help="show the judge the gold answer (reference-guided "
                                                         "judging)")] = False,
            model: Annotated[str, typer.Option(help="model name the endpoint serves")] = "judge",
            pairs: Annotated[int, typer.Option(help="held-out pairs")] = 200,
            noise: Annotated[float, typer.Option(help="scripted judge only: P(random answer)")] = 0.0,
            position_bias: Annotated[float, typer.Option(help="scripted judge only: P(says A regardless)")] = 0.0,
            timeout: Annotated[float, typer.Option(help="seconds per request")] = 30.0) -> None:
    """Agreement with the gold check, position-bias rate and self-consistency, as JSON."""
    from contextlib import nullcontext

    from feedbackrl.rewards.judge import (
        Criterion,
        LogprobPairwiseJudge,
        LogprobPointwiseJudge,
        PairwiseJudge,
        PointwiseJudge,
        Rubric,
    )
    from feedbackrl.rewards.judge_backends import CachedChat, HFChat, HFChoiceLogprobs, OpenAIChat
    from feedbackrl.rewards.judge_quality import judge_quality

    if bool(base_url) == bool(local_model):
        raise typer.BadParameter("give exactly one of --base-url (an endpoint) and --local-model (a local model), "
                                 f"got base_url={base_url!r}, local_model={local_model!r}")
    if scoring not in ("generate", "logprob"):
        raise typer.BadParameter(f"--scoring must be 'generate' or 'logprob', got {scoring!r}")
    if scoring == "logprob" and not local_model:
        raise typer.BadParameter("--scoring logprob needs --local-model (it reads a local model's log-probs)")
    if task not in TASKS:
        raise typer.BadParameter(f"--task must be one of {sorted(TASKS)}, got {task!r}")
    spec = TASKS[task]
    env, pair_set = spec.build(pairs)

    def gold(p, c):
        return env.verify(p, c).score

    if scoring == "logprob":
        scorer = HFChoiceLogprobs(local_model)
        result = judge_quality(LogprobPairwiseJudge(scorer, spec.criterion, reference=reference),
                               LogprobPointwiseJudge(scorer, spec.criterion, task=spec.description,
                                                     reference=reference), pair_set, gold)
    else:
        server = nullcontext(None)
        if base_url == "scripted":
            from feedbackrl.feedback.judge_server import RuleJudge, chat_app
            from feedbackrl.feedback.server import LiveServer

            rule = RuleJudge(lambda t, r: float(r == spec.answer(t.removesuffix("="))), (spec.name,), noise=noise,
                             position_bias=position_bias)
            server = LiveServer(chat_app(rule))
        with server as live:
            url = live.url + "/v1" if live is not None else base_url
            backend = HFChat(local_model, max_new_tokens) if local_model else OpenAIChat(model, base_url=url,
                                                                                       timeout=timeout)
            chat = CachedChat(backend)
            rubric = Rubric((Criterion(spec.name, 1.0, spec.criterion),), task=spec.description)
            result = judge_quality(PairwiseJudge(chat, spec.criterion, reference=reference),
                                   PointwiseJudge(chat, rubric, reference=reference), pair_set, gold)
            result["judge_tokens"] = chat.stats.prompt_tokens + chat.stats.completion_tokens
    where = {"local_model": local_model} if local_model else {"endpoint": base_url, "model": model}
    typer.echo(json.dumps({**where, "scoring": scoring, "task": task, "reference": reference, **result}, indent=2))
