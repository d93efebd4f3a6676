"""The task-kind registry: a task is rolled out, evaluated and demonstrated by the kind it declares
(`Task.kind`), and each kind's declared `Support` refuses the settings its rollouts do not run with,
naming the setting, before any work."""

from __future__ import annotations

import random
import re

import pytest
import torch

from feedbackrl.config import ConfigError, RolloutConfig, SFTConfig, build_config
from feedbackrl.envs.guess import GuessNumberTask
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.episodes import kinds
from feedbackrl.episodes.contracts import EvalResult, EvalSettings, Support
from feedbackrl.episodes.kinds import TASK_KINDS, check_task_kind, collect, evaluate, task_kind
from feedbackrl.episodes.multi_turn import Episodic
from feedbackrl.episodes.single_turn import SingleTurn, task_scorer
from feedbackrl.log import MemorySink
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.train.sft import sft_warmstart


class Counting(AdditionTask):
    """An addition task that declares a kind of its own (registered by the test that uses it)."""

    kind = "counting"


class CountingKind(SingleTurn):
    """The single-turn kind under another name, recording what the loops asked it for."""

    name = "counting"
    support = Support()
    refuses = "its rollouts are counted in one process"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self, *args, **kwargs):
        self.calls.append("collect")
        return super().collect(*args, **kwargs)

    def evaluate(self, model, tokenizer, task, problems, settings: EvalSettings) -> EvalResult:
        self.calls.append(f"evaluate k={settings.k} seed={settings.seed} max_new_tokens={settings.max_new_tokens}")
        return super().evaluate(model, tokenizer, task, problems, settings)

    def demonstrations(self, tokenizer, task, problems, demos):
        self.calls.append(f"demonstrations {len(problems)}")
        return super().demonstrations(tokenizer, task, problems, demos)


def test_the_shipped_kinds_are_looked_up_by_the_name_a_task_declares() -> None:
    assert sorted(TASK_KINDS) == ["episodic", "external", "single_turn"]
    assert isinstance(task_kind(AdditionTask()), SingleTurn)
    assert isinstance(task_kind(GuessNumberTask()), Episodic)


def test_an_unknown_kind_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=re.escape("task 'addition' declares kind = 'counting', which no task kind "
                                                    "implements; known kinds: ['episodic', 'external', "
                                                    "'single_turn']")):
        task_kind(Counting())


def test_a_registered_kind_gets_the_collect_step_the_evaluation_and_sft(monkeypatch) -> None:
    """Nothing but the registry decides which kind runs: the same entry points the loops call reach it."""
    kind = CountingKind()
    monkeypatch.setitem(TASK_KINDS, "counting", kind)
    tok = build_tokenizer()
    model = build_model(tok, "tiny", seed=0)
    task = Counting()
    cfg = RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=4)
    batch = collect(model, tok, task, task_scorer(task), cfg, random.Random(0), torch.Generator().manual_seed(0))
    assert batch.completion_ids.shape[0] == 6 and len(batch.verdicts) == 6
    result = evaluate(model, tok, task, task.heldout(3), max_new_tokens=4, k=2, seed=7)
    assert result.n == 3 and result.k == 2
    sft_warmstart(model, tok, task, SFTConfig(steps=1, batch_size=4), seed=0, sink=MemorySink())
    assert kind.calls == ["collect", "evaluate k=2 seed=7 max_new_tokens=4", "demonstrations 4"]
    kinds.register_task_kind(kind)  # the public way in; monkeypatch restores the registry after the test
    assert TASK_KINDS["counting"] is kind


def _cfg(**sections) -> object:
    return build_config({"task": {"name": "guess_number"}, **sections})


COST = {"source": "regex", "pattern": "a", "mode": "search"}
REFUSED = [  # (sections, world, sharded, the setting the error names)
    ({"rollout": {"weights": "int8"}}, 1, False, "rollout.weights = 'int8'"),
    ({"rollout": {"backend": "vllm"}}, 1, False, "rollout.backend = 'vllm'"),
    ({}, 2, False, "torchrun"),
    ({"scale": {"learner": "fsdp"}}, 2, False, "scale.learner = 'fsdp'"),
    ({}, 1, True, "scale.learner = 'fsdp'"),
    ({"scale": {"rollout_workers": 2}}, 1, False, "scale.rollout_workers = 2"),
    ({"scale": {"reward_workers": 1}}, 1, False, "scale.reward_workers = 1"),
    ({"cost": COST}, 1, False, "[cost]"),
    ({"reward": COST}, 1, False, "[reward] source = 'regex'"),
]


@pytest.mark.parametrize(("sections", "world", "sharded", "setting"), REFUSED,
                         ids=["int8", "vllm", "torchrun", "fsdp", "sharded_ranks", "rollout_workers",
                              "reward_workers", "cost", "reward"])
def test_an_episodic_task_refuses_what_its_episodes_do_not_run_with(sections, world, sharded, setting) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{setting} with task.name = 'guess_number': its episodes are "
                                                    "played in one process")):
        check_task_kind(_cfg(**sections), GuessNumberTask(), world, sharded)


@pytest.mark.parametrize(("sections", "world", "sharded", "setting"), REFUSED,
                         ids=["int8", "vllm", "torchrun", "fsdp", "sharded_ranks", "rollout_workers",
                              "reward_workers", "cost", "reward"])
def test_a_single_turn_task_runs_with_all_of_it(sections, world, sharded, setting) -> None:
    check_task_kind(_cfg(**sections), AdditionTask(), world, sharded)  # no error: every flag is supported


def test_the_collect_step_refuses_quantized_sampling_of_episodes() -> None:
    """Called directly (not through the run path), `collect` still refuses what the kind cannot sample with."""
    tok = build_tokenizer()
    task = GuessNumberTask()
    with pytest.raises(ConfigError, match="rollout.weights = 'int8' with task.name = 'guess_number'"):
        collect(build_model(tok, "tiny", seed=0), tok, task, task_scorer(task),
                RolloutConfig(weights="int8"), random.Random(0), torch.Generator().manual_seed(0))


def test_an_external_task_demonstrates_single_turn_answers() -> None:
    """SFT on an external task (verifiers' single-turn environments demonstrate their `answer`): the prompt,
    then the answer's tokens with EOS, every completion token trained on."""
    from feedbackrl.envs.external import ExternalTask
    from feedbackrl.rewards.verdict import Problem

    class Answers(ExternalTask):
        name = "answers"

    tok = build_tokenizer()
    problems = [Problem("ab=", "ba", {}), Problem("abc=", "cba", {})]
    p_ids, p_mask, c_ids, c_mask = task_kind(Answers()).demonstrations(tok, Answers(), problems, ["ba", "cba"])
    eos = tok.eos_token_id
    assert c_ids.tolist() == [tok("ba", add_special_tokens=False)["input_ids"] + [eos, tok.pad_token_id],
                              tok("cba", add_special_tokens=False)["input_ids"] + [eos]]
    assert c_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert p_mask.sum(1).tolist() == [len(tok("ab=", add_special_tokens=False)["input_ids"]),
                                      len(tok("abc=", add_special_tokens=False)["input_ids"])]
