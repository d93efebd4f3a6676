"""Audit channels: a second opinion on a sample of completions, standing in for a gold check nobody has.

Every `monitors.audit.every` steps (and at step 1, the baseline) the monitor draws
`monitors.audit.samples` completions, spread over the groups, and posts them to each channel with
their training reward. A channel answers with a verdict in [0, 1] per completion, at once (a second
verifier, a judge) or later (people in the labelling app; `collect` returns what has come back). The
monitor logs, per channel NAME, on the step the verdicts arrive:

- `monitor/audit/NAME/mean`: the audit's mean verdict on the sample;
- `monitor/audit/NAME/proxy_mean`: the training reward's mean on the same completions;
- `monitor/audit/NAME/step`: the step whose completions these are;
- `monitor/audit/NAME/reward_agreement`: the share of audited completions where the audit and the
  training reward agree on pass (>= 0.5) or fail;
- `monitor/audit/NAME/false_pass`: the share of audited completions the training reward passes and the
  audit fails (what the `disagreement` detector reads);
- `monitor/audit/NAME/agreement`: the audit's own agreement where it has one (people: the share of
  pairs of labels on one item that agree; needs `overlap >= 2`).

`proxy_gold` reads each channel's (proxy_mean, mean) pair as it reads the gold sample, so a reward
that rises while the audit does not raises an alert. An audit is a check the policy must not be
able to pass by the same trick that passes the training reward: a channel that is the training
reward itself is refused in the config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from feedbackrl.monitors.base import mean
from feedbackrl.rewards.verdict import Problem, Verdict

BatchReward = Callable[[Sequence[Problem], Sequence[str]], list[Verdict]]
PASS = 0.5  # a verdict or reward at or above this counts as a pass in `reward_agreement`


@dataclass
class AuditBatch:
    """A channel's verdicts on one step's sample (verdicts[i] answers the completion with reward proxy[i])."""

    step: int
    proxy: list[float]
    verdicts: list[float]
    agreement: float | None = None

    def metrics(self, name: str) -> dict[str, float]:
        if not self.verdicts:
            return {}
        agree = [(p >= PASS) == (v >= PASS) for p, v in zip(self.proxy, self.verdicts, strict=True)]
        out = {f"monitor/audit/{name}/mean": mean(self.verdicts),
               f"monitor/audit/{name}/proxy_mean": mean(self.proxy),
               f"monitor/audit/{name}/step": float(self.step),
               f"monitor/audit/{name}/n": float(len(self.verdicts)),
               f"monitor/audit/{name}/reward_agreement": sum(agree) / len(agree),
               f"monitor/audit/{name}/false_pass": sum(p >= PASS > v for p, v in zip(self.proxy, self.verdicts,
                                                                                    strict=True)) / len(agree)}
        if self.agreement is not None:
            out[f"monitor/audit/{name}/agreement"] = self.agreement
        return out


def merge(batches: Sequence[AuditBatch]) -> AuditBatch | None:
    """Several samples that came back at once as one (their completions together, the latest step)."""
    if not batches:
        return None
    agreements = [b.agreement for b in batches if b.agreement is not None]
    return AuditBatch(max(b.step for b in batches), [p for b in batches for p in b.proxy],
                      [v for b in batches for v in b.verdicts], mean(agreements) if agreements else None)


class AuditChannel:
    """Where a sample goes for a second opinion. `post` sends one step's sample; `collect` returns the
    samples whose verdicts are in (each once); `close` ends anything the channel started."""

    name: str = "audit"

    def post(self, step: int, problems: list[Problem], texts: list[str], rewards: list[float]) -> None:
        raise NotImplementedError

    def collect(self) -> list[AuditBatch]:
        raise NotImplementedError

    def close(self) -> None:
        return None


class SourceAudit(AuditChannel):
    """Any batch reward as an audit: a second, stricter verifier, a judge, a reward model. Answers at once."""

    def __init__(self, name: str, reward: BatchReward) -> None:
        self.name, self.reward = name, reward
        self._done: list[AuditBatch] = []

    def post(self, step: int, problems: list[Problem], texts: list[str], rewards: list[float]) -> None:
        verdicts = self.reward(problems, texts)
        if len(verdicts) != len(texts):
            raise ValueError(f"audit {self.name!r} returned {len(verdicts)} verdicts for {len(texts)} completions")
        self._done.append(AuditBatch(step, list(rewards), [float(v.score) for v in verdicts]))

    def collect(self) -> list[AuditBatch]:
        done, self._done = self._done, []
        return done
