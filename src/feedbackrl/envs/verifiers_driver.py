"""Runs a `verifiers` (0.4, `verifiers.v1`) environment's rollouts; executed by the *verifiers*
virtualenv's Python, never imported by feedbackrl's own code.

`verifiers` pins versions of openai, mcp, pydantic and numpy that differ from ours, so it lives in
its own virtualenv and this script is the whole of our code that runs there (it imports nothing
from feedbackrl; `envs/verifiers_env.py` starts it as a subprocess). One JSON request per line on
stdin, one JSON answer per line on stdout, in order, until stdin closes (logs go to stderr). The
process is kept for a whole run: an environment is loaded once and its serving resources (its
interception server) stay up across requests, so a training step pays only for its episodes
(starting the interpreter, importing verifiers and loading an environment take 10-15 s on a small
machine). A request that fails answers ``{"error": "..."}`` (the traceback goes to stderr).

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
  ``{"episodes": [{"idx", "ok", "errors", "reward", "rewards", "metrics", "token_ids", "sampled_mask",
  "logprobs", "messages", "stop_condition", "is_truncated", "branches"}, ...]}``, in the order of
  `tasks`. `rewards`: each `@vf.reward`'s value; `metrics`: each `@vf.metric`'s (recorded, not
  part of the reward). `token_ids`, `sampled_mask` and `logprobs` are the trace's first branch (what verifiers
  itself trains on): the whole sequence, True on the tokens the policy sampled, and the sampling
  log-prob of each sampled token (0.0 elsewhere).

The environment module is found by its id the way `verifiers` finds it (``import <id>``, dashes as
underscores), on this interpreter's path plus the request's `path` entries (also exported on
``PYTHONPATH`` for the tool servers verifiers starts). Its config is resolved by verifiers: the
package's own `vf.Env` subclass and config class, whatever its agent seats are named; we set only
each seat's runtime (local subprocess) and, where the seat leaves them unset, `harness` and `max_turns`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import traceback
from typing import Any


def _env(req: dict[str, Any]) -> Any:
    """The environment as verifiers itself resolves it: the taskset's own `Env` class (else
    `SingleAgentEnv`) and that class's config type, with each of its declared agent seats (whatever
    their names) overridden only where we must: the local subprocess runtime (never a remote
    sandbox), and the request's harness and turn limit on seats that leave them unset."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.loaders import env_config_type, load_environment, resolve_env_config

    cls = env_config_type(req["env"])
    seats = {name: f.default for name, f in cls.model_fields.items() if isinstance(f.default, AgentConfig)}
    data: dict[str, Any] = {"taskset": {"id": req["env"], **req.get("taskset", {})}}
    for name, default in seats.items():
        seat: dict[str, Any] = {"runtime": {"type": "subprocess"}}
        if req.get("harness") and default.harness is None:
            seat["harness"] = {"id": req["harness"]}
        if req.get("max_turns") and default.max_turns is None:
            seat["max_turns"] = int(req["max_turns"])
        data[name] = seat
    return load_environment(resolve_env_config(data))


def _message_text(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": getattr(message, "role", "?"), "content": getattr(message, "content", None)}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
    if not isinstance(out["content"], str | None):
        out["content"] = str(out["content"])
    return out


class Session:
    """The environments loaded so far (one per environment/taskset/agent config), each served from its
    first episode until the driver exits."""

    def __init__(self) -> None:
        self.envs: dict[str, Any] = {}
        self.served: set[str] = set()
        self.stack = contextlib.AsyncExitStack()

    @staticmethod
    def _key(req: dict[str, Any]) -> str:
        return json.dumps([req["env"], req.get("taskset", {}), req.get("harness"), req.get("max_turns")],
                          sort_keys=True)

    def env(self, req: dict[str, Any]) -> Any:
        key = self._key(req)
        if key not in self.envs:
            self.envs[key] = _env(req)
        return self.envs[key]

    async def serving(self, req: dict[str, Any]) -> Any:
        env, key = self.env(req), self._key(req)
        if key not in self.served:
            await self.stack.enter_async_context(env.serving())
            self.served.add(key)
        return env


def list_tasks(env: Any) -> dict[str, Any]:
    tasks = []
    for i, task in enumerate(env.taskset):
        prompt = task.data.prompt
        tasks.append({"idx": i, "prompt": prompt if isinstance(prompt, str) else
                      [_message_text(m) for m in prompt] if prompt else None,
                      "system_prompt": task.data.system_prompt,
                      "answer": answer if isinstance(answer := getattr(task.data, "answer", None), str) else None})
    return {"tasks": tasks}


async def run(session: Session, req: dict[str, Any]) -> dict[str, Any]:
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig, TrainClientConfig
    from verifiers.v1.types import SamplingConfig

    env = await session.serving(req)
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
    slots = [env.slots(tasks[i], 1)[0] for i in req["tasks"]]
    episodes = await asyncio.gather(*(env.run_slot(s, ctx, limit) for s in slots))
    return {"episodes": [_episode(i, e) for i, e in zip(req["tasks"], episodes, strict=True)]}


def _episode(idx: int, episode: Any) -> dict[str, Any]:
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    out: dict[str, Any] = {"idx": idx, "ok": bool(episode.ok), "errors": errors, "reward": 0.0, "rewards": {},
                           "metrics": {}, "token_ids": [], "sampled_mask": [], "logprobs": [], "messages": [],
                           "stop_condition": None, "is_truncated": False, "branches": 0}
    if not episode.traces:
        return out
    trace = episode.traces[0]
    out["errors"] += [f"{e.type}: {e.message}" for e in trace.errors]
    out.update(ok=bool(episode.ok and trace.ok), reward=float(trace.reward),
               rewards={k: (None if r is None else float(r.value)) for k, r in trace.rewards.items()},
               metrics={k: (None if v is None else float(v)) for k, v in trace.metrics.items()},
               messages=[_message_text(m) for m in trace.messages], stop_condition=trace.stop_condition,
               is_truncated=bool(trace.is_truncated))
    branches = trace.branches
    out["branches"] = len(branches)
    if branches:
        b = branches[0]
        out.update(token_ids=list(b.token_ids), sampled_mask=[bool(x) for x in b.sampled_mask],
                   logprobs=[float(x) for x in b.logprobs])
    return out


async def handle(session: Session, req: dict[str, Any]) -> dict[str, Any]:
    add = [p for p in req.get("path", []) if p not in sys.path]
    sys.path[:0] = add
    if add:  # and for its children: tool servers run as `python -m <module>` in the subprocess runtime
        os.environ["PYTHONPATH"] = os.pathsep.join([*add, *filter(None, [os.environ.get("PYTHONPATH")])])
    if req["command"] == "list":
        return list_tasks(session.env(req))
    if req["command"] == "run":
        return await run(session, req)
    raise ValueError(f"unknown command {req['command']!r}; expected 'list' or 'run'")


async def serve(requests: Any, answers: Any) -> None:
    session = Session()
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, requests.readline):
            if not line.strip():
                continue
            try:
                out = await handle(session, json.loads(line))
            except Exception as e:  # answered, so the caller sees the failure; the driver keeps serving
                traceback.print_exc()
                out = {"error": f"{type(e).__name__}: {e}"}
            answers.write(json.dumps(out) + "\n")
            answers.flush()
    finally:
        await session.stack.aclose()


def main() -> None:
    # The requests and answers get private descriptors; fd 0 becomes /dev/null and fd 1 stderr, so no
    # harness program (which inherits them) can read a request or print into the answers.
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    asyncio.run(serve(requests, answers))


if __name__ == "__main__":
    main()
