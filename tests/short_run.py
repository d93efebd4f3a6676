"""The smallest GRPO recipe a test trains end to end through `feedbackrl train`: two steps of two prompts,
two completions of at most four tokens, four held-out problems, one thread, no monitors."""

from __future__ import annotations


def short_recipe(task: str, reward: str) -> str:
    """That recipe as TOML text, `task` and `reward` the lines of its [task] and [reward] sections."""
    return f"""[task]
{task}
heldout_size = 4
[rollout]
prompts_per_step = 2
group_size = 2
max_new_tokens = 4
[algo]
steps = 2
[eval]
pass_k = 0
batch_size = 4
[train]
threads = 1
[monitors]
enabled = false
[reward]
{reward}
"""
