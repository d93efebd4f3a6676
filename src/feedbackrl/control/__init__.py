"""Control policies for gymnasium environments, trained with the same feedback machinery as the text policies.

`envs.py` builds seeded vectorised environments and their cost signals, `driving.py` the highway-env
driving environments with their closed-loop metrics, `policy.py` the MLP actor-critic,
`rollout.py` collects fixed-length rollouts and turns them into GAE advantages with `algos.ppo.gae`,
`preferences.py` and `teachers.py` learn a reward from segment preferences (Bradley-Terry ensemble,
simulated B-Pref teachers), `app_labels.py` asks the labelling app instead (segment pairs as two clips),
`video.py` renders clips and videos, and `loop.py` is the PPO loop that `feedbackrl train` runs for
`algo.name = "control_ppo"` (docs/control.md).
"""
