"""Multi-turn tasks (`envs/multi_turn.py`, `Task.kind = "episodic"`): the episode runner, whose rollouts
return the same `Batch` as a single-turn collect step, the held-out evaluation of whole episodes, SFT rows
for demonstrated conversations, and the transcripts (`OUT/episodes.jsonl`).

Each row of the batch is one episode. Its "completion" is every token after the first prompt:
the policy's turns (sampled tokens, EOS included) interleaved with the environment's messages
(encoded text), so `completion_mask` is 1 on the policy's own tokens only and the GRPO/RLOO loss
never trains on tool output. The model's `TurnFormat` (`envs/turn_format.py`: its chat template, or
the minimal format) writes the prompt and the environment's messages and parses each turn's tool
calls; `demonstration_rows` encodes SFT demonstrations the same way, mask on the assistant turns.
Turns are decoded together for all active episodes: each turn re-encodes nothing, it continues
from the exact token ids so far (the whole context is prefilled again per turn; the model sees what
the losses score). Environment steps (tool calls) of a turn run concurrently in a thread pool;
finished episodes leave the batch.

Rewards: the trajectory's verdict score minus `tool_call_penalty` per tool call and
`turn_penalty` per turn. With `turn_credit > 0` the per-turn rewards also give each turn's tokens
an extra advantage (`algos/turn_credit.py`), added by the loop to the trajectory advantage.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.turn_credit import turn_credit
from feedbackrl.config import ModelConfig, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.multi_turn import (
    END_ANSWERED,
    END_ERROR,
    END_OUT_OF_TURNS,
    END_TRUNCATED,
    EpisodeRecord,
    EpisodicTask,
    Message,
    StepResult,
    Turn,
    episode_stats,
)
from feedbackrl.envs.turn_format import TurnFormat, turn_format
from feedbackrl.episodes.contracts import Batch, EvalResult, EvalSettings, Scorer, Support
from feedbackrl.episodes.rows import left_pad, right_pad, right_pad_float, transcript_text
from feedbackrl.models.chat import end_token_ids
from feedbackrl.rewards.verdict import Problem, fail
from feedbackrl.rollout.generate import generate_ids

_STEP_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="feedbackrl-env")


@dataclass
class Episodes:
    """N episodes as token tensors plus their transcripts."""

    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P)
    completion_ids: Tensor  # (N, T) right-padded: turns and observations
    completion_mask: Tensor  # (N, T) 1 on the policy's tokens
    token_turn: Tensor  # (N, T) the assistant turn (0-based) each policy token belongs to; -1 elsewhere
    logprobs: Tensor  # (N, T) sampling log-probs of the policy's tokens, 0 elsewhere
    records: list[EpisodeRecord]  # (N,)
    gen_s: float  # seconds in generation
    env_s: float  # seconds in environment steps (tools)


def _safe_step(env: object, turn: Turn) -> StepResult | Exception:
    try:
        return env.step(turn)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - a broken environment ends its episode, not the run
        return e


def run_episodes(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: EpisodicTask,
                 problems: list[Problem], temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
                 generator: torch.Generator | None = None) -> Episodes:
    """Play one episode per problem (repeat problems for groups) under `task.limits`."""
    lim, pad = task.limits, tokenizer.pad_token_id
    fmt = turn_format(tokenizer, task)
    ends = set(end_token_ids(model, tokenizer).tolist())
    envs = [task.make_env(p) for p in problems]
    records: list[EpisodeRecord] = []
    prompts: list[list[int]] = []
    for env in envs:
        first = env.reset()
        text = fmt.prompt(first)
        records.append(EpisodeRecord(prompt=text, messages=list(first)))
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    comp: list[list[int]] = [[] for _ in problems]
    turn_of: list[list[int]] = [[] for _ in problems]  # per completion token: turn index or -1
    logps: list[list[float]] = [[] for _ in problems]
    active, gen_s, env_s = list(range(len(problems))), 0.0, 0.0
    try:
        for turn in range(lim.max_turns):
            if not active:
                break
            t0 = time.perf_counter()
            ids, mask = left_pad([prompts[i] + comp[i] for i in active], pad)
            budget = [lim.max_tokens - len(comp[i]) for i in active]
            ro = generate_ids(model, tokenizer, ids, mask, min(lim.turn_tokens, max(budget)), temperature, top_p,
                              greedy, generator)
            turns, closers = [], []
            for j, i in enumerate(active):
                toks = ro.completion_ids[j][ro.completion_mask[j].bool()].tolist()[: budget[j]]
                comp[i] += toks
                turn_of[i] += [turn] * len(toks)
                logps[i] += ro.logprobs[j][: len(toks)].tolist()
                closed = bool(toks) and toks[-1] in ends
                content = fmt.content(toks[:-1] if closed else toks)
                turns.append(fmt.parse(content, records[i].messages))
                closers.append(tokenizer.decode(toks[-1:], skip_special_tokens=False) if closed else "")
            t1 = time.perf_counter()
            results = list(_STEP_POOL.map(_safe_step, [envs[i] for i in active], turns))
            env_s += time.perf_counter() - t1
            gen_s += t1 - t0
            active = [i for i, t, end, res in zip(active, turns, closers, results, strict=True)
                      if _record_turn(records[i], (comp[i], turn_of[i], logps[i]), t, end, res, lim.max_tokens,
                                      tokenizer, fmt)]
        for i in active:
            records[i].end, records[i].verdict = END_OUT_OF_TURNS, fail(f"no answer within {lim.max_turns} turns")
    finally:
        for env in envs:
            env.close()
    for r in records:
        r.reward = float(r.verdict.score) - task.tool_call_penalty * r.tool_calls - task.turn_penalty * r.turns
    p_ids, p_mask = left_pad(prompts, pad)
    c_ids = right_pad(comp, pad)
    token_turn = right_pad(turn_of, -1)
    lp = torch.zeros(token_turn.shape)
    for i, row in enumerate(logps):
        lp[i, : len(row)] = torch.tensor(row)
    return Episodes(p_ids, p_mask, c_ids, (token_turn >= 0).long(), token_turn, lp, records, gen_s, env_s)


def _record_turn(rec: EpisodeRecord, row: tuple[list[int], list[int], list[float]], turn: Turn, end: str,
                 res: StepResult | Exception, max_tokens: int, tokenizer: PreTrainedTokenizerBase,
                 fmt: TurnFormat) -> bool:
    """Append one turn's outcome to the transcript and the environment's reply tokens to the episode's row
    (token ids, turn index per token, log-prob per token); True if the episode goes on."""
    comp, turn_of, logps = row
    rec.messages.append({"role": "assistant", "content": turn.text})
    rec.parse_errors += turn.error is not None
    if isinstance(res, Exception):
        rec.turn_rewards.append(0.0)
        rec.end, rec.verdict = END_ERROR, fail(f"environment raised {type(res).__name__}: {str(res)[:200]}")
        return False
    rec.turn_rewards.append(float(res.reward))
    rec.tool_calls += res.tool_calls
    rec.tool_errors += res.tool_errors
    if res.done:
        rec.messages.extend(res.observation)
        rec.end, rec.verdict = END_ANSWERED, res.verdict
        return False
    obs = tokenizer(fmt.reply(rec.messages, res.observation, end), add_special_tokens=False)["input_ids"]
    rec.messages.extend(res.observation)
    comp += obs
    turn_of += [-1] * len(obs)
    logps += [0.0] * len(obs)
    if len(comp) >= max_tokens:  # no room left for another turn
        del comp[max_tokens:], turn_of[max_tokens:], logps[max_tokens:]
        rec.end, rec.verdict = END_TRUNCATED, fail(f"episode ran past {max_tokens} tokens")
        return False
    return True


def demonstration_rows(tokenizer: PreTrainedTokenizerBase, task: EpisodicTask, problems: list[Problem],
                       demos: list[list[Message]]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """SFT rows for episodic demonstrations, encoded as `run_episodes` encodes episodes: prompt_ids, prompt_mask
    (N, P) left-padded; completion_ids, completion_mask (N, T) right-padded, the mask 1 on the assistant turns
    (their end token included) and 0 on the environment's messages."""
    fmt = turn_format(tokenizer, task)
    prompts, comps, masks = [], [], []
    for problem, demo in zip(problems, demos, strict=True):
        env = task.make_env(problem)
        try:
            first = env.reset()
        finally:
            env.close()
        p, c, m = _encode_demonstration(tokenizer, fmt, first, demo)
        prompts.append(p)
        comps.append(c)
        masks.append(m)
    p_ids, p_mask = left_pad(prompts, tokenizer.pad_token_id)
    return p_ids, p_mask, right_pad(comps, tokenizer.pad_token_id), right_pad(masks, 0)


def _encode_demonstration(tokenizer: PreTrainedTokenizerBase, fmt: TurnFormat, first: list[Message],
                          demo: list[Message]) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, mask) of one demonstration: assistant turns, each followed by the
    environment's messages up to the next one (none after the last)."""
    if not demo or demo[0]["role"] != "assistant" or demo[-1]["role"] != "assistant":
        roles = [m["role"] for m in demo]
        raise ValueError(f"a demonstration starts and ends with an assistant turn, got roles {roles}")

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    conversation = list(first)
    comp: list[int] = []
    mask: list[int] = []
    for k, message in enumerate(demo):
        if message["role"] != "assistant":
            continue
        text = fmt.write(conversation, message)
        ids = encode(text) + encode(fmt.end)
        comp += ids
        mask += [1] * len(ids)
        conversation.append({"role": "assistant", "content": text})
        new = []
        for m in demo[k + 1:]:
            if m["role"] == "assistant":
                break
            new.append(m)
        if k + 1 + len(new) < len(demo):  # another assistant turn follows: the environment's reply, then it
            obs = encode(fmt.reply(conversation, new, fmt.end))
            comp += obs
            mask += [0] * len(obs)
            conversation += new
    return encode(fmt.prompt(first)), comp, mask


def collect_episodes(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: EpisodicTask,
                     cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch:
    """The collect step for episodic tasks: B problems, G episodes each, one `Batch` (rows as in `collect`)."""
    B, G = cfg.prompts_per_step, cfg.group_size
    problems = [task.sample(prompt_rng) for _ in range(B)]
    owners = [problems[i // G] for i in range(B * G)]
    ep = run_episodes(model, tokenizer, task, owners, cfg.temperature, cfg.top_p, generator=sample_rng)
    verdicts = [r.verdict for r in ep.records]
    task.observe(owners, verdicts)
    dev = model.device
    rewards = torch.tensor([r.reward for r in ep.records], device=dev)
    policy_tokens = int(ep.completion_mask.sum())
    metrics = {"reward/mean": rewards.mean().item(), "reward/std": rewards.std().item() if len(owners) > 1 else 0.0,
               "reward/pass_rate": sum(v.passed for v in verdicts) / len(verdicts),
               "rollout/len_mean": policy_tokens / len(owners),
               "rollout/truncated_frac": sum(r.end == END_TRUNCATED for r in ep.records) / len(owners),
               "perf/gen_s": ep.gen_s, "perf/tool_s": ep.env_s, **episode_stats(ep.records)}
    extra = None
    if task.turn_credit > 0:
        turn_rewards = right_pad_float([r.turn_rewards for r in ep.records])
        turn_mask = _turn_mask(ep.records, turn_rewards.shape[1])
        extra = task.turn_credit * turn_credit(turn_rewards, turn_mask, ep.token_turn, G)
    truncated = torch.tensor([r.end == END_TRUNCATED for r in ep.records], device=dev)
    return Batch(owners, ep.prompt_ids.to(dev), ep.prompt_mask.to(dev), ep.completion_ids.to(dev),
                 ep.completion_mask.to(dev), [transcript_text(r) for r in ep.records], verdicts, rewards, truncated,
                 metrics, turn_advantages=None if extra is None else extra.to(dev), episodes=ep.records)


def _turn_mask(records: list[EpisodeRecord], k: int) -> Tensor:
    return torch.tensor([[float(j < r.turns) for j in range(k)] for r in records])


def write_transcripts(path: Path, step: int, records: list[EpisodeRecord]) -> None:
    """Append one JSON line per episode (`step` plus `EpisodeRecord.to_dict`) to `path`."""
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps({"step": step, **r.to_dict()}, default=str) + "\n")


def read_transcripts(path: Path) -> list[tuple[int, EpisodeRecord]]:
    """The (step, record) pairs `write_transcripts` wrote, in order."""
    out = []
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        out.append((d.pop("step"), EpisodeRecord.from_dict(d)))
    return out


def evaluate_episodes(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: EpisodicTask,
                      problems: list[Problem], k: int = 4, temperature: float = 1.0, batch_size: int = 256,
                      seed: int = 1234, n_samples: int = 5) -> EvalResult:
    """Greedy episodes (accuracy, `episode_stats`) and k sampled episodes per problem (pass@k)."""
    gen = torch.Generator().manual_seed(seed)
    greedy: list[EpisodeRecord] = []
    any_correct, policy_tokens = 0, 0
    step = max(1, batch_size // max(k, 1))
    for start in range(0, len(problems), step):
        batch = problems[start : start + step]
        ep = run_episodes(model, tokenizer, task, batch, greedy=True)
        greedy += ep.records
        policy_tokens += int(ep.completion_mask.sum())
        if not k:  # greedy only
            continue
        sampled = run_episodes(model, tokenizer, task, [p for p in batch for _ in range(k)], temperature,
                               generator=gen).records
        any_correct += sum(any(r.verdict.passed for r in sampled[i * k : (i + 1) * k]) for i in range(len(batch)))
    n = len(problems)
    samples = [{"prompt": r.prompt, "completion": transcript_text(r), "correct": r.verdict.passed, "end": r.end}
               for r in greedy[:n_samples]]
    return EvalResult(accuracy=sum(r.verdict.passed for r in greedy) / n,
                      pass_at_k=any_correct / n if k else float("nan"), k=k, n=n, mean_len=policy_tokens / n,
                      truncated_frac=sum(r.end == END_TRUNCATED for r in greedy) / n, samples=samples,
                      metrics=episode_stats(greedy))


class Episodic:
    """The kind of tasks played as episodes in this process (`Task.kind = "episodic"`, `envs/multi_turn.py`)."""

    name = "episodic"
    support = Support()  # in one process, sampled in float32, scored by the environment
    refuses = "its episodes are played in one process"

    def for_model(self, task: Task, tokenizer: PreTrainedTokenizerBase, cfg: ModelConfig) -> Task:
        return task  # the runner renders the transcripts in the model's turn format itself

    def collect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch:
        """`collect_episodes`; the environment's verdict replaces `scorer`."""
        return collect_episodes(model, tokenizer, task, cfg, prompt_rng, sample_rng)  # type: ignore[arg-type]

    def evaluate(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                 problems: list[Problem], settings: EvalSettings) -> EvalResult:
        """`evaluate_episodes`: whole episodes under `task.limits` (the truncation settings do not apply)."""
        s = settings
        return evaluate_episodes(model, tokenizer, task, problems, s.k, s.temperature,  # type: ignore[arg-type]
                                 s.batch_size, s.seed, s.n_samples)

    def demonstrations(self, tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem],
                       demos: list[Any]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return demonstration_rows(tokenizer, task, problems, demos)  # type: ignore[arg-type]

