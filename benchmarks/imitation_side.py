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
- driving, `--env highway-fast-v0`: highway-env 1.9.1's highway-fast-v0 (the last release for gymnasium 0.29)
  with the configuration of recipes/highway_prefs.toml (`duration` 20, `vehicles_count` 10) and its
  `Kinematics` observation flattened to a float32 25-vector, as `feedbackrl/highway-fast-v0` gives it (and
  computed with numpy as ours is, by the class of src/feedbackrl/control/highway_obs.py loaded from its file,
  the same numbers in half the time: `numpy_kinematics`); PPO
  as that recipe's (8 x 32 steps, batch 64, 8 epochs, lr 5e-4 annealed, gamma 0.9, entropy 0.01), fragments
  of 10 steps, 20,480 PPO steps (10 rounds of 2,048), `allow_variable_horizon=True` (a crash ends an
  episode). Its evaluation reports the collision rate too (`info["crashed"]` at an episode's end).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from cross_check import record_episodes
from stable_baselines3.common.vec_env import VecEnvWrapper

RESULT_TAG = "BENCH_RESULT "
HIGHWAY = "highway-fast-v0"
HIGHWAY_CONFIG = {"duration": 20, "vehicles_count": 10}  # recipes/highway_prefs.toml's [control.env_options.config]
# PPO per environment: our control_ppo's settings in recipes/cartpole_prefs.toml and recipes/highway_prefs.toml
PPO_SETTINGS = {
    "classic": {"n_steps": 128, "batch_size": 256, "n_epochs": 4, "lr": 2.5e-4, "gamma": 0.99, "ent_coef": 0.0},
    HIGHWAY: {"n_steps": 32, "batch_size": 64, "n_epochs": 8, "lr": 5e-4, "gamma": 0.9, "ent_coef": 0.01},
}


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


def flat_float32(env):
    """highway-env's (5, 5) kinematics observation as the float32 25-vector of `feedbackrl/highway-fast-v0`."""
    import gymnasium as gym

    class Flat(gym.ObservationWrapper):
        def __init__(self, env) -> None:
            super().__init__(env)
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(env.observation_space.shape)),),
                                                    np.float32)

        def observation(self, obs):
            return np.asarray(obs, dtype=np.float32).reshape(-1)

    return Flat(env)


def numpy_kinematics(env):
    """highway-env's `Kinematics` observation computed with numpy, as `feedbackrl/highway-fast-v0` does: the
    class of src/feedbackrl/control/highway_obs.py (it imports only highway-env and numpy), loaded from its file
    so that no feedbackrl package is imported. The same numbers as highway-env's pandas frames (the cross-check
    compares both with ours) in about half the time of a step."""
    import importlib.util
    from pathlib import Path

    import gymnasium as gym

    path = Path(__file__).resolve().parent.parent / "src" / "feedbackrl" / "control" / "highway_obs.py"
    spec = importlib.util.spec_from_file_location("highway_obs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class NumpyObs(gym.Wrapper):
        def reset(self, **kwargs):
            out = self.env.reset(**kwargs)
            base = self.env.unwrapped  # reset() rebuilt highway-env's observation type; put numpy's in its place
            base.observation_type = module.NumpyKinematics(base, **base.config["observation"])
            return out

    return NumpyObs(env)


def make_env(env_id: str, pandas_obs: bool = False):
    """One environment: highway-fast-v0 configured and flattened as ours (module docstring; its observation
    computed with numpy unless `pandas_obs`), else gym.make."""
    import gymnasium as gym

    if env_id == HIGHWAY:
        import highway_env  # noqa: F401  (registers highway-fast-v0)

        env = gym.make(HIGHWAY, config=dict(HIGHWAY_CONFIG))
        return flat_float32(env if pandas_obs else numpy_kinematics(env))
    return gym.make(env_id)


def evaluate(policy, env_id: str, episodes: int, seed: int) -> dict:
    """Greedy actions, one episode on each of `episodes` environments seeded seed + i: the mean true return
    and the share of episodes that end in a crash (driving; 0 elsewhere)."""
    returns, crashes = [], []
    for i in range(episodes):
        env = make_env(env_id)
        obs, _ = env.reset(seed=seed + i)
        total, done, info = 0.0, False, {}
        while not done:
            action, _ = policy.predict(obs, deterministic=True)
            obs, r, term, trunc, info = env.step(int(action))
            total += float(r)
            done = term or trunc
        returns.append(total)
        crashes.append(float(bool(info.get("crashed", False))))
        env.close()
    return {"return": float(np.mean(returns)), "collision": float(np.mean(crashes))}


def check_env(env_id: str, seed: int, steps: int, episodes: int, pandas_obs: bool = False) -> dict:
    """Observations, rewards, terminations and truncations of `episodes` seeded episodes (seeds seed + i) under
    the fixed controller, for the cross-check."""
    out = record_episodes(lambda: make_env(env_id, pandas_obs), env_id == HIGHWAY, seed, steps, episodes)
    return {"episodes": out}


def run(args: argparse.Namespace) -> dict:
    import seals  # noqa: F401  (registers seals/CartPole-v0)
    from imitation.algorithms import preference_comparisons as pc
    from imitation.rewards.reward_nets import BasicRewardNet, NormalizedRewardNet
    from imitation.util import networks
    from imitation.util.util import make_vec_env
    from stable_baselines3 import PPO

    ppo = PPO_SETTINGS.get(args.env, PPO_SETTINGS["classic"])
    # imitation 1.0.1 trains the agent num_iterations + 1 times (once after the initial labels too), each time
    # for total_timesteps // num_iterations steps, which SB3 rounds up to whole rollouts of 8 x n_steps: so
    # PPO's steps are set through the chunk size, `args.steps` in all
    rollout = 8 * ppo["n_steps"]
    chunk = rollout * -(-args.steps // (rollout * (args.iterations + 1)))
    ppo_steps = chunk * (args.iterations + 1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    if args.env == HIGHWAY:
        import highway_env  # noqa: F401  (registers highway-fast-v0)

        venv = make_vec_env(args.env, n_envs=8, rng=rng, env_make_kwargs={"config": dict(HIGHWAY_CONFIG)},
                            post_wrappers=[lambda env, _: flat_float32(numpy_kinematics(env))])
    else:
        venv = make_vec_env(args.env, n_envs=8, rng=rng)
    venv.seed(args.seed)  # sub-environment i seeded seed + i, as ours
    venv = StepCounter(venv)
    reward_net = NormalizedRewardNet(
        BasicRewardNet(venv.observation_space, venv.action_space, normalize_input_layer=networks.RunningNorm),
        normalize_output_layer=networks.RunningNorm)
    box: dict = {}  # the agent, for the learning rate annealed over all PPO steps (not per `learn` call)

    def lr(_: float) -> float:
        return ppo["lr"] * max(0.0, 1 - box["a"].num_timesteps / ppo_steps) if box else ppo["lr"]

    agent = PPO("MlpPolicy", venv, n_steps=ppo["n_steps"], batch_size=ppo["batch_size"], n_epochs=ppo["n_epochs"],
                learning_rate=lr, gamma=ppo["gamma"], gae_lambda=0.95, clip_range=0.2, ent_coef=ppo["ent_coef"],
                vf_coef=0.5, max_grad_norm=0.5, seed=args.seed, device="cpu", verbose=0)
    box["a"] = agent
    generator = pc.AgentTrainer(agent, reward_net, venv, rng=rng, exploration_frac=0.0)
    fragmenter = pc.RandomFragmenter(rng=rng, warning_threshold=0)
    gatherer = pc.SyntheticGatherer(temperature=1.0, rng=rng)
    trainer = pc.BasicRewardTrainer(pc.PreferenceModel(reward_net), pc.CrossEntropyRewardLoss(), rng=rng, epochs=3)
    algo = pc.PreferenceComparisons(
        generator, reward_net, num_iterations=args.iterations, fragmenter=fragmenter, preference_gatherer=gatherer,
        reward_trainer=trainer, fragment_length=args.fragment_len, transition_oversampling=1,
        initial_comparison_frac=0.1, initial_epoch_multiplier=200.0,
        allow_variable_horizon=args.env in ("CartPole-v1", HIGHWAY),
        query_schedule="hyperbolic")
    curve = [{"env_steps": 0, "labels": 0, **evaluate(agent, args.env, args.eval_episodes, args.seed + 10_000)}]

    def after_iteration(_: int) -> None:
        curve.append({"env_steps": venv.steps, "ppo_steps": int(agent.num_timesteps), "labels": len(algo.dataset),
                      **evaluate(agent, args.env, args.eval_episodes, args.seed + 10_000)})

    t0 = time.perf_counter()
    stopped = ""
    try:
        algo.train(total_timesteps=chunk * args.iterations, total_comparisons=args.labels, callback=after_iteration)
    except ValueError as e:  # RandomFragmenter: every sampled episode is shorter than a fragment
        if "long enough" not in str(e):
            raise
        stopped = f"stopped after {len(curve) - 1} of {args.iterations + 1} rounds: {e}"
        curve.append({"env_steps": venv.steps, "ppo_steps": int(agent.num_timesteps), "labels": len(algo.dataset),
                      **evaluate(agent, args.env, args.eval_episodes, args.seed + 10_000)})
    return {"curve": curve, "final_return": curve[-1]["return"], "final_collision": curve[-1]["collision"],
            "env_steps": venv.steps, "ppo_steps":
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
    p.add_argument("--check-env", type=int, default=0, help="only print seeded episodes of at most this many steps")
    p.add_argument("--check-episodes", type=int, default=1, help="how many (seeds seed, seed + 1, ...)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.check_env:
        import seals  # noqa: F401

        out = check_env(args.env, args.seed, args.check_env, args.check_episodes)
        if args.env == HIGHWAY:  # and with highway-env's own (pandas) observation
            out["pandas_obs"] = check_env(args.env, args.seed, args.check_env, args.check_episodes, True)["episodes"]
    else:
        out = run(args)
    import gymnasium
    import imitation
    import stable_baselines3

    out["versions"] = {"imitation": imitation.__version__, "gymnasium": gymnasium.__version__,
                       "stable_baselines3": stable_baselines3.__version__, "torch": torch.__version__}
    if args.env == HIGHWAY:
        import highway_env

        out["versions"]["highway_env"] = highway_env.__version__
    print(RESULT_TAG + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
