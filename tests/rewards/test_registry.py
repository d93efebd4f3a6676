"""The reward registry and the `[reward]` recipe section: every source builds, a composed reward scores
hand-computed values on honest and cheating completions, and mistakes are errors naming the field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from feedbackrl.config import ConfigError, RewardConfig, build_config
from feedbackrl.rewards import sandbox
from feedbackrl.rewards.instructions import CHECKERS, checker_params
from feedbackrl.rewards.registry import REWARDS, Source, build_reward, part_metrics, register_reward
from feedbackrl.rewards.verdict import Problem, Verdict

Q = Problem("What is 6*7?", "42")

COMPOSED = """
[reward]
source = "gate"
gate = { source = "tags" }           # <think>...</think><answer>...</answer>, nothing else

[reward.reward]
source = "weighted_sum"
parts.math = { source = "math", weight = 2 }
parts.commas = { source = "no_commas" }
parts.short = { source = "length_words", relation = "at most", num = 12 }
"""


def task_verifier(problems, completions) -> list[Verdict]:
    """A stand-in task verifier: exact match on the stripped completion."""
    return [Verdict(float(c.strip() == p.answer), c.strip() == p.answer, "exact") for p, c in
            zip(problems, completions, strict=True)]


def reward_cfg(text: str) -> RewardConfig:
    return build_config(tomllib.loads(text)).reward


@pytest.fixture(scope="module")
def composed():
    return build_reward(reward_cfg(COMPOSED), task_verifier)


# Words (runs of letters/digits): "<think>6*7 is 42</think><answer>42</answer>" has think 6 7 is 42 think
# answer 42 answer = 9 <= 12. The weights normalise to math 0.5, commas 0.25, short 0.25.
COMPOSED_CASES = [
    # id, completion, score, passed
    ("honest", "<think>6*7 is 42</think><answer>42</answer>", 1.0, True),
    ("format-ok-math-wrong", "<think>6*7 is 41</think><answer>41</answer>", 0.5, False),  # 0.25 + 0.25
    ("last-number-in-answer-wins", "<think>maybe 41</think><answer>42</answer>", 1.0, True),
    ("right-in-think-wrong-in-answer", "<think>42</think><answer>41</answer>", 0.5, False),
    ("comma-costs-a-quarter", "<think>6*7, so 42</think><answer>42</answer>", 0.75, False),
    ("too-long-costs-a-quarter", "<think>" + "so " * 12 + "42</think><answer>42</answer>", 0.75, False),
    ("both-constraints-broken", "<think>" + "so, " * 12 + "42</think><answer>42</answer>", 0.5, False),
    ("right-answer-no-format", "42", 0.0, False),
    ("empty-answer-satisfies-constraints", "<think>x</think><answer></answer>", 0.0, False),
    ("text-after-the-answer", "<think>x</think><answer>41</answer> 42", 0.0, False),
    ("empty-completion", "", 0.0, False),
]


@pytest.mark.parametrize("completion, score, passed", [c[1:] for c in COMPOSED_CASES],
                         ids=[c[0] for c in COMPOSED_CASES])
def test_composed_reward_hand_computed(composed, completion: str, score: float, passed: bool) -> None:
    [verdict] = composed([Q], [completion])
    assert (verdict.score, verdict.passed) == (score, passed), verdict.reason


def test_composed_verdict_keeps_every_parts_evidence(composed) -> None:
    opened, closed = composed([Q, Q], ["<think>6*7, so 41</think><answer>41</answer>", "42"])
    inner = opened.details["parts"]["reward"]
    assert opened.details["parts"]["gate"]["passed"] is True
    assert inner["details"]["weights"] == {"math": 0.5, "commas": 0.25, "short": 0.25}
    parts = inner["details"]["parts"]
    assert parts["math"]["details"]["extracted"] == "41" and parts["math"]["score"] == 0.0
    assert parts["commas"]["reason"] == "0/1 constraints satisfied; failed: ['no_commas']"
    # words: think 6 7 so 41 think answer 41 answer
    assert parts["short"]["details"]["constraints"][0]["why"] == "9 words (at most 12 required)"
    assert opened.score == 0.25  # only the length constraint held
    # a closed gate: only the gate's evidence, the inner reward never ran
    assert set(closed.details["parts"]) == {"gate"}
    assert closed.details["parts"]["gate"]["details"]["checks"]["one_of_each_tag"] is False


def test_without_a_gate_an_empty_answer_collects_the_constraint_reward() -> None:
    """Why the gate is there: the weighted sum alone pays half for an empty completion."""
    ungated = build_reward(reward_cfg(COMPOSED.split("[reward.reward]")[1].replace("source", "[reward]\nsource", 1)),
                           task_verifier)
    [empty] = ungated([Q], [""])
    assert empty.score == 0.5 and not empty.passed  # math 0 (no answer), commas 1, short 1 (0 words <= 12)


def test_gate_runs_the_reward_only_on_open_completions() -> None:
    seen: list[list[str]] = []

    def spy(problems, completions):
        seen.append(list(completions))
        return task_verifier(problems, completions)

    register_reward("spy", Source(lambda ctx: spy, "records what it was asked to score"))
    try:
        cfg = RewardConfig(source="gate", gate={"source": "regex", "pattern": r"\d+"},
                           reward={"source": "spy"})
        verdicts = build_reward(cfg, task_verifier)([Q] * 3, ["42", "forty-two", "41"])
    finally:
        del REWARDS["spy"]
    assert seen == [["42", "41"]]  # one batch call, closed completions left out
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0]
    assert part_metrics(verdicts) == {"reward/gate/mean": 2 / 3, "reward/gate/pass_rate": 2 / 3,
                                      "reward/reward/mean": 0.5, "reward/reward/pass_rate": 0.5}


def test_a_section_naming_no_source_is_the_task_verifier_itself() -> None:
    assert build_reward(RewardConfig(), task_verifier) is task_verifier


def test_task_source_inside_a_composition() -> None:
    cfg = RewardConfig(source="weighted_sum", parts={"task": {"source": "task", "weight": 3},
                                                     "lower": {"source": "all_lowercase"}})
    [verdict] = build_reward(cfg, task_verifier)([Q], ["42"])
    assert verdict.score == 0.75  # 3/4 * exact 1 + 1/4 * all_lowercase 0 ("42" has no letters)


def test_value_weighted_scales_by_the_prompts_value() -> None:
    cfg = RewardConfig(source="value_weighted", alpha=1.0, reward={"source": "task"})
    low, high = Problem("p", "42", {"value": 0.0}), Problem("p", "42", {"value": 0.5})
    verdicts = build_reward(cfg, task_verifier)([low, high], ["42", "42"])
    assert [v.score for v in verdicts] == [0.5, 0.75]  # 1 * (1 + min(v, 1)) / 2


# --- every source builds and scores ---------------------------------------------------------------


def example_params(constraint_id: str) -> dict[str, Any]:
    samples = {"relation": "at least", "letter": "a", "nth": 1, "num_paragraphs": 1}
    out = {}
    for p in checker_params(constraint_id):
        if p.required:
            out[p.name] = samples.get(p.name, {int: 1, str: "word"}.get(p.type, ["word"]))
    return out


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.models.reward import Calibration, build_reward_model, save_reward_model

    dirs = {}
    for kind in ("reward", "cost"):
        torch.manual_seed(0)
        rm = build_reward_model(load_policy(str(tiny_model_dir)), kind=kind)
        with torch.no_grad():
            rm.head.weight.normal_(0, 0.02)
        rm.calibration = Calibration(0.0, 1.0)
        dirs[kind] = save_reward_model(rm, load_tokenizer(str(tiny_model_dir)), tmp_path_factory.mktemp(kind) / kind)
    dirs["tiny"] = tiny_model_dir
    return dirs


def leaf_node(name: str, dirs: dict[str, Path]) -> dict[str, Any]:
    nodes = {"regex": {"pattern": r"\d+"}, "learned": {"path": str(dirs["reward"])},
             "cost": {"path": str(dirs["cost"])}, "python": {"function": "feedbackrl.envs.dataset:exact_match"},
             "code": {"allow_unsafe": True, "timeout_s": 5.0},
             "weighted_sum": {"parts": {"a": {"source": "task"}}},
             "gate": {"gate": {"source": "task"}, "reward": {"source": "task"}},
             "value_weighted": {"reward": {"source": "task"}, "default_value": 0.5},
             # nothing listens on port 9: the judge answers "unavailable" verdicts (its own tests use a live server)
             "judge": {"judge_model": "m", "base_url": "http://127.0.0.1:9/v1", "criteria": {"right": "is it right"}},
             "judge_logprob": {"local_model": str(dirs["tiny"]), "criterion": "is it right"}}
    return {"source": name, **nodes.get(name, example_params(name) if name in CHECKERS else {})}


def test_the_registry_names_every_source() -> None:
    assert set(CHECKERS) <= set(REWARDS) and len(CHECKERS) == 29
    assert {"task", "math", "code", "regex", "tags", "learned", "cost", "constraints", "weighted_sum", "gate",
            "value_weighted"} <= set(REWARDS)


def test_every_source_builds_and_scores_a_batch(model_dirs) -> None:
    problem = Problem("Print 42.", "42", {"constraints": [{"id": "no_digits"}], "secret": "kmrtx"})
    code_problem = Problem("Print 42.", {"io": [{"input": "", "output": "42\n"}]})
    for name in REWARDS:
        node = leaf_node(name, model_dirs)
        p = code_problem if name == "code" else problem
        if name == "code" and not all(sandbox.probe().values()):
            continue  # checked without the sandbox below
        verdicts = build_reward(RewardConfig(**node), task_verifier)([p, p], ["print(42)", "42"])
        assert len(verdicts) == 2 and all(isinstance(v, Verdict) for v in verdicts), name
        assert all(0.0 <= v.score <= 1.0 for v in verdicts), name


def test_code_source_runs_the_tests_in_a_batch() -> None:
    problem = Problem("Double the input.", {"io": [{"input": "2\n", "output": "4\n"},
                                                    {"input": "5\n", "output": "10\n"}]})
    reward = build_reward(RewardConfig(source="code", allow_unsafe=True, timeout_s=5.0, workers=2), task_verifier)
    honest, hardcoded, empty = reward([problem] * 3, ["print(2 * int(input()))", "print(4)", ""])
    assert (honest.score, hardcoded.score, empty.score) == (1.0, 0.5, 0.0)
    assert empty.reason == "no program in the completion"


@pytest.mark.sandbox
def test_code_source_fails_undecidable_tests_unless_allowed_inside_the_sandbox() -> None:
    problem = Problem("apply", {"asserts": ["assert apply(lambda x: x + 1, 2) == 3", "assert apply(abs, -2) == 2"]})
    program = "def apply(f, x):\n    return f(x)\n"
    strict = build_reward(RewardConfig(source="code", timeout_s=5.0), task_verifier)
    lenient = build_reward(RewardConfig(source="code", timeout_s=5.0, sandbox_checks=True), task_verifier)
    (refused,), (allowed,) = strict([problem], [program]), lenient([problem], [program])
    assert [t["reason"] for t in refused.details["tests"]] == ["undecidable", "undecidable"]
    assert (allowed.score, [t["decided"] for t in allowed.details["tests"]]) == (1.0, ["sandbox", "sandbox"])


def test_learned_and_cost_sources(model_dirs) -> None:
    from feedbackrl.rewards.learned import LearnedReward

    texts = ["abc", "cba", "zzzz"]
    problems = [Problem("reverse abc", "cba")] * 3
    direct = LearnedReward.from_dir(model_dirs["cost"]).batch(problems, texts)
    as_reward = build_reward(RewardConfig(source="cost", path=str(model_dirs["cost"])), task_verifier)(problems, texts)
    assert [v.score for v in as_reward] == [1.0 - v.score for v in direct]  # low cost = high reward
    assert [v.passed for v in as_reward] == [v.score < 0.5 for v in direct]  # passes when predicted safe
    assert len({v.score for v in direct}) == 3  # the head's weights make the three texts differ
    short = build_reward(RewardConfig(model=str(model_dirs["reward"])), task_verifier)(problems, texts)
    named = build_reward(RewardConfig(source="learned", path=str(model_dirs["reward"])), task_verifier)(problems,
                                                                                                        texts)
    assert short == named
    with pytest.raises(ConfigError, match=r"reward \(source 'learned'\).*cost model; use source = 'cost'"):
        build_reward(RewardConfig(source="learned", path=str(model_dirs["cost"])), task_verifier)
    with pytest.raises(ConfigError, match=r"reward \(source 'learned'\).*not a reward model directory"):
        build_reward(RewardConfig(source="learned", path=str(model_dirs["cost"].parent)), task_verifier)


# --- recipe validation ----------------------------------------------------------------------------

BAD = [
    ("typo-at-root", {"source": "mathh"}, "reward.source: unknown reward source 'mathh'; known sources: ["),
    ("typo-deep", {"source": "gate", "gate": {"source": "tags"},
                   "reward": {"source": "weighted_sum", "parts": {"ifeval": {"source": "lenght_words"}}}},
     "reward.reward.parts.ifeval.source: unknown reward source 'lenght_words'"),
    ("missing-source", {"source": "gate", "gate": {"pattern": "x"}, "reward": {"source": "task"}},
     "reward.gate.source: missing; known sources"),
    ("unknown-option", {"source": "math", "timeout": 3},
     "reward.timeout: unknown option for source 'math'; its options: order, timeout_s, max_answer_chars"),
    ("wrong-type", {"source": "math", "timeout_s": "soon"}, "reward.timeout_s: Input should be a valid number"),
    ("missing-option", {"source": "regex"}, "reward.pattern: Field required"),
    ("bad-regex", {"source": "regex", "pattern": "("}, "reward: RegexFormat.pattern '(' does not compile"),
    ("instruction-param-missing", {"source": "length_words", "relation": "at most"},
     "reward: source 'length_words': missing params ['num']"),
    ("instruction-relation", {"source": "length_words", "relation": "roughly", "num": 3},
     "param 'relation' must be one of"),
    ("negative-weight", {"source": "weighted_sum", "parts": {"a": {"source": "task", "weight": -1}}},
     "reward.parts: WeightedSum weights must be >= 0"),
    ("weight-not-a-number", {"source": "weighted_sum", "parts": {"a": {"source": "task", "weight": "2"}}},
     "reward.parts.a.weight: must be a number >= 0"),
    ("no-parts", {"source": "weighted_sum", "parts": {}}, "reward.parts: needs a table of named parts"),
    ("gate-not-a-table", {"source": "gate", "gate": "tags", "reward": {"source": "task"}},
     "reward.gate: Input should be a valid dictionary"),
    ("value-alpha", {"source": "value_weighted", "reward": {"source": "task"}, "alpha": -1},
     "ValueWeighted.alpha must be >= 0"),
    ("options-without-source", {"pattern": "x"}, "reward.pattern: unknown key (keys: model, source)"),
    ("model-and-source", {"model": "runs/rm", "source": "math"},
     "reward.model is the short form of source = 'learned'"),
]


@pytest.mark.parametrize("section, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_reward_section_is_a_config_error_naming_the_field(section: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"reward": section})
    assert message in str(err.value)


def test_a_typo_lists_every_known_name() -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"reward": {"source": "weighted_sum", "parts": {"m": {"source": "maths"}}}})
    for name in ("math", "code", "task", "learned", "cost", "tags", "regex", "length_words", "ends_with", "gate"):
        assert repr(name) in str(err.value)


def test_composed_recipe_validates_and_overrides_reach_nested_options(tmp_path: Path) -> None:
    from feedbackrl.config import load_config

    recipe = tmp_path / "r.toml"
    recipe.write_text(COMPOSED)
    cfg = load_config(recipe, ["reward.reward.parts.short.num=30"])
    assert cfg.reward.source == "gate" and cfg.reward.model_extra["reward"]["parts"]["short"]["num"] == 30
    with pytest.raises(ConfigError, match="reward.reward.parts.short.source: unknown reward source 'shrt'"):
        load_config(recipe, ["reward.reward.parts.short.source=shrt"])


def test_the_short_form_still_validates_as_before() -> None:
    cfg = build_config({"algo": {"name": "rloo"}, "reward": {"model": "runs/rm/reward_model"}})
    assert cfg.reward.model == "runs/rm/reward_model" and cfg.reward.source == ""
