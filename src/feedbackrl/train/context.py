"""What the run path hands an algorithm: one `Run`, the same for every algorithm.

An algorithm is a function `(run: Run) -> dict` registered in `train/run.py`'s `ALGORITHMS`; it
trains `run.model` (or a model built from it), logs to `run.sink`, writes what it produces under
`run.out_dir`, and returns what its part of report.json should say. The run path does the rest
(model, SFT warm start, before/after evaluation, report, plot) the same way for all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Scorer
from feedbackrl.log import MetricsSink
from feedbackrl.scale.ranks import OneProcess, Ranks


@dataclass
class Run:
    cfg: RunConfig
    out_dir: Path
    model: PreTrainedModel  # the policy, on `device`, after the SFT warm start (or loaded from `resume_from`)
    tokenizer: PreTrainedTokenizerBase
    task: Task
    sink: MetricsSink
    device: torch.device
    scorer: Scorer  # the recipe's reward ([reward]; the task's verifier by default), with gold metrics if any
    resume_from: Path | None = None  # a checkpoint dir to continue from
    on_eval: Callable[[int], dict[str, Any]] | None = None  # held-out eval every `eval.every` steps
    start_dir: Path | None = None  # a model directory holding the starting policy's weights (the KL reference)
    ranks: Ranks = field(default_factory=OneProcess)  # the data-parallel learner's processes (`torchrun`)


Algorithm = Callable[[Run], dict[str, Any]]
