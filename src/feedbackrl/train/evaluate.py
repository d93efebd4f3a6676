"""Held-out evaluation at its earlier import path: `feedbackrl.episodes.kinds.evaluate`, where each task kind
evaluates its own way (greedy pass@1 and sampled pass@k; whole episodes for multi-turn tasks)."""

from feedbackrl.episodes.contracts import EvalResult
from feedbackrl.episodes.kinds import evaluate

__all__ = ["EvalResult", "evaluate"]
