"""The adaptive-difficulty controller goes into the checkpoint and comes back on resume.

The generic resume test (test_checkpoint_resume.py) uses a hand-written stateful task; this one
runs the real `adaptive_reverse` through `train_grpo`, so a renamed method or a state the loop
forgets to save would show here.
"""

from pathlib import Path

from feedbackrl.config import RunConfig, build_config
from feedbackrl.envs.adaptive import AdaptiveTask, adaptive_reverse
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.train.checkpoint import load_trainer_state
from feedbackrl.train.grpo import train_grpo


def config(steps: int) -> RunConfig:
    return build_config({"rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
                         "algo": {"steps": steps}, "train": {"seed": 0, "checkpoint_every": 2}})


def task() -> AdaptiveTask:
    # window 4 = one batch: the untrained policy fails every rollout, so the level falls 5 -> 4 -> 3
    # and stays at the floor; the window holds the last batch's four failures
    return adaptive_reverse(eval_level=5, min_level=3, max_level=5, start_level=5, window=4)


def test_controller_state_is_checkpointed_and_resumed(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    first, rows = task(), MemorySink()
    train_grpo(config(3), model, tokenizer, first, tmp_path / "run", rows)
    assert [rows.by_step[s]["task/difficulty"] for s in (1, 2, 3)] == [4, 3, 3], rows.by_step

    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    saved = load_trainer_state(ckpt).loop_state["task_state"]
    assert saved == {"controller": {"level": 3, "recent": []}}, saved  # just moved: window restarted

    resumed, rows = task(), MemorySink()
    assert resumed.difficulty == 5
    train_grpo(config(3), load_policy(str(ckpt)), tokenizer, resumed, tmp_path / "run", rows, resume_from=ckpt)
    assert sorted(rows.by_step) == [3] and rows.by_step[3]["task/difficulty"] == 3
    assert resumed.state_dict() == first.state_dict() == {"controller": {"level": 3, "recent": [False] * 4}}
