"""`feedbackrl judge quality`: measure a judge on held-out gold-checkable pairs before rewarding with it."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from feedbackrl.cli_errors import ReportsUserErrors

judge_app = typer.Typer(help="LLM judges: measure them before training on them.", no_args_is_help=True,
                        cls=ReportsUserErrors)

CRITERION = "the response is the task's word written backwards, letter for letter"
# held-out pairs the gold check separates, per task: (criterion, task description for the rubric)
TASKS = {
    "reverse": (CRITERION, "Judge the answer to a word-reversal task."),
    "addition": ("the response is the correct sum of the two numbers in the task", "Judge the answer to an "
                 "addition problem."),
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
            pairs: Annotated[int, typer.Option(help="held-out reversal pairs")] = 200,
            noise: Annotated[float, typer.Option(help="scripted judge only: P(random answer)")] = 0.0,
            position_bias: Annotated[float, typer.Option(help="scripted judge only: P(says A regardless)")] = 0.0,
            timeout: Annotated[float, typer.Option(help="seconds per request")] = 30.0) -> None:
    """Agreement with the gold check, position-bias rate and self-consistency, as JSON."""
    from contextlib import nullcontext

    from feedbackrl.envs.procedural.addition import AdditionTask, wrong_sum
    from feedbackrl.envs.procedural.reverse import ReverseTask
    from feedbackrl.rewards.judge import (
        Criterion,
        LogprobPairwiseJudge,
        LogprobPointwiseJudge,
        PairwiseJudge,
        PointwiseJudge,
        Rubric,
    )
    from feedbackrl.rewards.judge_backends import CachedChat, HFChat, HFChoiceLogprobs, OpenAIChat
    from feedbackrl.rewards.judge_quality import gold_pairs, judge_quality, reversal_pairs

    if bool(base_url) == bool(local_model):
        raise typer.BadParameter("give exactly one of --base-url (an endpoint) and --local-model (a local model), "
                                 f"got base_url={base_url!r}, local_model={local_model!r}")
    if scoring not in ("generate", "logprob"):
        raise typer.BadParameter(f"--scoring must be 'generate' or 'logprob', got {scoring!r}")
    if scoring == "logprob" and not local_model:
        raise typer.BadParameter("--scoring logprob needs --local-model (it reads a local model's log-probs)")
    if task not in TASKS:
        raise typer.BadParameter(f"--task must be one of {sorted(TASKS)}, got {task!r}")
    criterion, description = TASKS[task]
    env = ReverseTask() if task == "reverse" else AdditionTask(digits=2)
    pair_set = reversal_pairs(env.heldout(pairs)) if task == "reverse" else gold_pairs(env.heldout(pairs), wrong_sum)

    def gold(p, c):
        return env.verify(p, c).score

    if scoring == "logprob":
        scorer = HFChoiceLogprobs(local_model)
        result = judge_quality(LogprobPairwiseJudge(scorer, criterion, reference=reference),
                               LogprobPointwiseJudge(scorer, criterion, task=description, reference=reference),
                               pair_set, gold)
        typer.echo(json.dumps({"local_model": local_model, "scoring": scoring, "task": task, "reference": reference,
                               **result}, indent=2))
        return
    server = nullcontext(None)
    if base_url == "scripted":
        from feedbackrl.feedback.judge_server import RuleJudge, chat_app
        from feedbackrl.feedback.server import LiveServer

        def right(t: str, r: str) -> float:  # the gold answer, from the task text the judge is shown
            q = t.removesuffix("=")
            return float(r == (q[::-1] if task == "reverse" else str(sum(int(x) for x in q.split("+")))))

        rule = RuleJudge(right, ("correct" if task == "addition" else "reversed",), noise=noise,
                         position_bias=position_bias)
        server = LiveServer(chat_app(rule))
    with server as live:
        url = live.url + "/v1" if live is not None else base_url
        backend = HFChat(local_model, max_new_tokens) if local_model else OpenAIChat(model, base_url=url,
                                                                                   timeout=timeout)
        chat = CachedChat(backend)
        rubric = Rubric((Criterion("correct" if task == "addition" else "reversed", 1.0, criterion),),
                        task=description)
        result = judge_quality(PairwiseJudge(chat, criterion, reference=reference),
                               PointwiseJudge(chat, rubric, reference=reference), pair_set, gold)
        result["judge_tokens"] = chat.stats.prompt_tokens + chat.stats.completion_tokens
    where = {"local_model": local_model} if local_model else {"endpoint": base_url, "model": model}
    typer.echo(json.dumps({**where, "scoring": scoring, "task": task, "reference": reference, **result}, indent=2))
