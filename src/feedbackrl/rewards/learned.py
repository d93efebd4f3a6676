"""A learned reward (or cost) model as a reward source returning a `Verdict`.

The score is the model's calibrated output sigmoid((raw - center) / scale) in (0, 1), with the
center and scale stored with the model (see `models/reward.py`); `details` carry the raw score.
For a reward model `passed` means "better than a typical training response" (score >= 0.5); for
a cost model the score is the calibrated *cost* (higher is worse) and `passed` means score < 0.5:
a cost model trained on safe/unsafe labels (Safe RLHF's loss) is calibrated around raw cost 0, so
`passed` is then its safe/unsafe prediction.

`batch` scores many completions in a few forward passes; the online loops use it.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from feedbackrl.models.reward import RewardModel, load_reward_model, score_texts
from feedbackrl.rewards.verdict import Problem, Verdict


class LearnedReward:
    """A reward model behind the `RewardSource` interface."""

    def __init__(self, model: RewardModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 256) -> None:
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.name = f"learned_{model.kind}"

    @classmethod
    def from_dir(cls, path: str | Path) -> LearnedReward:
        return cls(*load_reward_model(path))

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        return self.batch([problem], [completion])[0]

    def batch(self, problems: list[Problem], completions: list[str]) -> list[Verdict]:
        raw = score_texts(self.model, self.tokenizer, [p.prompt for p in problems], completions, self.batch_size)
        scores = self.model.calibrate(raw)
        out = []
        for r, s in zip(raw.tolist(), scores.tolist(), strict=True):
            good = s >= 0.5 if self.model.kind == "reward" else s < 0.5
            out.append(Verdict(s, good, f"{self.model.kind} model: {s:.3f} (raw {r:+.3f})",
                               {"raw": r, "kind": self.model.kind}))
        return out
