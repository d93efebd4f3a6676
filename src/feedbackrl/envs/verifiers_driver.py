"""Runs a `verifiers` (0.4, `verifiers.v1`) environment's rollouts; executed by the *verifiers*
virtualenv's Python, never imported by feedbackrl's own code.

`verifiers` pins versions of openai, mcp, pydantic and numpy that differ from ours, so it lives in
its own virtualenv and this script is the whole of our code that runs there (it imports nothing
from feedbackrl; `envs/verifiers_env.py` starts it as a subprocess). One JSON request on stdin,
one JSON answer on stdout (logs go to stderr):

- ``{"command": "list", "env": ID, "taskset": {...}}``: the taskset's tasks, in order:
  ``{"tasks": [{"idx": i, "prompt": "...", "system_prompt": ..., "answer": ...}, ...]}``
  (`answer`: the task data's `answer` field when it is a string, else null).
- ``{"command": "run", "env": ID, "taskset": {...}, "harness": "null", "tasks": [i, ...],
  "base_url": URL, "model": NAME, "tokenizer": DIR, "sampling": {...}, "max_turns": N,
  "max_concurrent": N, "client": "train", "renderer": {...}}``: one episode per entry of `tasks`
  (repeat an index for a group), played by the environment's own machinery (its harness program in
  the local subprocess runtime, its interception server, its rewards) against the policy at
  `base_url`. With the training client (`"client": "train"`) verifiers renders prompts with the
  tokenizer in `DIR` (its `renderers` config `renderer`, default ``{"name": "default"}``: the
  tokenizer's own chat template, no tool-call parser) and calls
  ``POST {base_url}/inference/v1/generate`` (token ids in, token ids and log-probs out); with
  ``"eval"`` it streams ``POST {base_url}/v1/chat/completions``. Answer:
  ``{"episodes": [{"idx", "ok", "errors", "reward", "rewards", "token_ids", "sampled_mask",
  "logprobs", "messages", "stop_condition", "is_truncated", "branches"}, ...]}``, in the order of
  `tasks`. `token_ids`, `sampled_mask` and `logprobs` are the trace's first branch (what verifiers
  itself trains on): the whole sequence, True on the tokens the policy sampled, and the sampling
  log-prob of each sampled token (0.0 elsewhere).

The environment module is found by its id the way `verifiers` finds it (``import <id>``, dashes as
underscores), on this interpreter's path plus the request's `path` entries.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


def _env(req: dict[str, Any]) -> Any:
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    agent: dict[str, Any] = {"runtime": {"type": "subprocess"}}  # never a remote sandbox
    if req.get("harness"):
        agent["harness"] = {"id": req["harness"]}
    if req.get("max_turns"):
        agent["max_turns"] = int(req["max_turns"])
    config = resolve_env_config({"taskset": {"id": req["env"], **req.get("taskset", {})}, "agent": agent})
    return load_environment(config)


def _message_text(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": getattr(message, "role", "?"), "content": getattr(message, "content", None)}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
    if not isinstance(out["content"], str | None):
        out["content"] = str(out["content"])
    return out


def list_tasks(req: dict[str, Any]) -> dict[str, Any]:
    env = _env(req)
    tasks = []
    for i, task in enumerate(env.taskset):
        prompt = task.data.prompt
        tasks.append({"idx": i, "prompt": prompt if isinstance(prompt, str) else
                      [_message_text(m) for m in prompt] if prompt else None,
                      "system_prompt": task.data.system_prompt,
                      "answer": answer if isinstance(answer := getattr(task.data, "answer", None), str) else None})
    return {"tasks": tasks}


async def run(req: dict[str, Any]) -> dict[str, Any]:
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig, TrainClientConfig
    from verifiers.v1.types import SamplingConfig

    env = _env(req)
    tasks = list(env.taskset)
    base = req["base_url"].rstrip("/")
    if req.get("client", "train") == "train":
        # the renderer loads the tokenizer from `tokenizer`; generate posts to {base_url}/../inference/v1/generate
        client: Any = TrainClientConfig(base_url=f"{base}/v1", api_key_var="FEEDBACKRL_LOCAL_KEY",
                                        renderer=req.get("renderer") or {"name": "default"},
                                        renderer_model_name=req["tokenizer"])
    else:
        client = EvalClientConfig(base_url=f"{base}/v1", api_key_var="FEEDBACKRL_LOCAL_KEY")
    ctx = ModelContext(model=req.get("model", "policy"), client=client,
                       sampling=SamplingConfig.model_validate(req.get("sampling", {})))
    limit = asyncio.Semaphore(int(req.get("max_concurrent") or 8))
    async with env.serving():
        slots = [env.slots(tasks[i], 1)[0] for i in req["tasks"]]
        episodes = await asyncio.gather(*(env.run_slot(s, ctx, limit) for s in slots))
    return {"episodes": [_episode(i, e) for i, e in zip(req["tasks"], episodes, strict=True)]}


def _episode(idx: int, episode: Any) -> dict[str, Any]:
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    out: dict[str, Any] = {"idx": idx, "ok": bool(episode.ok), "errors": errors, "reward": 0.0, "rewards": {},
                           "token_ids": [], "sampled_mask": [], "logprobs": [], "messages": [],
                           "stop_condition": None, "is_truncated": False, "branches": 0}
    if not episode.traces:
        return out
    trace = episode.traces[0]
    out["errors"] += [f"{e.type}: {e.message}" for e in trace.errors]
    out.update(ok=bool(episode.ok and trace.ok), reward=float(trace.reward),
               rewards={k: (None if r is None else float(r.value)) for k, r in trace.rewards.items()},
               messages=[_message_text(m) for m in trace.messages], stop_condition=trace.stop_condition,
               is_truncated=bool(trace.is_truncated))
    branches = trace.branches
    out["branches"] = len(branches)
    if branches:
        b = branches[0]
        out.update(token_ids=list(b.token_ids), sampled_mask=[bool(x) for x in b.sampled_mask],
                   logprobs=[float(x) for x in b.logprobs])
    return out


def main() -> None:
    req = json.loads(sys.stdin.read())
    sys.path[:0] = [p for p in req.get("path", []) if p not in sys.path]
    if req["command"] == "list":
        out = list_tasks(req)
    elif req["command"] == "run":
        out = asyncio.run(run(req))
    else:
        raise SystemExit(f"unknown command {req['command']!r}; expected 'list' or 'run'")
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
