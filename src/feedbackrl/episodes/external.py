"""External tasks (`envs/external.py`, `Task.kind = "external"`): the collect step and evaluation, with the
current policy served on a loopback endpoint while the task's environment plays its episodes against it.

Per call, `policy_endpoint` starts `serve/openai_api.py` on 127.0.0.1 (a free port, a uvicorn
server on a thread of this process, so it serves the very model object the loop trains: always the
current weights) and saves the tokenizer to a temporary directory for clients that tokenize on
their side, with the minimal chat template (`models/chat.py`) when the model has none. The episodes
come back as token ids with the environment's own sampled-token mask; each becomes one `Batch` row
like an episode of `episodes/multi_turn.py`: prompt = the tokens before the policy's first sampled
token, completion = the rest, `completion_mask` = 1 on the sampled tokens only.

The sampling log-probs the environment recorded are checked against the training forward each step
(`rollout/logprob_gap_max`: the largest absolute difference over the policy's tokens; near 0 when
the environment trained on exactly what the policy sampled). Requests carry no seed (a group's
episodes must differ), and episodes run concurrently, so runs are not bit-for-bit reproducible.
"""

from __future__ import annotations

import contextlib
import random
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ModelConfig, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.external import ExternalEpisode, ExternalTask
from feedbackrl.envs.multi_turn import END_TRUNCATED, episode_stats
from feedbackrl.episodes.contracts import Batch, EvalResult, EvalSettings, Scorer, Support
from feedbackrl.episodes.rows import left_pad, right_pad, transcript_text
from feedbackrl.episodes.single_turn import SingleTurn, sample_owners
from feedbackrl.models.chat import MINIMAL_CHAT_TEMPLATE, has_chat_template
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.rewards.verdict import Problem


@contextlib.contextmanager
def policy_endpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Iterator[tuple[str, str]]:
    """(server root URL, tokenizer directory) while the block runs; the server stops after it."""
    import uvicorn  # the `feedback` extra, like FastAPI: imported only when an external task runs

    from feedbackrl.serve.openai_api import create_app

    with tempfile.TemporaryDirectory(prefix="feedbackrl-tok-") as tok_dir:
        tokenizer.save_pretrained(tok_dir)
        if not has_chat_template(tokenizer):
            Path(tok_dir, "chat_template.jinja").write_text(MINIMAL_CHAT_TEMPLATE)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(create_app(model, tokenizer), log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                  name="feedbackrl-policy-endpoint")
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the policy endpoint did not start")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{port}", tok_dir
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()


def _rows(tokenizer: PreTrainedTokenizerBase, problems: list[Problem], episodes: list[ExternalEpisode]):
    """Prompt rows, completion rows, masks and sampling log-probs; a failed episode (no tokens) gets its
    problem's prompt and an empty completion (no loss)."""
    prompts, comps, masks, lps = [], [], [], []
    for p, e in zip(problems, episodes, strict=True):
        k = e.prompt_len
        fallback = tokenizer(p.prompt, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id]
        prompts.append(e.token_ids[:k] or fallback)
        comps.append(e.token_ids[k:])
        masks.append([int(s) for s in e.sampled[k:]])
        lps.append(e.logprobs[k:])
    return prompts, comps, masks, lps


def _play(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: ExternalTask, problems: list[Problem],
          sampling: dict[str, float | int]) -> list[ExternalEpisode]:
    with policy_endpoint(model, tokenizer) as (url, tok_dir):
        episodes = task.play(url, tok_dir, problems, sampling)
    if len(episodes) != len(problems):
        raise RuntimeError(f"task {task.name!r} played {len(episodes)} episodes for {len(problems)} problems")
    return episodes


def collect_external(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: ExternalTask,
                     cfg: RolloutConfig, prompt_rng, sample_rng: torch.Generator) -> Batch:
    """B problems, G episodes each, played by the task's environment: one `Batch` (rows as in `collect`)."""
    owners = sample_owners(task, cfg, prompt_rng)
    t0 = time.perf_counter()
    episodes = _play(model, tokenizer, task, owners,
                     {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_new_tokens})
    gen_s = time.perf_counter() - t0
    pad, dev = tokenizer.pad_token_id, model.device
    prompts, comps, masks, lps = _rows(tokenizer, owners, episodes)
    p_ids, p_mask = left_pad(prompts, pad)
    c_ids, c_mask = right_pad(comps, pad), right_pad(masks, 0)
    sampled_lp = torch.zeros(c_ids.shape)
    for i, row in enumerate(lps):
        sampled_lp[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    with torch.no_grad():
        train_lp = sequence_logprobs(model, p_ids.to(dev), p_mask.to(dev), c_ids.to(dev), c_mask.to(dev),
                                     cfg.temperature)[0].cpu()
    gap = ((train_lp - sampled_lp).abs() * c_mask).max().item() if c_mask.any() else 0.0
    records = [e.record for e in episodes]
    verdicts = [r.verdict for r in records]
    task.observe(owners, verdicts)
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=dev)
    n = len(owners)
    metrics = {"reward/mean": rewards.mean().item(), "reward/std": rewards.std().item() if n > 1 else 0.0,
               "reward/pass_rate": sum(v.passed for v in verdicts) / n,
               "rollout/len_mean": float(c_mask.sum()) / n,
               "rollout/truncated_frac": sum(r.end == END_TRUNCATED for r in records) / n,
               "rollout/logprob_gap_max": gap, "perf/gen_s": gen_s, **episode_stats(records)}
    truncated = torch.tensor([r.end == END_TRUNCATED for r in records], device=dev)
    return Batch(owners, p_ids.to(dev), p_mask.to(dev), c_ids.to(dev), c_mask.to(dev),
                 [transcript_text(r) for r in records], verdicts, rewards, truncated, metrics, episodes=records)


def evaluate_external(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: ExternalTask,
                      problems: list[Problem], max_new_tokens: int, k: int = 4, temperature: float = 1.0,
                      n_samples: int = 5) -> EvalResult:
    """Greedy episodes (accuracy = pass rate, `episode_stats`) and k sampled episodes per problem (pass@k)."""
    greedy = _play(model, tokenizer, task, problems, {"temperature": 0.0, "max_tokens": max_new_tokens})
    records = [e.record for e in greedy]
    any_correct = 0
    if k:
        sampled = _play(model, tokenizer, task, [p for p in problems for _ in range(k)],
                        {"temperature": temperature, "max_tokens": max_new_tokens})
        any_correct = sum(any(e.record.verdict.passed for e in sampled[i * k:(i + 1) * k])
                          for i in range(len(problems)))
    n = len(problems)
    samples = [{"prompt": r.prompt, "completion": transcript_text(r), "correct": r.verdict.passed, "end": r.end,
                "reward": r.reward} for r in records[:n_samples]]
    return EvalResult(accuracy=sum(r.verdict.passed for r in records) / n,
                      pass_at_k=any_correct / n if k else float("nan"), k=k, n=n,
                      mean_len=sum(sum(e.sampled) for e in greedy) / n,
                      truncated_frac=sum(r.end == END_TRUNCATED for r in records) / n, samples=samples,
                      metrics={**episode_stats(records), "reward/mean": sum(r.reward for r in records) / n})


class External:
    """The kind of tasks whose episodes another program plays (`Task.kind = "external"`, `envs/external.py`)."""

    name = "external"
    support = Support()  # one process serves its policy; the environment's reward is trained on
    refuses = "its episodes are played by another program against this process's policy endpoint"

    def for_model(self, task: Task, tokenizer: PreTrainedTokenizerBase, cfg: ModelConfig) -> Task:
        return task  # the environment renders its own transcripts (the served tokenizer's chat template)

    def collect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch:
        """`collect_external`; the environment's reward replaces `scorer`."""
        return collect_external(model, tokenizer, task, cfg, prompt_rng, sample_rng)  # type: ignore[arg-type]

    def evaluate(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                 problems: list[Problem], settings: EvalSettings) -> EvalResult:
        s = settings
        return evaluate_external(model, tokenizer, task, problems, s.max_new_tokens, s.k,  # type: ignore[arg-type]
                                 s.temperature, s.n_samples)

    def demonstrations(self, tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem],
                       demos: list[Any]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """A demonstration is the answer to the problem's prompt (`VerifiersTask.demonstrate`: single-turn
        tasks only): encoded as a single-turn one, EOS appended."""
        return SingleTurn().demonstrations(tokenizer, task, problems, demos)
