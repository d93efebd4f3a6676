"""A reward learned from preferences over trajectory segments (Christiano et al. 2017, "Deep Reinforcement
Learning from Human Preferences"), with an ensemble, disagreement-based queries and a label schedule.

- Segments: `segment_len` consecutive steps of one environment's column in a rollout. Once the episode ends
  inside a segment (terminated or truncated), the rest of the segment is absorbing: its steps are masked out
  and worth 0 to the reward model and to the teacher alike, so a segment in which the pole falls has fewer
  real steps to earn reward with (on CartPole every real step is worth 1, so this is what makes two segments
  differ at all).
- Model: `ensemble` MLPs r_k(obs, action) (a discrete action one-hot). A segment's predicted return is the
  masked sum of r_k over its steps, and each member is trained with `algos.reward_model.bradley_terry_loss`
  on the labelled pairs (an "equal" label is the loss's tie: target 1/2), Christiano et al.'s equation 1.
- Queries: each labelling round samples `pool` candidate pairs per label wanted from the latest rollout and
  keeps those where the members' P(first > second) has the largest standard deviation (Christiano et al.
  section 2.2.4), or keeps random ones.
- Schedule: `rounds` labelling rounds at evenly spaced training steps over the first half of training (the
  first before any PPO update), the budget split equally or as 1 / (1 + round).
- The policy's reward is the ensemble mean r(obs, action), divided by its root mean square over the rollout
  (not shifted: the absorbing value 0 anchors the level, and shifting it would change whether the policy wants
  its episode to go on; not divided by its standard deviation, which is tiny next to the level once the
  model has learned that every real step is worth about the same, and would blow the values up).

Departures: candidates come from the current rollout only (Christiano et al. and B-Pref sample a buffer of past
segments); members differ by initialisation, not by bootstrap resamples of the labels (as in PEBBLE); every
round retrains all members for `epochs` full-batch steps on all labels so far, warm-started.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from feedbackrl.algos.reward_model import bradley_terry_loss
from feedbackrl.config import SegmentPrefsConfig
from feedbackrl.control.rollout import Rollout
from feedbackrl.control.teachers import Teacher


@dataclass
class Segments:
    obs: Tensor  # (N, L, D)
    actions: Tensor  # (N, L, A) action features (one-hot when discrete)
    mask: Tensor  # (N, L) bool: real steps (up to and including the episode's last)
    gold: Tensor  # (N, L) the environment's reward on real steps, 0 after

    def __getitem__(self, idx: Tensor) -> Segments:
        return Segments(self.obs[idx], self.actions[idx], self.mask[idx], self.gold[idx])

    @staticmethod
    def cat(parts: list[Segments]) -> Segments:
        return Segments(*(torch.cat([getattr(p, f) for p in parts]) for f in ("obs", "actions", "mask", "gold")))


def action_features(actions: Tensor, n_actions: int, discrete: bool) -> Tensor:
    """(..., ) discrete actions -> (..., n_actions) one-hot; continuous (..., A) pass through as float."""
    return nn.functional.one_hot(actions.long(), n_actions).float() if discrete else actions.float()


def cut_segments(ro: Rollout, starts: Tensor, envs: Tensor, length: int, n_actions: int, discrete: bool) -> Segments:
    """Segments of `length` steps from rollout columns `envs` (N,) starting at steps `starts` (N,)."""
    t = starts.unsqueeze(1) + torch.arange(length)  # (N, L)
    e = envs.unsqueeze(1).expand_as(t)
    done = ro.dones[t, e]
    # real up to and including the first done step: no done strictly before
    mask = torch.cumsum(done.long(), 1) - done.long() == 0
    gold = torch.where(mask, ro.rewards[t, e], torch.zeros(()))
    return Segments(ro.obs[t, e], action_features(ro.actions[t, e], n_actions, discrete), mask, gold)


def segment_returns(step_rewards: Tensor, mask: Tensor) -> Tensor:
    """step_rewards (..., N, L), mask (N, L) -> (..., N) sums over the real steps (absorbing steps add 0)."""
    return torch.where(mask, step_rewards, torch.zeros_like(step_rewards)).sum(-1)


def segment_bt_loss(returns_1: Tensor, returns_2: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Predicted returns (N,) of the two segments and labels (N,) in {1, 0, 0.5} -> the Bradley-Terry loss."""
    first = labels == 1.0
    chosen = torch.where(first, returns_1, returns_2)
    rejected = torch.where(first, returns_2, returns_1)
    return bradley_terry_loss(chosen, rejected, tie=labels == 0.5)


class Ensemble(nn.Module):
    """K reward MLPs over (obs, action features) -> (K, ...) per-step rewards."""

    def __init__(self, in_dim: int, hidden: int, members: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                                   nn.ReLU(), nn.Linear(hidden, 1)) for _ in range(members))

    def forward(self, obs: Tensor, actions: Tensor) -> Tensor:
        x = torch.cat([obs, actions], -1)
        return torch.stack([m(x).squeeze(-1) for m in self.members])


def round_steps(cfg: SegmentPrefsConfig, total_steps: int) -> list[int]:
    """The training step of each labelling round: evenly over the first half, the first at step 0 (with fewer
    steps than rounds, several rounds fall on one step and their labels are asked together)."""
    span = max(1, total_steps // 2)
    return [round(r * span / cfg.rounds) for r in range(cfg.rounds)]


def round_budgets(cfg: SegmentPrefsConfig, rounds: int) -> list[int]:
    """The label budget split over `rounds` rounds (constant or 1/(1+r) shares), summing to `cfg.labels`."""
    weights = [1.0 if cfg.schedule == "constant" else 1.0 / (1 + r) for r in range(rounds)]
    raw = [cfg.labels * w / sum(weights) for w in weights]
    out = [math.floor(x) for x in raw]
    for i in sorted(range(rounds), key=lambda i: out[i] - raw[i])[: cfg.labels - sum(out)]:
        out[i] += 1
    return out


# Who labels a round's pairs, when not the in-process teacher (control/app_labels.py: the labelling app):
# (step, first, second, where_first, where_second, rollout) -> (N,) labels 1 / 0 / 0.5 / NaN, the teacher's code
Ask = Callable[[int, Segments, Segments, Tensor, Tensor, Rollout], Tensor]


class PreferenceLearner:
    """The labelled pairs, the ensemble and its optimizer; `query` runs a round, `rewards` scores a rollout."""

    def __init__(self, cfg: SegmentPrefsConfig, obs_dim: int, n_actions: int, discrete: bool, total_steps: int,
                 generator: torch.Generator, ask: Ask | None = None) -> None:
        self.cfg, self.n_actions, self.discrete, self.generator = cfg, n_actions, discrete, generator
        self.ask = ask  # who labels; None: the simulated teacher, in process
        t = cfg.teacher
        self.teacher = Teacher(t.beta, t.mistake, t.skip_below, t.equal_within, t.gamma)
        self.model = Ensemble(obs_dim + n_actions, cfg.hidden, cfg.ensemble)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.schedule: dict[int, int] = {}  # training step -> labels asked then
        for step, budget in zip(round_steps(cfg, total_steps), round_budgets(cfg, cfg.rounds), strict=True):
            self.schedule[step] = self.schedule.get(step, 0) + budget
        self.first: Segments | None = None
        self.second: Segments | None = None
        self.labels = torch.zeros(0)
        self.asked = 0  # queries put to the teacher (skipped ones included: each costs a label)

    def _candidates(self, ro: Rollout, n: int) -> tuple[Segments, Segments, Tensor, Tensor]:
        """n candidate pairs -> the two sides' segments and where each was cut, (n, 2) (start step, env)."""
        t_len, n_env = ro.rewards.shape
        length = self.cfg.segment_len
        picks = [(torch.randint(0, t_len - length + 1, (n,), generator=self.generator),
                  torch.randint(0, n_env, (n,), generator=self.generator)) for _ in range(2)]
        a, b = (cut_segments(ro, s, e, length, self.n_actions, self.discrete) for s, e in picks)
        return a, b, torch.stack(picks[0], 1), torch.stack(picks[1], 1)

    @torch.no_grad()
    def _disagreement(self, a: Segments, b: Segments) -> Tensor:
        p = torch.sigmoid(segment_returns(self.model(a.obs, a.actions), a.mask)
                          - segment_returns(self.model(b.obs, b.actions), b.mask))  # (K, N)
        return p.std(0) if p.shape[0] > 1 else torch.zeros(p.shape[1])

    def round_due(self, step: int) -> bool:
        return self.schedule.get(step, 0) > 0

    def query(self, step: int, ro: Rollout) -> dict[str, float]:
        """A labelling round when `step` is on the schedule: choose pairs, ask the teacher, retrain."""
        want = self.schedule.get(step, 0)
        if not want:
            return {}
        n_cand = want * (self.cfg.pool if self.cfg.selection == "disagreement" else 1)
        a, b, where_a, where_b = self._candidates(ro, n_cand)
        if self.cfg.selection == "disagreement" and n_cand > want:
            keep = torch.topk(self._disagreement(a, b), want).indices
            a, b, where_a, where_b = a[keep], b[keep], where_a[keep], where_b[keep]
        if self.ask is None:
            labels = self.teacher.label(a.gold, b.gold, self.generator)
        else:
            labels = self.ask(step, a, b, where_a, where_b, ro)
        self.asked += want
        kept = ~torch.isnan(labels)
        a, b, labels = a[kept], b[kept], labels[kept]
        self.first = a if self.first is None else Segments.cat([self.first, a])
        self.second = b if self.second is None else Segments.cat([self.second, b])
        self.labels = torch.cat([self.labels, labels])
        stats = self.train()
        return {"prefs/labels": float(self.asked), "prefs/labelled_pairs": float(len(self.labels)),
                "prefs/equal_frac": float((labels == 0.5).float().mean()) if len(labels) else 0.0, **stats}

    def train(self) -> dict[str, float]:
        if self.first is None or not len(self.labels):
            return {}
        a, b = self.first, self.second
        for _ in range(self.cfg.epochs):
            ra = segment_returns(self.model(a.obs, a.actions), a.mask)  # (K, N)
            rb = segment_returns(self.model(b.obs, b.actions), b.mask)
            losses = [segment_bt_loss(ra[k], rb[k], self.labels) for k in range(ra.shape[0])]
            loss = torch.stack([x for x, _ in losses]).sum()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        acc = torch.stack([s["rm/accuracy"] for _, s in losses]).mean()
        return {"prefs/rm_loss": float(loss.detach()) / len(losses), "prefs/rm_train_accuracy": float(acc)}

    @torch.no_grad()
    def rewards(self, ro: Rollout) -> tuple[Tensor, Tensor]:
        """(T, E) policy rewards (the ensemble mean over its root mean square on this rollout) and the members'
        std (T, E)."""
        per_member = self.model(ro.obs, action_features(ro.actions, self.n_actions, self.discrete))  # (K, T, E)
        mean = per_member.mean(0)
        rms = mean.pow(2).mean().sqrt().clamp(min=1e-6)
        return mean / rms, per_member.std(0) if per_member.shape[0] > 1 else mean * 0

    @torch.no_grad()
    def proxy_and_gold(self, ro: Rollout) -> dict[str, float]:
        """What the monitors compare (`monitor/proxy_mean`, `monitor/gold_mean`): the rollout cut into
        `segment_len`-step tiles (every environment, starts 0, L, 2L, ...), their mean learned return (ensemble
        mean) and mean true return, each as a z-score against the same returns of the labelled segments.

        Both are in one unit, the labelled data's spread, so a learned reward that is an increasing affine map
        of the true one (any scale the retraining gives it) has proxy = gold; a policy that finds where the model
        is wrong raises the proxy while the gold stays or falls. {} before the first label."""
        if self.first is None or len(self.labels) < 2:
            return {}
        length = self.cfg.segment_len
        t_len, n_env = ro.rewards.shape
        starts = torch.arange(0, t_len - length + 1, length).repeat_interleave(n_env)
        envs = torch.arange(n_env).repeat(len(starts) // n_env)
        tiles = cut_segments(ro, starts, envs, length, self.n_actions, self.discrete)
        labelled = Segments.cat([self.first, self.second])

        def z(x: Tensor, ref: Tensor) -> float:
            return float((x.mean() - ref.mean()) / ref.std().clamp(min=1e-6))

        learned = [segment_returns(self.model(s.obs, s.actions).mean(0), s.mask) for s in (tiles, labelled)]
        return {"monitor/proxy_mean": z(*learned), "monitor/gold_mean": z(tiles.gold.sum(1), labelled.gold.sum(1))}

    def state_dict(self) -> dict[str, Any]:
        seg = (lambda s: None if s is None else vars(s).copy())
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "labels": self.labels,
                "first": seg(self.first), "second": seg(self.second), "asked": self.asked}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.labels, self.asked = state["labels"], state["asked"]
        self.first = None if state["first"] is None else Segments(**state["first"])
        self.second = None if state["second"] is None else Segments(**state["second"])
