"""imitation's side of benchmarks/bench_imitation.py: `PreferenceComparisons` with Stable-Baselines3's PPO.

Runs inside the virtualenv of `make imitation-venv` (imitation 1.0.1, gymnasium 0.29, stable-baselines3
2.2.1); it imports nothing from feedbackrl. One run: one environment, one seed, one label budget. Its last
stdout line is `BENCH_RESULT {json}`: the greedy held-out return before training and after every
iteration, with the environment steps and labels spent by then.

What is set, and why (the rest are imitation's defaults, those of its `train_preference_comparisons` script):
- PPO: the settings of our `control_ppo` (8 environments x 128 steps, batch 256, 4 epochs, lr 2.5e-4
  annealed linearly to 0, clip 0.2, gamma 0.99, lambda 0.95, no entropy bonus, grad norm 0.5, two tanh layers
  of 64 for actor and critic), so that the two sides differ in how they learn the reward, not in their RL.
- reward: the script's default net, `BasicRewardNet` (state and action; input normalised by `RunningNorm`)
  wrapped in `NormalizedRewardNet` (output normalised by `RunningNorm`), trained by `BasicRewardTrainer` for
  3 epochs per iteration (`initial_epoch_multiplier` 200 on the first), `RandomFragmenter`, the hyperbolic
  query schedule, 10% of the labels before any PPO update.
- teacher: `SyntheticGatherer(temperature=1)`: P(first) = sigmoid(R_1 - R_2), sampled; ours is set to
  beta = 1 with no mistakes, skips or equal labels, the same teacher.
- fragments of 25 steps (our recipe's segment length); `num_iterations` 9, which imitation 1.0.1 turns into
  10 rounds of labels and PPO (5,120 PPO steps each, 51,200 in all);
  `exploration_frac` 0, so the only steps beyond PPO's are those imitation samples to label before the first
  iteration (counted: every `step_wait` of the vector env is).
- CartPole-v1 needs `allow_variable_horizon=True` (as imitation's own `cartpole` config sets). There, a
  round whose sampled episodes are all shorter than a fragment makes `RandomFragmenter` raise; the run then
  stops, is evaluated once more and reports why in `stopped` (its return counts as the final one).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecEnvWrapper

RESULT_TAG = "BENCH_RESULT "


class StepCounter(VecEnvWrapper):
    """Counts environment steps: num_envs per vector step."""

    def __init__(self, venv) -> None:
        super().__init__(venv)
        self.steps = 0

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        self.steps += self.num_envs
        return self.venv.step_wait()


def evaluate(policy, env_id: str, episodes: int, seed: int) -> float:
    """Greedy actions, one episode on each of `episodes` environments seeded seed + i; the mean true return."""
    import gymnasium as gym

    returns = []
    for i in range(episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            action, _ = policy.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(int(action))
            total += float(r)
            done = term or trunc
        returns.append(total)
        env.close()
    return float(np.mean(returns))


def check_env(env_id: str, seed: int, steps: int) -> dict:
    """Observations and rewards of one seeded episode under a fixed controller (a balancing rule, a fixed action
    every 9th step), for the cross-check."""
    import gymnasium as gym

    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    rows = [[float(v) for v in obs]]
    rewards = []
    for t in range(steps):
        obs, r, term, trunc, _ = env.step(int(obs[2] + 0.3 * obs[3] > 0) if t % 9 else t % 2)
        rows.append([float(v) for v in obs])
        rewards.append(float(r))
        if term or trunc:
            break
    return {"obs": rows, "rewards": rewards}


def run(args: argparse.Namespace) -> dict:
    import seals  # noqa: F401  (registers seals/CartPole-v0)
    from imitation.algorithms import preference_comparisons as pc
    from imitation.rewards.reward_nets import BasicRewardNet, NormalizedRewardNet
    from imitation.util import networks
    from imitation.util.util import make_vec_env
    from stable_baselines3 import PPO

    # imitation 1.0.1 trains the agent num_iterations + 1 times (once after the initial labels too), each time
    # for total_timesteps // num_iterations steps, which SB3 rounds up to whole rollouts of 8 x 128: so PPO's
    # steps are set through the chunk size, `args.steps` in all
    chunk = 1024 * -(-args.steps // (1024 * (args.iterations + 1)))
    ppo_steps = chunk * (args.iterations + 1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    venv = make_vec_env(args.env, n_envs=8, rng=rng)
    venv.seed(args.seed)  # sub-environment i seeded seed + i, as ours
    venv = StepCounter(venv)
    reward_net = NormalizedRewardNet(
        BasicRewardNet(venv.observation_space, venv.action_space, normalize_input_layer=networks.RunningNorm),
        normalize_output_layer=networks.RunningNorm)
    box: dict = {}  # the agent, for the learning rate annealed over all PPO steps (not per `learn` call)

    def lr(_: float) -> float:
        return 2.5e-4 * max(0.0, 1 - box["a"].num_timesteps / ppo_steps) if box else 2.5e-4

    agent = PPO("MlpPolicy", venv, n_steps=128, batch_size=256, n_epochs=4, learning_rate=lr, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2,
                ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, seed=args.seed, device="cpu", verbose=0)
    box["a"] = agent
    generator = pc.AgentTrainer(agent, reward_net, venv, rng=rng, exploration_frac=0.0)
    fragmenter = pc.RandomFragmenter(rng=rng, warning_threshold=0)
    gatherer = pc.SyntheticGatherer(temperature=1.0, rng=rng)
    trainer = pc.BasicRewardTrainer(pc.PreferenceModel(reward_net), pc.CrossEntropyRewardLoss(), rng=rng, epochs=3)
    algo = pc.PreferenceComparisons(
        generator, reward_net, num_iterations=args.iterations, fragmenter=fragmenter, preference_gatherer=gatherer,
        reward_trainer=trainer, fragment_length=args.fragment_len, transition_oversampling=1,
        initial_comparison_frac=0.1, initial_epoch_multiplier=200.0, allow_variable_horizon=args.env == "CartPole-v1",
        query_schedule="hyperbolic")
    curve = [{"env_steps": 0, "labels": 0, "return": evaluate(agent, args.env, args.eval_episodes,
                                                               args.seed + 10_000)}]

    def after_iteration(_: int) -> None:
        curve.append({"env_steps": venv.steps, "ppo_steps": int(agent.num_timesteps), "labels": len(algo.dataset),
                      "return": evaluate(agent, args.env, args.eval_episodes, args.seed + 10_000)})

    t0 = time.perf_counter()
    stopped = ""
    try:
        algo.train(total_timesteps=chunk * args.iterations, total_comparisons=args.labels, callback=after_iteration)
    except ValueError as e:  # RandomFragmenter: every sampled episode is shorter than a fragment
        if "long enough" not in str(e):
            raise
        stopped = f"stopped after {len(curve) - 1} of {args.iterations + 1} rounds: {e}"
        curve.append({"env_steps": venv.steps, "ppo_steps": int(agent.num_timesteps), "labels": len(algo.dataset),
                      "return": evaluate(agent, args.env, args.eval_episodes, args.seed + 10_000)})
    return {"curve": curve, "final_return": curve[-1]["return"], "env_steps": venv.steps, "ppo_steps":
            int(agent.num_timesteps), "labels": len(algo.dataset), "stopped": stopped,
            "train_seconds": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--labels", type=int, default=400)
    p.add_argument("--steps", type=int, default=51_200)
    p.add_argument("--fragment-len", type=int, default=25)
    p.add_argument("--iterations", type=int, default=9)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--check-env", type=int, default=0, help="only print one seeded episode of this many steps")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.check_env:
        import seals  # noqa: F401

        out = check_env(args.env, args.seed, args.check_env)
    else:
        out = run(args)
    import gymnasium
    import imitation
    import stable_baselines3

    out["versions"] = {"imitation": imitation.__version__, "gymnasium": gymnasium.__version__,
                       "stable_baselines3": stable_baselines3.__version__, "torch": torch.__version__}
    print(RESULT_TAG + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
