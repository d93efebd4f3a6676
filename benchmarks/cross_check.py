"""The environment cross-check of the imitation comparison, shared by both of its interpreters.

`bench_imitation.py` (ours, gymnasium 1.x) and `imitation_side.py` (imitation's virtualenv, gymnasium 0.29) step
the same seeded episodes under this one fixed controller and record them with this one function, so that the
two sides cannot drift apart in how they act or what they record. Plain Python: nothing here needs feedbackrl,
imitation or a particular gymnasium.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# highway-fast-v0's meta-actions, a 10-step cycle: even episodes change lanes often (and soon crash), odd ones
# are cautious (mostly idle and slower)
HIGHWAY_ACTIONS = ((3, 0, 1, 3, 2, 4, 3, 0, 2, 1), (1, 1, 4, 1, 3, 1, 4, 1, 2, 1))


def controller(highway: bool, obs: Any, t: int, episode: int = 0) -> int:
    """The fixed controller: on CartPole a balancing rule with a fixed action every 9th step; on highway-fast-v0
    the episode's cycle of meta-actions."""
    if highway:
        return HIGHWAY_ACTIONS[episode % 2][t % 10]
    return int(obs[2] + 0.3 * obs[3] > 0) if t % 9 else t % 2


def record_episodes(make_env: Callable[[], Any], highway: bool, seed: int, steps: int,
                    episodes: int) -> list[dict[str, list[Any]]]:
    """`episodes` episodes of `make_env()` seeded seed + i, at most `steps` steps each under `controller`: each
    episode's observations (the reset's first), rewards, terminations and truncations, as plain floats and bools."""
    out = []
    for i in range(episodes):
        env = make_env()
        obs, _ = env.reset(seed=seed + i)
        ep: dict[str, list[Any]] = {"obs": [[float(v) for v in obs]], "rewards": [], "terminated": [],
                                    "truncated": []}
        for t in range(steps):
            obs, r, term, trunc, _ = env.step(controller(highway, obs, t, i))
            ep["obs"].append([float(v) for v in obs])
            ep["rewards"].append(float(r))
            ep["terminated"].append(bool(term))
            ep["truncated"].append(bool(trunc))
            if term or trunc:
                break
        out.append(ep)
        env.close()
    return out
