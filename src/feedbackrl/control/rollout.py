"""Fixed-length rollouts from a vector env, and their GAE advantages through `algos.ppo.gae`.

`Collector.collect` steps E environments T times and returns a `Rollout` of (T, E) tensors. An episode
that ends inside the rollout is *terminated* (the MDP ended: nothing follows) or *truncated* (a time limit
cut it: the future is worth V(final_obs)); the rollout's own end is a truncation too, worth V(next obs).

`rollout_advantages` reuses the text loops' `gae` (which ends every row with a value of 0) by cutting
each environment's column into episode pieces, one right-padded row each, and folding the bootstrap into
the piece's last reward: r'_end = r_end + gamma * V_boot. Then delta_end = r'_end + gamma * 0 - V_end is
exactly the usual delta = r + gamma * V_boot - V, and nothing flows between pieces. Stable-Baselines3's
`RolloutBuffer` does the same for truncated episodes (it adds gamma * V(terminal_observation) to the
reward); `tests/control/test_rollout_gae.py` checks the two agree on one rollout.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium.vector import SyncVectorEnv
from torch import Tensor

from feedbackrl.algos.ppo import gae
from feedbackrl.control.envs import CostFn, env_action, step_infos
from feedbackrl.control.policy import ActorCritic


@dataclass
class Rollout:
    obs: Tensor  # (T, E, D) observation each action was taken in
    actions: Tensor  # (T, E) or (T, E, A)
    logprobs: Tensor  # (T, E)
    values: Tensor  # (T, E, H): H = 1 (reward) or 2 (reward, cost)
    rewards: Tensor  # (T, E) the environment's reward
    costs: Tensor  # (T, E) the cost signal (0 without one)
    terminated: Tensor  # (T, E) bool: the episode ended at t (MDP end)
    truncated: Tensor  # (T, E) bool: the episode was cut at t (time limit)
    boot_values: Tensor  # (T, E, H): V(final obs) where truncated, else 0
    last_values: Tensor  # (E, H): V of the observation after the rollout
    episodes: list[dict[str, float]]  # episodes finished in this rollout: env index, return, length, cost
    frames: list[list[Any]] | None = None  # [T][E] rgb frames of the state each action was taken in, if asked

    @property
    def dones(self) -> Tensor:
        return self.terminated | self.truncated


class Collector:
    """Steps a vector env with a policy; its `state_dict` (envs included) makes a resumed run exact."""

    def __init__(self, envs: SyncVectorEnv, seed: int, cost: CostFn | None = None) -> None:
        self.envs, self.cost = envs, cost
        obs, _ = envs.reset(seed=seed)
        self.obs = obs
        n = envs.num_envs
        self.ep_return, self.ep_len, self.ep_cost = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n)

    @torch.no_grad()
    def collect(self, policy: ActorCritic, steps: int, generator: torch.Generator,
                frames: Callable[[Any], Any] | None = None) -> Rollout:
        """`frames`: keep `frames(image)` of every environment before each step (`envs.render()`; the envs
        must be made with render_mode="rgb_array"), e.g. shrunk for the clips of a labelling round."""
        n, heads = self.envs.num_envs, policy.critic[-1].out_features
        buf: dict[str, list[Any]] = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "costs",
                                                     "terminated", "truncated", "boot")}
        episodes: list[dict[str, float]] = []
        shown: list[list[Any]] = []
        for _ in range(steps):
            if frames is not None:
                shown.append([frames(image) for image in self.envs.render()])
            obs_t = torch.as_tensor(self.obs, dtype=torch.float32)
            actions, logp, values = policy.act(obs_t, generator)
            nxt, reward, term, trunc, info = self.envs.step(env_action(self.envs, actions.numpy()))
            done = term | trunc
            final = nxt.copy()  # the observation each step ended in (a finished episode's last one)
            if done.any():
                final[done] = np.stack(list(info["final_obs"][done]))
            cost = self.cost(final, step_infos(info, done)) if self.cost is not None else np.zeros(n, dtype=np.float32)
            boot = torch.zeros(n, heads)
            if trunc.any():
                boot[torch.as_tensor(trunc)] = policy.values(torch.as_tensor(final[trunc], dtype=torch.float32))
            for k, v in (("obs", obs_t), ("actions", actions), ("logprobs", logp), ("values", values),
                         ("rewards", torch.as_tensor(reward, dtype=torch.float32)),
                         ("costs", torch.as_tensor(cost, dtype=torch.float32)), ("terminated", torch.as_tensor(term)),
                         ("truncated", torch.as_tensor(trunc)), ("boot", boot)):
                buf[k].append(v)
            self.ep_return += reward
            self.ep_len += 1
            self.ep_cost += cost
            for i in np.flatnonzero(done):
                episodes.append({"env": int(i), "return": float(self.ep_return[i]), "length": int(self.ep_len[i]),
                                 "cost": float(self.ep_cost[i]), **_episode_metrics(info, int(i))})
                self.ep_return[i], self.ep_len[i], self.ep_cost[i] = 0.0, 0, 0.0
            self.obs = nxt
        last = policy.values(torch.as_tensor(self.obs, dtype=torch.float32))
        s = {k: torch.stack(v) for k, v in buf.items()}
        return Rollout(s["obs"], s["actions"], s["logprobs"], s["values"], s["rewards"], s["costs"],
                       s["terminated"].bool(), s["truncated"].bool(), s["boot"], last, episodes,
                       shown if frames is not None else None)

    def state_dict(self) -> dict[str, Any]:
        # gymnasium environments carry their state in plain attributes and numpy generators: pickling the
        # sub-environments (between rollouts; the vector env's own factories are lambdas) keeps every episode
        return {"envs": _dumps_without_screens(self.envs.envs), "obs": self.obs.copy(),
                "ep_return": self.ep_return.copy(), "ep_len": self.ep_len.copy(), "ep_cost": self.ep_cost.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.envs.envs = pickle.loads(state["envs"])
        self.obs, self.ep_return = state["obs"], state["ep_return"]
        self.ep_len, self.ep_cost = state["ep_len"], state["ep_cost"]


def _none() -> None:
    return None


class _ScreenlessPickler(pickle.Pickler):
    """Pickles an env that has rendered: its pygame drawing state (surfaces, clock) is dropped, stored as None,
    which is how an env that never rendered holds it (gymnasium's classic control then draws a new screen)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj).__module__.split(".")[0] == "pygame":
            return _none, ()
        return NotImplemented


def _dumps_without_screens(obj: Any) -> bytes:
    buf = io.BytesIO()
    _ScreenlessPickler(buf).dump(obj)
    return buf.getvalue()


def _episode_metrics(info: dict[str, Any], i: int) -> dict[str, float]:
    """The closed-loop metrics an environment reports in an episode's last step's info (`metrics`, as the
    driving environments do), for sub-environment i; {} when it reports none."""
    metrics = info.get("final_info", {}).get("metrics", {})
    return {k: float(v[i]) for k, v in metrics.items() if not k.startswith("_") and metrics[f"_{k}"][i]}


def episode_pieces(dones: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """dones (T, E) bool -> piece id and position of every step, as (T, E) tensors, the piece count P and the
    longest piece L. Each environment's column is cut after every done and at the rollout's end."""
    t_len, n_env = dones.shape
    ends = dones.t().clone()  # (E, T): env-major, so a column's steps are consecutive
    ends[:, -1] = True
    flat = ends.reshape(-1)
    piece = torch.cumsum(flat.long(), 0) - flat.long()  # the end step belongs to its piece
    n_pieces = int(flat.sum())
    end_idx = torch.nonzero(flat).flatten()
    starts = torch.cat([torch.zeros(1, dtype=torch.long), end_idx[:-1] + 1])
    pos = torch.arange(flat.numel()) - starts[piece]
    longest = int((end_idx - starts + 1).max())
    return piece.view(n_env, t_len).t(), pos.view(n_env, t_len).t(), n_pieces, longest


def rollout_advantages(rewards: Tensor, values: Tensor, terminated: Tensor, truncated: Tensor,
                       boot_values: Tensor, last_values: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """rewards, values, terminated, truncated, boot_values: (T, E); last_values (E,) -> advantages and returns
    (T, E). The bootstrap after step t: V(final obs) where truncated, V(next obs) at the rollout's last step
    when the episode goes on, 0 where terminated."""
    dones = terminated | truncated
    boot = torch.where(truncated, boot_values, torch.zeros_like(boot_values))
    boot[-1] = torch.where(dones[-1], boot[-1], last_values)
    ends = dones.clone()
    ends[-1] = True
    shaped = rewards + gamma * torch.where(ends & ~terminated, boot, torch.zeros_like(boot))
    piece, pos, n_pieces, longest = episode_pieces(dones)
    padded_r, padded_v = torch.zeros(n_pieces, longest), torch.zeros(n_pieces, longest)
    mask = torch.zeros(n_pieces, longest, dtype=torch.bool)
    padded_r[piece, pos], padded_v[piece, pos], mask[piece, pos] = shaped, values.float(), True
    adv, ret = gae(padded_r, padded_v, mask, gamma, lam)
    return adv[piece, pos], ret[piece, pos]


def minibatch_indices(n: int, minibatches: int, epochs: int, generator: torch.Generator) -> Iterator[Tensor]:
    """PPO's minibatches over n flat steps: per epoch one permutation (drawn from `generator`), cut into
    `minibatches` slices of n // minibatches indices (the remainder is left out of that epoch)."""
    size = n // minibatches
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        for i in range(minibatches):
            yield perm[i * size:(i + 1) * size]


def annealed_lr(lr: float, update: int, updates: int, final: float = 0.0) -> float:
    """The learning rate of update `update` (1-based) of `updates`: linear from `lr` at the first update towards
    `final` x lr one update past the last (CleanRL's schedule at final = 0: lr x (1 - (update - 1) / updates), the
    last update at lr / updates). final = 0 computes exactly that expression, bit for bit."""
    return lr * (1.0 - (1.0 - final) * (update - 1) / updates)
