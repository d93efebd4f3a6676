"""Why the in-batch takeover preference broke the policy: the measurements behind docs/control.md.

Run: .venv/bin/python benchmarks/assist_diagnose.py [--seeds 0,1,2]
Writes benchmarks/results/assist_diagnose.json (provenance included).

Per seed, from the same behaviour-cloned warm start as benchmarks/bench_assist.py and one rollout of 8 x 128
steps with the expert taking over (AssistConfig's defaults):
- gradient norms on one minibatch of 256 steps (PPO's minibatch size there): PPO's clipped loss on the agent's
  own steps and the takeover preference loss (its mean over the minibatch's taken-over steps where the agent
  chose otherwise), each on the actor; the value loss (times vf_coef) on the critic; the joint norm and the
  clipping factor max_grad_norm / joint norm;
- the takeover preference loss alone, 160 Adam steps (PPO's lr; 10 updates' worth of 4 x 4 minibatch steps)
  on that rollout's taken-over steps where the agent chose otherwise: the policy's probability of the expert's
  action there and the greedy success (no expert) every 32 steps; and the same with an anchor on the states
  the expert did not label: KL(pi_warm || pi) over the rollout's own steps, weight 10.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, setup_threads  # noqa: E402

from feedbackrl.algos.imitation import takeover_preference_loss  # noqa: E402
from feedbackrl.algos.ppo import ppo_policy_loss, value_loss, whiten  # noqa: E402
from feedbackrl.control.assist import (  # noqa: E402
    EXPERTS,
    AssistConfig,
    Supervised,
    behaviour_clone,
    demonstrations,
    evaluate,
    new_policy,
)
from feedbackrl.control.envs import make_vec_env  # noqa: E402
from feedbackrl.control.rollout import Collector, rollout_advantages  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "assist_diagnose.json"


def _norm(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> float:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return float(torch.sqrt(sum((g**2).sum() for g in grads if g is not None)))


def one_seed(cfg: AssistConfig, seed: int) -> dict[str, Any]:
    obs, actions = demonstrations(cfg, seed)
    warm = new_policy(cfg, seed)
    behaviour_clone(warm, obs, actions, cfg.bc_steps, cfg.bc_lr)
    a = cfg.ppo
    collector = Collector(make_vec_env(cfg.env, cfg.num_envs), seed)
    agent = Supervised(warm, EXPERTS[cfg.env], True)
    ro = collector.collect(agent, cfg.rollout_steps, torch.Generator().manual_seed(seed))
    collector.envs.close()
    taken, agent_actions, expert_actions = agent.pop()
    adv, ret = rollout_advantages(ro.rewards - cfg.takeover_penalty * taken.float(), ro.values[..., 0],
                                  ro.terminated, ro.truncated, ro.boot_values[..., 0], ro.last_values[..., 0],
                                  a.gamma, a.lam)
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in {
        "obs": ro.obs, "agent": agent_actions, "expert": expert_actions, "taken": taken, "logp": ro.logprobs,
        "values": ro.values, "returns": ret[..., None], "adv": whiten(adv, (~taken).float())}.items()}
    # one minibatch of PPO's size
    idx = torch.randperm(len(flat["obs"]), generator=torch.Generator().manual_seed(0))[:len(flat["obs"]) // 4]
    b = {k: v[idx] for k, v in flat.items()}
    logp, _, values = warm.evaluate(b["obs"], b["agent"])
    pl, _ = ppo_policy_loss(logp[:, None], b["logp"][:, None], b["adv"][:, None], (~b["taken"]).float()[:, None],
                            a.clip)
    vl, _ = value_loss(values, b["values"], b["returns"], torch.ones_like(values), a.value_clip)
    prefer = b["taken"] & (b["expert"] != b["agent"])
    tl, _ = takeover_preference_loss(warm.evaluate(b["obs"], b["expert"])[0], logp, prefer.float())
    actor, critic = list(warm.actor.parameters()), list(warm.critic.parameters())
    joint = _norm(pl + a.vf_coef * vl + tl, actor + critic)
    out: dict[str, Any] = {
        "takeover_rate": float(taken.float().mean()),
        "minibatch": {"steps": len(idx), "own": int((~b["taken"]).sum()), "preferred": int(prefer.sum()),
                      "loss_policy": float(pl.detach()), "loss_value": float(vl.detach()),
                      "loss_takeover": float(tl.detach()),
                      "grad_norm_ppo_actor": _norm(pl, actor), "grad_norm_takeover_actor": _norm(tl, actor),
                      "grad_norm_value_critic": _norm(a.vf_coef * vl, critic), "grad_norm_joint": joint,
                      "clip_factor": min(1.0, a.max_grad_norm / joint)}}
    # the takeover loss alone on this rollout's preferred steps, and anchored on the agent's own steps
    sel = flat["taken"] & (flat["expert"] != flat["agent"])
    o, e, g = flat["obs"][sel], flat["expert"][sel], flat["agent"][sel]
    own_obs = flat["obs"][~flat["taken"]]
    with torch.no_grad():
        warm_own = torch.log_softmax(warm.actor(own_obs), -1)
    for name, anchor in (("takeover_loss_alone", 0.0), ("anchored_kl10", 10.0)):
        policy = copy.deepcopy(warm)
        opt = torch.optim.Adam(policy.actor.parameters(), lr=a.lr, eps=1e-5)
        trace = []
        for step in range(161):
            if step % 32 == 0:
                with torch.no_grad():
                    p_expert = float(policy.evaluate(o, e)[0].exp().mean())
                trace.append({"step": step, "expert_prob": p_expert, **evaluate(policy, cfg, seed + 10_000)})
            loss, _ = takeover_preference_loss(policy.evaluate(o, e)[0], policy.evaluate(o, g)[0],
                                               torch.ones(len(o)))
            if anchor:
                new = torch.log_softmax(policy.actor(own_obs), -1)
                loss = loss + anchor * (warm_own.exp() * (warm_own - new)).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        out[name] = {"preferred_steps": len(o), "trace": trace}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    setup_threads(args.threads)
    cfg = AssistConfig()
    results: dict[str, Any] = {"provenance": provenance(), "runs": {}}
    for seed in (int(s) for s in args.seeds.split(",")):
        r = results["runs"][str(seed)] = one_seed(cfg, seed)
        m = r["minibatch"]
        print(f"seed {seed}: grad norm on the actor, PPO {m['grad_norm_ppo_actor']:.3f}, takeover "
              f"{m['grad_norm_takeover_actor']:.3f}; clip factor {m['clip_factor']:.3f}; success alone "
              + " ".join(f"{t['eval/success']:.1f}" for t in r["takeover_loss_alone"]["trace"]) + ", anchored "
              + " ".join(f"{t['eval/success']:.1f}" for t in r["anchored_kl10"]["trace"]), flush=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
