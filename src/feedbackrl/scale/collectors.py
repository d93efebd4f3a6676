"""The run path's door into `scale/`: the collector a recipe's `[scale]` section asks for."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Collector, Scorer
from feedbackrl.episodes.kinds import InProcessCollector
from feedbackrl.scale.ray_collect import RayCollector, RewardPool, start_ray


def ray_collector(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                  scorer: Scorer) -> Collector:
    """Ray rollout workers (`scale.rollout_workers`) and/or a verifier pool (`scale.reward_workers`).

    The verifier pool replaces the task's own verifier; a recipe whose `[reward]` names a model or a
    source keeps scoring in the learner. Task kinds whose rollouts run elsewhere are refused before
    (`episodes/kinds.py:check_task_kind`).
    """
    s = cfg.scale
    start_ray(s.ray_address, s.rollout_workers + s.reward_workers)
    if s.reward_workers and not (cfg.reward.model or cfg.reward.source):
        scorer = RewardPool(cfg.task, s.reward_workers)
    if s.rollout_workers == 0:
        return InProcessCollector(model, tokenizer, task, scorer, cfg.rollout)
    return RayCollector(s, model, tokenizer, task, scorer, cfg.rollout)
