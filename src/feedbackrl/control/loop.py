"""The PPO loop for control policies: `feedbackrl train` with `algo.name = "control_ppo"` and a `[control]`.

Each step, read top to bottom: (1) roll out control.num_envs environments for control.rollout_steps steps;
(2) the reward: the environment's, or, with control.reward = "preferences", a labelling round when one is
due and the learned reward; (3) advantages with GAE (`rollout.rollout_advantages` over `algos.ppo.gae`),
whitened with `algos.ppo.whiten`; with a [constraint], the cost's advantages from a second value head,
combined with `algos.constrained.combined_advantages` under the text loop's `train/constraint.py:Multiplier`
(gradient ascent on log lambda or PID, `constraint.bound_delta` included), stepped on the rollout's cost or,
with `constraint.probe_envs`, on the cost of the same policy acting greedily on probe environments of its own;
(4) PPO epochs over shuffled minibatches with `algos.ppo.ppo_policy_loss` and `value_loss`; (5) log; (6) the
periodic eval and the monitors; (7) the monitors' actions; then the periodic checkpoint.

Shared with the text loop (`train/onpolicy.py:train_on_policy`):
- the losses and advantages in `algos/` and the `Multiplier`;
- the checkpoint writer and reader (`train/checkpoint.py`: `save_checkpoint`, `restore`, `load_extra`): the
  same `checkpoints/step_N/` layout, atomic write, `trainer_state.pt` (step, optimizer, the global torch RNG,
  the loop's named streams: here `generator` and the reward model's `learner_generator`; the loop's own state:
  here the environments mid-episode, the reward model and its labels, the held-out eval before training),
  the algorithm's extra files (the multiplier in `constraint.pt`, as the text objectives write it) and
  `run_config.json`; only the policy's files differ, behind `PolicyFiles`: `ModuleFiles` writes this plain
  torch module's `policy.pt` and its shape in `config.json`, where a text run saves a Hugging Face model.
  `--resume` takes a run or a checkpoint directory alike; `train.save_optimizer` acts as for text;
- the monitors and their actions (`train/monitoring.py`): `after_step` runs the periodic eval and the
  detectors over this loop's metric rows (with a learned reward, `monitor/proxy_mean` and `monitor/gold_mean`
  feed `proxy_gold`), `stop` ends the run at the alert's step, `rollback` is the text loop's `roll_back` to the
  latest checkpoint (the policy with its value heads and the optimizer; here the multiplier too, as a text
  objective reloads its own), re-arming the detectors and turning into a stop after `max_rollbacks`;
- the metrics sink and the report and plot of the run path (`train/run.py` runs this as a whole-run entry),
  and, with control.preferences.labels_from = "app", the labelling app and the online loop's `LabelQueue`
  (control/app_labels.py).

Not shared: `raise_kl` (control PPO has no KL term or frozen reference, so a control recipe cannot ask for
it), and the step itself. One step function for both loops would need (a) the control rollout as a `Batch`
behind the `Collector` contract (`episodes/contracts.py`), whose rows are token sequences (prompt and
completion ids and masks, texts, verdicts) and whose collect step takes the text loop's two streams (prompts,
samples), where a control rollout is (T, E) environment steps with terminations, truncations and bootstrap
values, drawn with one generator that also shuffles the minibatches; (b) the `Objective` contract generalised
past `PreTrainedModel` and token tensors: its `prepare` gets a no-grad pass over the batch's token rows and the
frozen reference's log-probs, its `loss` a micro-batch's token tensors with token-count normalisers; a control
objective (GAE and the multiplier over the (T, E) rollout in `prepare`, the PPO loss over flat environment
steps in `loss`) fits the shape of that contract but not its types; (c) the text loop's machinery made
optional per task kind (the frozen reference, `train.precision` autocast, micro-batches, `torchrun` ranks and
sharding, Ray and vLLM collectors, probe prompts, transcripts, staleness); and (d) this loop's own choices kept,
to leave its results unchanged: a permutation drawn every epoch even with one minibatch, Adam with eps 1e-5
(the text loop uses fused AdamW), the learning rate annealed linearly (to 0 unless algo.lr_final), the
labelling rounds inside the step. That is a change to every objective and collector, not a wrapper over the two
loops; until it is made, the two loops share everything after the update (steps 6 and 7 and the checkpoint) by
calling the same functions.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from feedbackrl.algos.constrained import combined_advantages
from feedbackrl.algos.ppo import ppo_policy_loss, value_loss, whiten
from feedbackrl.config import ConfigError, ConstraintConfig, ControlAssistConfig, ControlPPOConfig, RunConfig
from feedbackrl.control.assist import run_recipe
from feedbackrl.control.envs import COSTS, CostFn, make_vec_env, space_dims
from feedbackrl.control.policy import ActorCritic
from feedbackrl.control.preferences import PreferenceLearner
from feedbackrl.control.rollout import Collector, Rollout, annealed_lr, minibatch_indices, rollout_advantages
from feedbackrl.log import MetricsSink, console, progress
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.monitors.report import alerts_section
from feedbackrl.train.checkpoint import (
    CONFIG_FILE,
    MODEL_CONFIG,
    ModuleFiles,
    latest_checkpoint,
    load_extra,
    restore,
    save_checkpoint,
)
from feedbackrl.train.constraint import CONSTRAINT_FILE, Multiplier
from feedbackrl.train.monitoring import after_step, roll_back

# Environment i of each kind is seeded train.seed + offset + i (training environments: offset 0).
HELDOUT_SEED_OFFSET = 10_000  # the greedy held-out episodes of `evaluate` (report.json, `feedbackrl eval`)
PROBE_SEED_OFFSET = 30_000  # the greedy probe environments of constraint.probe_envs (at most 10,000 of them)
READING_SEED_OFFSET = 50_000  # the held-out readings of benchmarks/policy_cost.py


def probe_seeds(seed: int, n_envs: int) -> list[int]:
    """The seeds of `constraint.probe_envs` greedy probe environments: train.seed + 30,000 + i. Apart from the
    training environments (seed + i), the greedy held-out episodes (seed + 10,000 + i) and the held-out readings of
    `benchmarks/policy_cost.py` (seed + 50,000 + i), for up to 10,000 of each."""
    return [seed + PROBE_SEED_OFFSET + i for i in range(n_envs)]


def _cost_fn(name: str) -> CostFn | None:
    if not name:
        return None
    if name not in COSTS:
        raise ConfigError(f"control.cost = {name!r} is not a known cost; choose one of {sorted(COSTS)}")
    return COSTS[name]


@torch.no_grad()
def evaluate(policy: ActorCritic, cfg: RunConfig, seed: int) -> dict[str, float]:
    """Greedy actions on control.eval_episodes fresh episodes (env i seeded seed + i): the means of their
    return, length and cost (`eval/return`, `eval/length`, `eval/cost`) and of the environment's closed-loop
    metrics (a driving environment's `eval/collision`, `eval/distance`, ...)."""
    c = cfg.control
    collector = Collector(make_vec_env(c.env, c.eval_episodes, c.env_options), seed, _cost_fn(c.cost))
    first: dict[int, dict[str, float]] = {}
    gen = torch.Generator().manual_seed(seed)
    while len(first) < c.eval_episodes:
        for ep in collector.collect(_Greedy(policy), 16, gen).episodes:
            first.setdefault(int(ep["env"]), ep)
    collector.envs.close()
    return _means(list(first.values()), "eval")


def _means(episodes: list[dict[str, float]], prefix: str) -> dict[str, float]:
    """The episodes' means of return, length, cost and every closed-loop metric they all report (a driving
    environment's collision, distance, ...: `driving.py`), as `prefix/name`."""
    keys = [k for k in episodes[0] if k != "env" and all(k in e for e in episodes)]
    return {f"{prefix}/{k}": float(np.mean([e[k] for e in episodes])) for k in keys}


class _Greedy:
    """The policy taking its greedy action (for `Collector.collect` in evaluation)."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy, self.critic = policy, policy.critic

    def act(self, obs: torch.Tensor, generator: torch.Generator) -> Any:
        return self.policy.act(obs, generator, greedy=True)

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.values(obs)


def _given(section: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """A saved config section without the entries that hold the model's defaults."""
    return {k: v for k, v in section.items() if v != model.model_fields[k].default}


def load_checkpoint(ckpt: Path) -> tuple[ActorCritic, RunConfig]:
    """A control checkpoint dir -> its policy (in eval mode) and the run's config."""
    saved = json.loads((ckpt / CONFIG_FILE).read_text())  # every field written; a control run reads these
    # every field was written, defaults too: where a setting's mere presence is refused beside another (constraint.kd
    # with multiplier = "lagrangian", algo.lr or control.assist.takeover with control.assist.mode = "dagger"), a
    # default would read as set, so the defaults of those sections are dropped
    if saved.get("constraint") is not None:
        saved["constraint"] = _given(saved["constraint"], ConstraintConfig)
    assist = (saved.get("control") or {}).get("assist")
    if assist is not None:
        saved["control"]["assist"] = _given(assist, ControlAssistConfig)
        saved["algo"] = {"name": saved["algo"]["name"], **_given(saved["algo"], ControlPPOConfig)}
    cfg = RunConfig.model_validate({k: saved[k] for k in ("algo", "control", "train", "constraint")
                                    if saved.get(k) is not None})
    m = json.loads((ckpt / MODEL_CONFIG).read_text())
    policy = ActorCritic(m["obs_dim"], m["action_dim"], m["discrete"], m["hidden"], value_heads=m["value_heads"])
    policy.load_state_dict(ModuleFiles(policy, m).load_weights(ckpt))
    return policy.eval(), cfg


def eval_checkpoint(ckpt: Path, video: Path | None = None, max_steps: int = 500) -> dict[str, Any]:
    """`feedbackrl eval` of a control run: the greedy held-out evaluation of training (`eval/*`, the same
    seeds) and, with `video`, a clip (.gif or .mp4) of the first held-out episode, cut at `max_steps`."""
    policy, cfg = load_checkpoint(ckpt)
    seed = cfg.train.seed + HELDOUT_SEED_OFFSET
    result: dict[str, Any] = {"checkpoint": str(ckpt), "env": cfg.control.env, **evaluate(policy, cfg, seed)}
    if video is not None:
        from feedbackrl.control.video import record_episode, write_video

        frames, episode = record_episode(policy, cfg.control.env, cfg.control.env_options, seed, max_steps)
        result["video"] = {"path": str(write_video(frames, video)), "frames": len(frames),
                           **{f"episode/{k}": v for k, v in episode.items()}}
    return result


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(T, E, ...) -> (T*E, ...)."""
    return x.reshape(-1, *x.shape[2:])


def ppo_update(policy: ActorCritic, optimizer: torch.optim.Optimizer, ro: Rollout, advantages: torch.Tensor,
               returns: torch.Tensor, a: ControlPPOConfig, generator: torch.Generator) -> dict[str, float]:
    """algo.epochs passes of algo.minibatches minibatch steps; advantages (T, E), returns (T, E, H)."""
    obs, actions, old_logp = _flat(ro.obs), _flat(ro.actions), _flat(ro.logprobs)
    old_values, adv, ret = _flat(ro.values), _flat(advantages), _flat(returns)
    n = obs.shape[0]
    size = n // a.minibatches
    totals: dict[str, float] = {}
    for idx in minibatch_indices(n, a.minibatches, a.epochs, generator):
        logp, entropy, values = policy.evaluate(obs[idx], actions[idx])
        ones = torch.ones(size, 1)
        pl, pstats = ppo_policy_loss(logp[:, None], old_logp[idx][:, None], adv[idx][:, None], ones, a.clip)
        vl, vstats = value_loss(values, old_values[idx], ret[idx], torch.ones_like(values), a.value_clip)
        loss = pl + a.vf_coef * vl - a.ent_coef * entropy.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), a.max_grad_norm)
        optimizer.step()
        for k, v in {"loss/policy": pl, "loss/value": vl, "policy/entropy": entropy.mean(),
                     "grad_norm": grad_norm, **pstats, "value/clip_frac": vstats["value/clip_frac"]}.items():
            totals[k] = totals.get(k, 0.0) + float(v.detach()) / (a.epochs * a.minibatches)
    return totals


class _NoCompletions:
    """A control update as a monitor's batch: no completions (its statistics come in the metrics row)."""

    problems: list = []
    texts: list = []
    verdicts: list = []


_NO_COMPLETIONS = _NoCompletions()


def run_control(cfg: RunConfig, out_dir: Path, ckpt: Path | None, sink: MetricsSink) -> dict[str, Any]:
    """Train a control policy with PPO (docs/control.md); -> the report's control section. With
    `[control.assist]`, PPO beside a simulated expert's demonstrations and takeovers (`assist.run_recipe`)."""
    if cfg.control.assist is not None:
        return run_recipe(cfg, out_dir, ckpt, sink)
    c, a, seed = cfg.control, cfg.algo, cfg.train.seed
    torch.manual_seed(seed)
    from_app = c.reward == "preferences" and c.preferences.labels_from == "app"
    stack = contextlib.ExitStack()  # the labelling app, when the labels come from it
    ask, shrink = None, None
    if from_app:
        from feedbackrl.control.app_labels import AppLabels
        from feedbackrl.control.video import headless, shrink

        headless()
        ask = stack.enter_context(AppLabels(cfg, out_dir))
    # the app's clips are rendered from the training environments (rendering changes nothing else)
    envs = make_vec_env(c.env, c.num_envs, {**c.env_options, **({"render_mode": "rgb_array"} if from_app else {})})
    obs_dim, act_dim, discrete = space_dims(envs)
    heads = 2 if cfg.constraint is not None else 1
    policy = ActorCritic(obs_dim, act_dim, discrete, c.hidden, value_heads=heads)
    model_config = {"obs_dim": obs_dim, "action_dim": act_dim, "discrete": discrete, "hidden": c.hidden,
                    "value_heads": heads, "env": c.env}
    optimizer = torch.optim.Adam(policy.parameters(), lr=a.lr, eps=1e-5)
    gen = torch.Generator().manual_seed(seed)
    collector = Collector(envs, seed, _cost_fn(c.cost))
    learner = PreferenceLearner(c.preferences, obs_dim, act_dim, discrete, a.steps,
                                torch.Generator().manual_seed(seed + 1), ask) if c.reward == "preferences" else None
    multiplier = Multiplier.from_config(cfg.constraint) if cfg.constraint is not None else None
    k = cfg.constraint
    # constraint.probe_envs: the multiplier's cost is the current policy's greedy cost on environments of its own
    probe_seed = seed + PROBE_SEED_OFFSET  # environment i: probe_seeds(seed, n)[i]
    probe = Collector(make_vec_env(c.env, k.probe_envs, c.env_options), probe_seed, _cost_fn(c.cost)) \
        if k is not None and k.probe_envs else None
    probe_gen = torch.Generator().manual_seed(probe_seed) if probe is not None else None
    monitor = Monitor(cfg.monitors, out_dir) if cfg.monitors.enabled else None
    files = ModuleFiles(policy, model_config)  # the checkpoints' policy files: policy.pt and config.json
    rngs = {"generator": gen, **({"learner_generator": learner.generator} if learner is not None else {}),
            **({"probe_generator": probe_gen} if probe_gen is not None else {})}
    start, before, last = 0, None, None
    if ckpt is not None:
        policy.load_state_dict(files.load_weights(ckpt))
        saved = restore(ckpt, optimizer, rngs)
        collector.load_state_dict(saved.loop_state["collector"])  # the environments mid-episode
        if probe is not None:
            probe.load_state_dict(saved.loop_state["probe_collector"])
        if learner is not None:
            learner.load_state_dict(saved.loop_state["learner"])
        if multiplier is not None:
            multiplier.load_state_dict(load_extra(ckpt, CONSTRAINT_FILE))
        start, before, last = saved.step, saved.loop_state["eval_before"], saved.loop_state["episode_means"]
    else:
        before = evaluate(policy, cfg, seed + HELDOUT_SEED_OFFSET)
        sink.log(0, {"phase": "eval", **before})

    def checkpoint(step: int) -> None:  # the text loop's writer: train/checkpoint.py
        loop_state = {"collector": collector.state_dict(), "eval_before": before, "episode_means": last,
                      **({"learner": learner.state_dict()} if learner is not None else {}),
                      **({"probe_collector": probe.state_dict()} if probe is not None else {})}
        optimizer_state = optimizer.state_dict() if cfg.train.save_optimizer else None
        save_checkpoint(out_dir, step, files, optimizer_state, rngs, cfg.model_dump_json(indent=2), loop_state,
                        {CONSTRAINT_FILE: multiplier.state_dict()} if multiplier is not None else None)

    def on_eval(step: int) -> dict[str, float]:
        return evaluate(policy, cfg, seed + HELDOUT_SEED_OFFSET)

    if monitor is not None and monitor.needs_rollback and latest_checkpoint(out_dir) is None:
        checkpoint(start)  # something to roll back to before the first periodic checkpoint
    steps_per_update = c.num_envs * c.rollout_steps
    t0, end = time.perf_counter(), a.steps
    with stack, progress() as bar:
        task = bar.add_task("control_ppo", total=a.steps, completed=start, info="")
        for step in range(start + 1, a.steps + 1):
            for group in optimizer.param_groups:  # linear annealing to algo.lr_final x lr (0: CleanRL's schedule)
                group["lr"] = annealed_lr(a.lr, step, a.steps, a.lr_final)
            # 1. roll out
            t_roll = time.perf_counter()
            clips = shrink if learner is not None and ask is not None and learner.round_due(step - 1) else None
            ro = collector.collect(policy, c.rollout_steps, gen, clips)
            roll_s = time.perf_counter() - t_roll
            metrics: dict[str, Any] = {"phase": "rl", "env_steps": step * steps_per_update}
            # 2. the reward the policy learns from
            rewards = ro.rewards
            if learner is not None:
                metrics.update(learner.query(step - 1, ro))
                rewards, spread = learner.rewards(ro)
                metrics["reward/ensemble_std"] = float(spread.mean())
                metrics.update(learner.proxy_and_gold(ro))
            # 3. advantages
            adv, ret = rollout_advantages(rewards, ro.values[..., 0], ro.terminated, ro.truncated,
                                          ro.boot_values[..., 0], ro.last_values[:, 0], a.gamma, a.lam)
            ones = torch.ones(1, adv.numel())
            adv_w = whiten(adv.reshape(1, -1), ones).view_as(adv)
            returns = ret.unsqueeze(-1)
            if multiplier is not None:
                adv_c, ret_c = rollout_advantages(ro.costs, ro.values[..., 1], ro.terminated, ro.truncated,
                                                  ro.boot_values[..., 1], ro.last_values[:, 1], a.gamma, a.lam)
                if probe is None:  # each training environment's cost per step over this rollout (sampled)
                    cstats = multiplier.update(ro.costs.mean(0))
                else:  # each probe environment's cost per step, the policy that made this rollout acting greedily
                    t_probe, cpu_probe = time.perf_counter(), time.process_time()
                    probe_ro = probe.collect(_Greedy(policy), k.probe_steps, probe_gen)
                    cstats = multiplier.update(probe_ro.costs.mean(0))
                    cstats.update({"constraint/probe_cost": float(probe_ro.costs.mean()),
                                   "constraint/probe_episodes": len(probe_ro.episodes),
                                   "perf/probe_s": time.perf_counter() - t_probe,
                                   "perf/probe_cpu_s": time.process_time() - cpu_probe})
                adv_w = combined_advantages(adv_w, whiten(adv_c.reshape(1, -1), ones).view_as(adv_c), multiplier.lam)
                returns = torch.stack([ret, ret_c], -1)
                metrics.update(cstats)
            # 4. optimise
            metrics.update(ppo_update(policy, optimizer, ro, adv_w, returns, a, gen))
            # 5. log
            metrics.update({"reward/mean": float(rewards.mean()), "reward/gold_mean": float(ro.rewards.mean()),
                            "cost/mean": float(ro.costs.mean()), "episodes": len(ro.episodes),
                            "perf/env_steps_per_s_rollout": steps_per_update / max(roll_s, 1e-9)})
            if ro.episodes:
                last = _means(ro.episodes, "episode")
            metrics.update(last or {})
            # 6. periodic eval and the monitors, as in the text loop (train/monitoring.py); a control step has no
            # completions, so the text detectors see none and stay quiet (no KL term: no algo/kl_coef)
            decision = after_step(cfg, step, _NO_COMPLETIONS, metrics, monitor, on_eval, None)
            sink.log(step, metrics)
            bar.update(task, advance=1, info=f"return {metrics.get('episode/return', float('nan')):.1f}")
            # 7. the recipe's actions on this step's alerts, the text loop's (a rolled-back step is not checkpointed)
            if decision is not None and monitor is not None:
                if decision.stop:
                    end = step
                    console.print(f"monitors stopped the run at step {step}: {decision.alerts[0].message}")
                    break
                if decision.rollback:
                    back = roll_back(out_dir, files, policy, optimizer, monitor)  # the policy and its value heads
                    if multiplier is not None:  # lambda as it was at that checkpoint
                        multiplier.load_state_dict(load_extra(back, CONSTRAINT_FILE))
                    continue
            every = cfg.train.checkpoint_every
            if every and step % every == 0 and step < a.steps:
                checkpoint(step)
    if start < a.steps:
        checkpoint(end)
    train_s = time.perf_counter() - t0
    last_step = end if a.steps > start else start
    after = evaluate(policy, cfg, seed + HELDOUT_SEED_OFFSET)
    sink.log(last_step, {"phase": "eval", **after})
    collector.envs.close()
    if probe is not None:
        probe.envs.close()
    console.print(f"{c.env}: greedy return {before['eval/return']:.1f} -> {after['eval/return']:.1f} over "
                  f"{c.eval_episodes} held-out episodes")
    report = {"env": c.env, "reward_signal": c.reward, "env_steps": last_step * steps_per_update,
              "control_eval_before": before, "control_eval_after": after, "train_seconds": train_s}
    if monitor is not None:
        report["alerts"] = alerts_section(out_dir)  # as a text run's report has them
        if last_step < a.steps:
            report["stopped_at"] = last_step
    if learner is not None:
        report["labels"] = learner.asked
    if ask is not None:
        report["app_labels"] = {"project_id": ask.api.project, "items": ask.asked_items,
                                "labelled_pairs": len(learner.labels), "labeller": c.preferences.app.labeller}
    return report
