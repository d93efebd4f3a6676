"""An expert in the loop of a control policy: noisy demonstrations, behaviour cloning, DAgger and takeovers.

The expert is simulated: a scripted controller per environment (`EXPERTS`, one registry, keyed by gymnasium
id) with its test of "about to fail". What it gives the learner:

- *demonstrations*: `demonstrations` rolls the expert out with `demo_noise` of its actions replaced by random
  ones (the executed, noisy action is what is recorded, as a human's slips would be); `behaviour_clone`
  fits the policy to them with `algos.imitation.bc_loss`, a warm start;
- *DAgger* (Ross et al. 2011): `dagger` rolls out the agent, has the expert label every state it visited and
  retrains on all labels so far;
- *takeovers*: in `run_assisted`, PPO on the environment's reward while the expert watches: where its
  `about_to_fail` test fires, the expert's action is executed instead of the agent's. PPO's policy loss skips
  those steps (the agent did not choose them); the value and GAE see every step. Each taken-over step costs
  `takeover_penalty` in the reward PPO sees (the intervention cost of HACO, Li et al. 2022): without it, an
  expert who always saves the episode leaves PPO nothing to learn from, since the agent's steps into danger are
  paid as well as any other. After each update the policy is behaviour-cloned (`takeover_bc_steps` full-batch
  steps, as a DAgger round) on the demonstrations and on every taken-over state so far, labelled with the
  expert's action: the intervention data aggregated over the whole run, as HG-DAgger does (Kelly et al. 2019)
  and as PVP keeps its human buffer (Peng et al. 2023). With two actions, behaviour cloning a takeover step
  where the agent chose otherwise is exactly `algos.imitation.takeover_preference_loss` with beta 1 (sigmoid of
  log p - log(1 - p) is p). The share of steps taken over (`assist/takeover_rate`) is logged per update and
  should fall.

  The first design put that preference into PPO's minibatches instead (`takeover_coef` > 0, 0 by default): on
  the latest rollout's takeovers only, a mean over the few of them in each minibatch, with an actor gradient
  15-40 times PPO's. It breaks the policy (docs/control.md, "Demonstrations, DAgger and takeovers") and is
  kept only to measure against.

Success is the greedy policy on its own, no expert watching: an evaluation episode counts when it runs to the
environment's time limit without terminating (on CartPole-v1: 500 steps without the pole falling).

`feedbackrl train` runs it for a recipe with a `[control.assist]` section (`run_recipe`): the BC warm start,
then `algo.steps` updates of `run_assisted` (`recipes/cartpole_assist.toml`; the takeover rate and the greedy
success logged per update) or, with `mode = "dagger"`, `algo.steps` rounds of `dagger`
(`recipes/cartpole_dagger.toml`; the labels so far and the greedy success logged per round).
`benchmarks/bench_assist.py` drives the same functions for every arm of the comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from feedbackrl.algos.imitation import bc_loss, takeover_preference_loss
from feedbackrl.algos.ppo import ppo_policy_loss, value_loss, whiten
from feedbackrl.config import ConfigError, ControlPPOConfig, RunConfig
from feedbackrl.control.envs import make_vec_env, space_dims
from feedbackrl.control.policy import ActorCritic
from feedbackrl.control.rollout import Collector, annealed_lr, minibatch_indices, rollout_advantages
from feedbackrl.log import MetricsSink, console
from feedbackrl.train.checkpoint import ModuleFiles, save_checkpoint


def cartpole_expert(obs: np.ndarray) -> np.ndarray:
    """(E, 4) -> (E,) a linear controller that balances CartPole-v1 for 500 steps from every start tried
    (push towards where the pole is falling, and back towards the centre)."""
    x, x_dot, theta, theta_dot = obs.T
    return (theta + 0.5 * theta_dot + 0.05 * x + 0.2 * x_dot > 0).astype(np.int64)


def cartpole_about_to_fail(obs: np.ndarray, angle: float = 0.12, position: float = 1.8) -> np.ndarray:
    """(E, 4) -> (E,) bool: the pole past `angle` rad (CartPole-v1 ends at 0.2095) or the cart past
    `position` (it ends at 2.4)."""
    return (np.abs(obs[:, 2]) > angle) | (np.abs(obs[:, 0]) > position)


@dataclass(frozen=True)
class Expert:
    act: Callable[[np.ndarray], np.ndarray]  # (E, D) observations -> (E,) actions
    about_to_fail: Callable[[np.ndarray], np.ndarray]  # (E, D) -> (E,) bool


EXPERTS: dict[str, Expert] = {"CartPole-v1": Expert(cartpole_expert, cartpole_about_to_fail)}


@dataclass(frozen=True)
class AssistConfig:
    """The settings of `demonstrations`, `behaviour_clone`, `dagger` and `run_assisted`; `ppo` holds PPO's
    (its `steps` is not read: `updates` counts the rollouts)."""

    env: str = "CartPole-v1"
    num_envs: int = 8
    rollout_steps: int = 128
    demo_steps: int = 80  # environment steps of noisy demonstrations (all environments together)
    demo_noise: float = 0.3  # probability that a demonstrated action is replaced by a random one
    bc_steps: int = 300  # full-batch optimizer steps of behaviour cloning
    bc_lr: float = 1e-3
    dagger_steps: int = 50  # optimizer steps of behaviour cloning per DAgger round (warm-started)
    updates: int = 20  # PPO updates (or DAgger rounds) after the warm start, one rollout each
    takeover: bool = True  # the expert takes over where it judges the agent about to fail
    takeover_bc_steps: int = 50  # full-batch BC steps after each update on the demonstrations and every takeover
    takeover_coef: float = 0.0  # weight of the in-batch takeover preference loss beside PPO's (see run_assisted)
    takeover_beta: float = 1.0
    takeover_penalty: float = 1.0  # subtracted from the reward of every taken-over step (an intervention cost)
    eval_episodes: int = 10
    hidden: int = 64  # hidden width of the actor and critic MLPs
    ppo: ControlPPOConfig = field(default_factory=ControlPPOConfig)

    def __post_init__(self) -> None:
        if self.env not in EXPERTS:
            raise ValueError(f"no simulated expert for {self.env!r}; experts exist for {sorted(EXPERTS)}")
        if not 0 <= self.demo_noise <= 1:
            raise ValueError(f"demo_noise must be in [0, 1]; got {self.demo_noise}")


def new_policy(cfg: AssistConfig, seed: int) -> ActorCritic:
    envs = make_vec_env(cfg.env, 1)
    obs_dim, n_act, discrete = space_dims(envs)
    envs.close()
    if not discrete:
        raise ValueError("the simulated experts act in discrete action spaces")
    torch.manual_seed(seed)
    return ActorCritic(obs_dim, n_act, discrete, cfg.hidden)


def demonstrations(cfg: AssistConfig, seed: int) -> tuple[Tensor, Tensor]:
    """cfg.demo_steps noisy expert steps -> observations (N, D) and the executed actions (N,)."""
    expert, rng = EXPERTS[cfg.env], np.random.default_rng(seed)
    envs = make_vec_env(cfg.env, cfg.num_envs)
    obs, _ = envs.reset(seed=seed + 20_000)
    n_act = int(envs.single_action_space.n)
    out_obs, out_act = [], []
    while len(out_obs) * cfg.num_envs < cfg.demo_steps:
        act = expert.act(obs)
        noisy = rng.random(cfg.num_envs) < cfg.demo_noise
        act = np.where(noisy, rng.integers(0, n_act, cfg.num_envs), act)
        out_obs.append(obs.copy())
        out_act.append(act)
        obs, *_ = envs.step(act)
    envs.close()
    o = torch.as_tensor(np.concatenate(out_obs)[: cfg.demo_steps], dtype=torch.float32)
    return o, torch.as_tensor(np.concatenate(out_act)[: cfg.demo_steps])


def behaviour_clone(policy: ActorCritic, obs: Tensor, actions: Tensor, steps: int, lr: float) -> dict[str, float]:
    """Full-batch Adam on `algos.imitation.bc_loss` over (obs, actions); the actor only."""
    opt = torch.optim.Adam(policy.actor.parameters(), lr=lr)
    for _ in range(steps):
        logp, _, _ = policy.evaluate(obs, actions)
        loss, stats = bc_loss(logp, torch.ones_like(logp))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {k: float(v) for k, v in stats.items()}


@torch.no_grad()
def evaluate(policy: ActorCritic, cfg: AssistConfig, seed: int) -> dict[str, float]:
    """Greedy, no expert: one episode on each of cfg.eval_episodes environments seeded seed + i ->
    `eval/return` and `eval/success` (the share that reach the time limit without terminating)."""
    limit = gym.spec(cfg.env).max_episode_steps
    envs = make_vec_env(cfg.env, cfg.eval_episodes)
    obs, _ = envs.reset(seed=seed)
    ret, done = np.zeros(cfg.eval_episodes), np.zeros(cfg.eval_episodes, dtype=bool)
    length = np.zeros(cfg.eval_episodes, dtype=np.int64)
    gen = torch.Generator().manual_seed(seed)
    while not done.all():
        act, _, _ = policy.act(torch.as_tensor(obs, dtype=torch.float32), gen, greedy=True)
        obs, r, term, trunc, _ = envs.step(act.numpy())
        ret += np.where(done, 0.0, r)
        length += ~done
        done |= term | trunc
    envs.close()
    return {"eval/return": float(ret.mean()), "eval/success": float((length >= limit).mean())}


class Supervised:
    """The agent acting under the expert's eye, for `Collector.collect`: where the expert judges the state about
    to fail, its action is executed; the agent's own sample (and its log-prob) is kept beside it."""

    def __init__(self, policy: ActorCritic, expert: Expert, takeover: bool) -> None:
        self.policy, self.critic, self.expert, self.takeover = policy, policy.critic, expert, takeover
        self.taken: list[Tensor] = []
        self.agent_actions: list[Tensor] = []
        self.expert_actions: list[Tensor] = []

    def act(self, obs: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        actions, logp, values = self.policy.act(obs, generator)
        expert = torch.as_tensor(self.expert.act(obs.numpy()))
        taken = torch.as_tensor(self.expert.about_to_fail(obs.numpy())) & self.takeover
        self.taken.append(taken)
        self.agent_actions.append(actions)
        self.expert_actions.append(expert)
        return torch.where(taken, expert, actions), logp, values

    def values(self, obs: Tensor) -> Tensor:
        return self.policy.values(obs)

    def pop(self) -> tuple[Tensor, Tensor, Tensor]:
        """(T, E) takeover mask, agent actions, expert actions of the last collect."""
        out = torch.stack(self.taken), torch.stack(self.agent_actions), torch.stack(self.expert_actions)
        self.taken, self.agent_actions, self.expert_actions = [], [], []
        return out


def assisted_update(policy: ActorCritic, optimizer: torch.optim.Optimizer, batch: dict[str, Tensor],
                    cfg: AssistConfig, generator: torch.Generator) -> dict[str, float]:
    """PPO epochs over minibatches: the clipped loss on the agent's own steps, the value loss on all, and the
    takeover preference loss on taken-over steps where the expert and the agent chose differently. `batch`
    holds flat (N, ...) obs, actions (executed), agent_actions, expert_actions, taken, logprobs (the agent's, of
    its own action), values, advantages (whitened), returns. The preference loss is weighted cfg.takeover_coef
    (0 by default: see run_assisted); `takeover/expert_prob` is logged either way."""
    a = cfg.ppo
    n = batch["obs"].shape[0]
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for idx in minibatch_indices(n, a.minibatches, a.epochs, generator):
        b = {k: v[idx] for k, v in batch.items()}
        own = ~b["taken"]
        logp, entropy, values = policy.evaluate(b["obs"], b["agent_actions"])
        pl, pstats = ppo_policy_loss(logp[:, None], b["logprobs"][:, None], b["advantages"][:, None],
                                     own.float()[:, None], a.clip)
        vl, _ = value_loss(values, b["values"], b["returns"], torch.ones_like(values), a.value_clip)
        loss = pl + a.vf_coef * vl - a.ent_coef * entropy.mean()
        prefer = b["taken"] & (b["expert_actions"] != b["agent_actions"])
        tl, tstats = torch.zeros(()), {}
        if b["taken"].any():
            expert_logp, _, _ = policy.evaluate(b["obs"], b["expert_actions"])
            tstats["takeover/expert_prob"] = expert_logp.detach().exp()[b["taken"]].mean()
            if prefer.any():
                tl, more = takeover_preference_loss(expert_logp, logp, prefer.float(), cfg.takeover_beta)
                tstats.update(more)
                loss = loss + cfg.takeover_coef * tl
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), a.max_grad_norm)
        optimizer.step()
        for k, v in {"loss/policy": pl, "loss/value": vl, "loss/takeover": tl, **pstats, **tstats}.items():
            totals[k] = totals.get(k, 0.0) + float(v.detach())
            counts[k] = counts.get(k, 0) + 1
    # a takeover statistic is the mean over the minibatches that had takeovers; the losses over all of them
    return {k: v / counts[k] for k, v in totals.items()}


def run_assisted(policy: ActorCritic, cfg: AssistConfig, seed: int, demos: tuple[Tensor, Tensor] | None = None,
                 on_update: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """cfg.updates PPO updates on the environment's reward, the expert taking over where it judges the agent
    about to fail (cfg.takeover), each followed by behaviour cloning on `demos` (observations, actions; none:
    the takeovers alone) and every takeover so far. -> one metrics dict per update (and the evaluation before the
    first), each also passed to `on_update` as it is made."""
    expert, a = EXPERTS[cfg.env], cfg.ppo
    collector = Collector(make_vec_env(cfg.env, cfg.num_envs), seed)
    agent = Supervised(policy, expert, cfg.takeover)
    optimizer = torch.optim.Adam(policy.parameters(), lr=a.lr, eps=1e-5)
    gen = torch.Generator().manual_seed(seed)
    labelled_obs, labelled_actions = ([demos[0]], [demos[1]]) if demos is not None else ([], [])
    labels = 0  # takeover steps so far: the expert's labels, beside the demonstrations
    log: list[dict[str, Any]] = [{"update": 0, "env_steps": 0, **evaluate(policy, cfg, seed + 10_000)}]
    for u in range(1, cfg.updates + 1):
        for group in optimizer.param_groups:
            group["lr"] = annealed_lr(a.lr, u, cfg.updates, a.lr_final)
        ro = collector.collect(agent, cfg.rollout_steps, gen)
        taken, agent_actions, expert_actions = agent.pop()
        rewards = ro.rewards - cfg.takeover_penalty * taken.float()
        adv, ret = rollout_advantages(rewards, ro.values[..., 0], ro.terminated, ro.truncated,
                                      ro.boot_values[..., 0], ro.last_values[..., 0], a.gamma, a.lam)
        own = ~taken
        flat = {"obs": ro.obs, "agent_actions": agent_actions, "expert_actions": expert_actions, "taken": taken,
                "logprobs": ro.logprobs, "values": ro.values, "returns": ret[..., None],
                "advantages": whiten(adv, own.float()) if own.any() else adv}
        batch = {k: v.reshape(-1, *v.shape[2:]) for k, v in flat.items()}
        stats = assisted_update(policy, optimizer, batch, cfg, gen)
        labelled_obs.append(batch["obs"][batch["taken"]])
        labelled_actions.append(batch["expert_actions"][batch["taken"]])
        labels += int(taken.sum())
        if cfg.takeover and cfg.takeover_bc_steps > 0 and sum(len(x) for x in labelled_obs):
            bc = behaviour_clone(policy, torch.cat(labelled_obs), torch.cat(labelled_actions), cfg.takeover_bc_steps,
                                 cfg.bc_lr)
            stats.update({f"takeover_{k}": v for k, v in bc.items()})
        stats["assist/takeover_labels"] = float(labels)
        eps = ro.episodes
        log.append({"update": u, "env_steps": u * cfg.num_envs * cfg.rollout_steps,
                    "assist/takeover_rate": float(taken.float().mean()),
                    "episode/return": float(np.mean([e["return"] for e in eps])) if eps else float("nan"),
                    **stats, **evaluate(policy, cfg, seed + 10_000)})
        if on_update is not None:
            on_update(log[-1])
    collector.envs.close()
    return log


def assist_config(cfg: RunConfig) -> AssistConfig:
    """A recipe's `[control]` with its `[control.assist]`, and `[algo]` (PPO; `algo.steps` updates) ->
    AssistConfig; an environment without a simulated expert is refused here, before any work."""
    c, s = cfg.control, cfg.control.assist
    if c.env not in EXPERTS:
        raise ConfigError(f"[control.assist] needs a simulated expert for control.env = {c.env!r}; experts exist "
                          f"for {sorted(EXPERTS)} (control/assist.py EXPERTS)")
    return AssistConfig(env=c.env, num_envs=c.num_envs, rollout_steps=c.rollout_steps, demo_steps=s.demo_steps,
                        demo_noise=s.demo_noise, bc_steps=s.bc_steps, bc_lr=s.bc_lr, updates=cfg.algo.steps,
                        takeover=s.takeover, takeover_bc_steps=s.takeover_bc_steps,
                        takeover_penalty=s.takeover_penalty, dagger_steps=s.dagger_steps,
                        eval_episodes=c.eval_episodes, hidden=c.hidden, ppo=cfg.algo)


def run_recipe(cfg: RunConfig, out_dir: Path, ckpt: Path | None, sink: MetricsSink) -> dict[str, Any]:
    """`feedbackrl train` with `[control.assist]`: behaviour cloning on the expert's noisy demonstrations, then
    `algo.steps` updates of `run_assisted` (mode = "takeover") or rounds of `dagger` (mode = "dagger", the
    demonstrations its first labels); the final policy saved as a control checkpoint (`feedbackrl eval` reads it).
    -> the report's control section."""
    if ckpt is not None:
        raise ConfigError("--resume: a run with [control.assist] cannot continue from a checkpoint yet (its "
                          "expert labels are not saved); start the run again")
    a, seed = assist_config(cfg), cfg.train.seed
    policy = new_policy(a, seed)
    before = evaluate(policy, a, seed + 10_000)
    sink.log(0, {"phase": "eval", "env_steps": 0, **before})
    demos = demonstrations(a, seed) if a.demo_steps else None
    warm = before
    if demos is not None and a.bc_steps:
        bc = behaviour_clone(policy, *demos, a.bc_steps, a.bc_lr)
        warm = evaluate(policy, a, seed + 10_000)
        sink.log(0, {"phase": "bc", "env_steps": 0, "bc/demo_steps": len(demos[1]), **bc, **warm})
        console.print(f"behaviour cloning on {len(demos[1])} demonstration steps: greedy return "
                      f"{before['eval/return']:.1f} -> {warm['eval/return']:.1f}, success {warm['eval/success']:.2f}")

    def on_update(row: dict[str, Any]) -> None:
        sink.log(row["update"], {"phase": "rl", **{k: v for k, v in row.items() if k != "update"}})

    envs = make_vec_env(a.env, 1)
    obs_dim, act_dim, discrete = space_dims(envs)
    envs.close()
    t0 = time.perf_counter()
    if cfg.control.assist.mode == "dagger":  # the demonstrations are the first labels (none: an empty start)
        start = demos if demos is not None else (torch.empty(0, obs_dim), torch.empty(0, dtype=torch.int64))
        log = dagger(policy, a, seed, *start, on_update)
    else:
        log = run_assisted(policy, a, seed, demos, on_update)
    train_s = time.perf_counter() - t0
    model_config = {"obs_dim": obs_dim, "action_dim": act_dim, "discrete": discrete, "hidden": a.hidden,
                    "value_heads": 1, "env": a.env}
    # a control checkpoint (`feedbackrl eval` reads it) without what a resume needs: an assisted run does not resume
    save_checkpoint(out_dir, a.updates, ModuleFiles(policy, model_config), None, {}, cfg.model_dump_json(indent=2),
                    {"eval_before": before})
    after = {k: v for k, v in log[-1].items() if k.startswith("eval/")}
    report = {"env": a.env, "reward_signal": "env", "env_steps": a.updates * a.num_envs * a.rollout_steps,
              "control_eval_before": before, "control_eval_bc": warm, "control_eval_after": after,
              "train_seconds": train_s}
    n_demo = len(demos[1]) if demos is not None else 0
    if cfg.control.assist.mode == "dagger":
        labels = int(log[-1].get("dagger/labels", n_demo))
        console.print(f"{a.env}: greedy success {before['eval/success']:.2f} -> {warm['eval/success']:.2f} (BC) -> "
                      f"{after['eval/success']:.2f} over {a.eval_episodes} held-out episodes after {a.updates} "
                      f"DAgger rounds; {labels - n_demo} states labelled by the expert beside {n_demo} "
                      "demonstration steps")
        return {**report, "assist": {"mode": "dagger", "demo_steps": n_demo, "rounds": a.updates,
                                     "dagger_labels": labels - n_demo, "labels": labels}}
    rates = [r["assist/takeover_rate"] for r in log[1:]]
    k = max(1, len(rates) // 4)
    summary = {"takeover_labels": log[-1].get("assist/takeover_labels", 0.0) if rates else 0.0,
               "takeover_rate_first_quarter": float(np.mean(rates[:k])) if rates else 0.0,
               "takeover_rate_last_quarter": float(np.mean(rates[-k:])) if rates else 0.0}
    console.print(f"{a.env}: greedy success {before['eval/success']:.2f} -> {warm['eval/success']:.2f} (BC) -> "
                  f"{after['eval/success']:.2f} over {a.eval_episodes} held-out episodes; takeover rate "
                  f"{summary['takeover_rate_first_quarter']:.3f} -> {summary['takeover_rate_last_quarter']:.3f} "
                  f"(first and last quarter of the updates), {summary['takeover_labels']:.0f} expert labels")
    return {**report, "assist": {"demo_steps": n_demo, **summary}}


def dagger(policy: ActorCritic, cfg: AssistConfig, seed: int, obs: Tensor, actions: Tensor,
           on_update: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """cfg.updates DAgger rounds from the demonstrations (obs, actions; may be empty): roll the agent out (no
    takeovers, its own sampled actions), label every visited state with the expert's action, behaviour-clone
    (cfg.dagger_steps full-batch steps) on all labels so far. -> one metrics dict per round (and the evaluation
    before the first), each round's also passed to `on_update` as it is made; `dagger/labels` counts all labels
    so far, the demonstrations included."""
    expert = EXPERTS[cfg.env]
    collector = Collector(make_vec_env(cfg.env, cfg.num_envs), seed)
    gen = torch.Generator().manual_seed(seed)
    log: list[dict[str, Any]] = [{"update": 0, "env_steps": 0, **evaluate(policy, cfg, seed + 10_000)}]
    for u in range(1, cfg.updates + 1):
        ro = collector.collect(policy, cfg.rollout_steps, gen)
        visited = ro.obs.reshape(-1, ro.obs.shape[-1])
        relabel = torch.as_tensor(expert.act(visited.numpy()))
        disagree = float((relabel != ro.actions.reshape(-1)).float().mean())
        obs, actions = torch.cat([obs, visited]), torch.cat([actions, relabel])
        stats = behaviour_clone(policy, obs, actions, cfg.dagger_steps, cfg.bc_lr)
        log.append({"update": u, "env_steps": u * cfg.num_envs * cfg.rollout_steps, "dagger/disagreement": disagree,
                    "dagger/labels": len(actions), **stats, **evaluate(policy, cfg, seed + 10_000)})
        if on_update is not None:
            on_update(log[-1])
    collector.envs.close()
    return log
