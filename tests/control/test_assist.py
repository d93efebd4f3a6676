"""The simulated expert in the loop: demonstrations, behaviour cloning, takeovers, DAgger."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from feedbackrl.control.assist import (
    EXPERTS,
    AssistConfig,
    Supervised,
    assisted_update,
    behaviour_clone,
    demonstrations,
    evaluate,
    new_policy,
    run_assisted,
)
from feedbackrl.control.envs import make_vec_env


def test_expert_balances_and_its_alarm_fires_before_the_episode_would_end() -> None:
    expert = EXPERTS["CartPole-v1"]
    envs = make_vec_env("CartPole-v1", 4)
    obs, _ = envs.reset(seed=3)
    for _ in range(499):
        obs, _, term, trunc, _ = envs.step(expert.act(obs))
        assert not term.any() and not trunc.any()
    # the alarm: 0.12 rad is past, the episode's end (0.2095) is not
    fail = expert.about_to_fail(np.array([[0.0, 0, 0.13, 0], [0.0, 0, -0.11, 0], [1.9, 0, 0, 0], [0, 0, 0, 0]]))
    assert fail.tolist() == [True, False, True, False]


def test_demonstration_noise_rate() -> None:
    cfg = AssistConfig(demo_steps=4000, demo_noise=0.4)
    obs, actions = demonstrations(cfg, seed=0)
    assert obs.shape == (4000, 4) and actions.shape == (4000,)
    differ = (torch.as_tensor(EXPERTS["CartPole-v1"].act(obs.numpy())) != actions).float().mean().item()
    # a random action differs from the expert's half the time: 0.4 / 2, within five binomial standard errors
    assert abs(differ - 0.2) < 5 * math.sqrt(0.2 * 0.8 / 4000)


def test_behaviour_cloning_from_noisy_demonstrations_beats_the_initial_policy() -> None:
    cfg = AssistConfig(demo_steps=400, demo_noise=0.3, bc_steps=200, eval_episodes=4)
    policy = new_policy(cfg, seed=0)
    before = evaluate(policy, cfg, seed=10_000)["eval/return"]
    obs, actions = demonstrations(cfg, seed=0)
    stats = behaviour_clone(policy, obs, actions, cfg.bc_steps, cfg.bc_lr)
    after = evaluate(policy, cfg, seed=10_000)["eval/return"]
    assert stats["bc/likelihood"] > 0.6  # the expert's action (70% of labels, plus half the random 30%)
    assert after > before + 100, (before, after)


def test_supervised_executes_the_expert_exactly_where_it_takes_over() -> None:
    policy = new_policy(AssistConfig(), seed=0)
    obs = torch.tensor([[0.0, 0, 0.15, 0], [0.0, 0, -0.15, 0], [0.0, 0, 0.01, 0], [2.0, 0, 0, 0]])
    gen = torch.Generator().manual_seed(0)
    agent = Supervised(policy, EXPERTS["CartPole-v1"], takeover=True)
    executed, _, _ = agent.act(obs, gen)
    taken, own, expert = agent.pop()
    assert taken[0].tolist() == [True, True, False, True]
    assert executed[taken[0]].tolist() == expert[0][taken[0]].tolist() == [1, 0, 1]
    assert executed[2] == own[0][2]
    off = Supervised(policy, EXPERTS["CartPole-v1"], takeover=False)
    executed, _, _ = off.act(obs, gen)
    taken, own, _ = off.pop()
    assert not taken.any() and executed.tolist() == own[0].tolist()


def test_a_takeover_update_moves_probability_to_the_experts_action() -> None:
    cfg = AssistConfig(takeover_coef=1.0)  # the in-batch preference term (off by default)
    policy = new_policy(cfg, seed=1)
    n = 64
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(n, 4, generator=gen) * 0.1
    expert = torch.as_tensor(EXPERTS["CartPole-v1"].act(obs.numpy()))
    agent_actions = 1 - expert  # every takeover disagrees with the agent
    with torch.no_grad():
        logp, _, values = policy.evaluate(obs, agent_actions)
        margin_before = (policy.evaluate(obs, expert)[0] - logp).mean().item()
    batch = {"obs": obs, "agent_actions": agent_actions, "expert_actions": expert,
             "taken": torch.ones(n, dtype=torch.bool), "logprobs": logp, "values": values,
             "advantages": torch.zeros(n), "returns": values.clone()}
    stats = assisted_update(policy, torch.optim.Adam(policy.parameters(), lr=1e-2), batch, cfg, gen)
    with torch.no_grad():
        margin_after = (policy.evaluate(obs, expert)[0] - policy.evaluate(obs, agent_actions)[0]).mean().item()
    assert stats["loss/policy"] == 0.0  # no step was the agent's own: PPO's loss has nothing to act on
    assert stats["loss/takeover"] > 0
    assert margin_after > margin_before + 0.5, (margin_before, margin_after)


def test_unknown_expert_and_bad_noise_are_refused() -> None:
    with pytest.raises(ValueError, match="no simulated expert for 'Pendulum-v1'"):
        AssistConfig(env="Pendulum-v1")
    with pytest.raises(ValueError, match="demo_noise must be in"):
        AssistConfig(demo_noise=1.5)


def test_every_takeover_is_kept_as_an_expert_label_and_cloned_after_each_update() -> None:
    cfg = AssistConfig(num_envs=2, rollout_steps=64, updates=3, eval_episodes=1, takeover_bc_steps=30)
    probe = torch.tensor([[0.0, 0, 0.15, 0.0], [0.0, 0, -0.15, 0.0]])
    expert = torch.as_tensor(EXPERTS["CartPole-v1"].act(probe.numpy()))  # 1, 0: push towards the fall
    runs = {}
    for steps in (0, 30):
        policy = new_policy(cfg, seed=2)  # an untrained policy: it lets the pole fall, the expert takes over
        log = run_assisted(policy, replace(cfg, takeover_bc_steps=steps), seed=2)
        with torch.no_grad():
            runs[steps] = (log, policy.evaluate(probe, expert)[0].exp())
    log, p_expert = runs[30]
    per_update = [round(r["assist/takeover_rate"] * cfg.num_envs * cfg.rollout_steps) for r in log[1:]]
    assert per_update[0] > 0
    assert [r["assist/takeover_labels"] for r in log[1:]] == list(np.cumsum(per_update).astype(float))
    assert all("takeover_bc/nll" in r for r in log[1:])
    assert "takeover_bc/nll" not in runs[0][0][-1]
    # cloning the takeovers moves the policy towards the expert's action in states past the alarm
    assert p_expert.min() > 0.7 and (p_expert > runs[0][1] + 0.2).all(), (p_expert, runs[0][1])


def test_without_takeovers_nothing_is_cloned() -> None:
    cfg = AssistConfig(num_envs=2, rollout_steps=32, updates=1, eval_episodes=1, takeover=False)
    obs = torch.zeros(4, 4)
    log = run_assisted(new_policy(cfg, seed=0), cfg, seed=0, demos=(obs, torch.zeros(4, dtype=torch.long)))
    assert log[-1]["assist/takeover_labels"] == 0.0 and "takeover_bc/nll" not in log[-1]
