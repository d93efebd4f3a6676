"""Tasks and reward sources from the user's code and from installed packages: `[task] name =
"package.module:Class"` or a file path, and the entry point groups `feedbackrl.tasks` / `feedbackrl.rewards`
of a package installed as a dist-info directory on sys.path (importlib.metadata reads it as pip's)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from short_run import short_recipe
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.config import ConfigError, TaskConfig, build_config
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.registry import TASKS, make_task
from feedbackrl.rewards.registry import REWARDS
from feedbackrl.rewards.verdict import Problem

TASKS_PY = '''
import random
from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict

class MirrorTask(Task):
    """Write the word backwards (a third-party task)."""

    def __init__(self, letters: str = "abcde", length: int = 3):
        self.name, self.letters, self.length = "mirror", letters, length

    def _word(self, rng):
        return "".join(rng.choice(self.letters) for _ in range(self.length))

    def sample(self, rng):
        w = self._word(rng)
        return Problem(w + "=", w[::-1])

    def heldout(self, n):
        rng = random.Random(123)
        return [Problem(w + "=", w[::-1]) for w in (self._word(rng) for _ in range(n))]

    def verify(self, problem, completion):
        ok = completion.strip() == problem.answer
        return Verdict(float(ok), ok, "mirror")

class NotATask:
    def __init__(self):
        self.name = "half"

NUMBER = 3
'''

REWARDS_PY = '''
def first_letter(problem, completion):
    """1 when the completion starts with the answer's first letter."""
    return float(completion[:1] == problem.answer[:1])

def broken_import_time():
    pass
'''

ENTRY_POINTS = """
[feedbackrl.tasks]
acme_mirror = acme_rl.tasks:MirrorTask
acme_missing = acme_rl.tasks:Nowhere

[feedbackrl.rewards]
acme_first_letter = acme_rl.rewards:first_letter
acme_number = acme_rl.tasks:NUMBER
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch) -> Path:
    """The package `acme_rl` 'installed' into a directory on sys.path: its modules and its dist-info."""
    site = tmp_path / "site"
    pkg = site / "acme_rl"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(textwrap.dedent(TASKS_PY))
    (pkg / "rewards.py").write_text(textwrap.dedent(REWARDS_PY))
    info = site / "acme_rl-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-rl\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    yield site
    for name in [m for m in sys.modules if m == "acme_rl" or m.startswith("acme_rl.")]:
        del sys.modules[name]
    for name in [n for n in REWARDS if n.startswith("acme_")]:
        del REWARDS[name]


def test_feedbackrl_tasks_lists_what_installed_packages_add(installed) -> None:
    res = CliRunner().invoke(app, ["tasks"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    i = lines.index("  acme_mirror: installed (acme_rl.tasks:MirrorTask): Write the word backwards (a third-party "
                    "task).")
    assert lines[i + 1].strip() == "options: letters='abcde', length=3"
    assert any(line.startswith("  acme_missing: installed (acme_rl.tasks:Nowhere), cannot be loaded: ")
               for line in lines)
    assert "  acme_first_letter: installed function: 1 when the completion starts with the answer's first letter." \
        in lines
    assert any(line.startswith("  acme_number: installed (acme_rl.tasks:NUMBER), cannot be loaded: ") for line in lines)
    assert "acme_mirror" not in TASKS  # listing loads an entry point; only a recipe that names it uses it


def test_an_installed_task_and_reward_train(installed) -> None:
    recipe = installed.parent / "recipe.toml"
    recipe.write_text(short_recipe('name = "acme_mirror"\noptions = { length = 3 }', 'source = "acme_first_letter"'))
    res = CliRunner().invoke(app, ["train", str(recipe), "--out", "run"])
    assert res.exit_code == 0, res.output
    steps = [r for r in read_jsonl(installed.parent / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["reward/mean"] in (0, 0.25, 0.5, 0.75, 1) for r in steps)


@pytest.mark.parametrize("name", ["acme_rl.tasks:MirrorTask", "site/acme_rl/tasks.py:MirrorTask"])
def test_a_task_class_by_module_or_file(installed, name) -> None:
    task = make_task(TaskConfig(name=name, options={"length": 4}))
    assert task.heldout(2) == task.heldout(2) and len(task.heldout(1)[0].answer) == 4
    assert task.verify(Problem("abcd=", "dcba"), "dcba").passed and task.verify_batch([], []) == []


@pytest.mark.parametrize(("name", "options", "message"), [
    ("acme_rl.tasks:NotATask", {}, "built a NotATask without ['sample', 'heldout', 'verify', 'verify_batch',"),
    ("acme_rl.tasks:NUMBER", {}, "names a int, not a task class or factory"),
    ("acme_rl.tasks:MirrorTask", {"colour": 1}, "unknown option(s) ['colour'] for task 'acme_rl.tasks:MirrorTask'"),
    ("acme_missing", {}, "entry point of group 'feedbackrl.tasks'"),
    ("mirror", {}, "unknown task 'mirror'; known tasks: ['adaptive_addition',"),
])
def test_task_mistakes_are_config_errors(installed, name, options, message) -> None:
    with pytest.raises(ConfigError) as e:
        make_task(TaskConfig(name=name, options=options))
    assert message in str(e.value)
    if name == "mirror":
        assert "installed: ['acme_mirror', 'acme_missing']" in str(e.value)


def test_an_installed_reward_takes_the_python_options(installed) -> None:
    cfg = build_config({"reward": {"source": "acme_first_letter", "score_range": [0, 2]}})
    from feedbackrl.rewards.registry import build_reward

    v = build_reward(cfg.reward, lambda p, c: [])([Problem("ab=", "ba")], ["bx"])[0]
    assert (v.score, v.passed) == (0.5, False)
    with pytest.raises(ConfigError, match="unknown option for source 'acme_first_letter'; its options: signature"):
        build_config({"reward": {"source": "acme_first_letter", "function": "x:y"}})
    with pytest.raises(ConfigError, match="refers to a int, not a reward function"):
        build_config({"reward": {"source": "acme_number"}})
