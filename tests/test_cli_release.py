"""`feedbackrl release`: HC-RLHF's test on a run's held-out costs, merged into its report.json."""

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feedbackrl.cli import app

runner = CliRunner()

# Costs (0, 1, 0, 2, 0): mean 0.6, the 0.9 upper bound 1.213283 (tests/algos/test_confidence.py).
COSTS = [0.0, 1.0, 0.0, 2.0, 0.0]


def _costs_file(path: Path, costs: list, extra: dict | None = None) -> Path:
    path.write_text("".join(json.dumps({"cost": c, **(extra or {})}) + "\n" for c in costs))
    return path


def _run_dir(tmp_path: Path, report: dict | None = None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    if report is not None:
        (run / "report.json").write_text(json.dumps(report))
    return run


def test_release_merges_the_decision_into_the_report(tmp_path):
    run = _run_dir(tmp_path, {"task": "reverse", "eval_after": {"accuracy": 0.5}})
    costs = _costs_file(run / "safety_eval.jsonl", COSTS, {"prompt": "p", "completion": "x"})
    res = runner.invoke(app, ["release", str(run), "--threshold", "1.25"])
    assert res.exit_code == 0, res.output
    assert "released" in res.output and "1.21328" in res.output
    report = json.loads((run / "report.json").read_text())
    assert report["task"] == "reverse" and report["eval_after"] == {"accuracy": 0.5}  # kept
    rel = report["release"]
    assert rel["released"] is True and rel["n"] == 5 and rel["mean"] == 0.6 and rel["delta"] == 0.1
    assert rel["threshold"] == 1.25 and rel["bound"] == pytest.approx(1.213283, abs=1e-6)
    assert rel["costs_sha256"] == hashlib.sha256(costs.read_bytes()).hexdigest()


def test_release_refuses_with_exit_code_one_and_says_why(tmp_path):
    run = _run_dir(tmp_path)  # no report.json yet: one is created
    costs = _costs_file(tmp_path / "held_out_costs.jsonl", COSTS)
    res = runner.invoke(app, ["release", str(run), "--threshold", "1.0", "--delta", "0.1", "--costs", str(costs)])
    assert res.exit_code == 1, res.output
    assert "refused" in res.output and "n 5" in res.output and "mean 0.6" in res.output
    rel = json.loads((run / "report.json").read_text())["release"]
    assert rel["released"] is False and rel["costs_file"] == str(costs)


def test_release_a_second_time_replaces_only_the_release_section(tmp_path):
    run = _run_dir(tmp_path, {"algo": "grpo"})
    _costs_file(run / "safety_eval.jsonl", COSTS)
    assert runner.invoke(app, ["release", str(run), "--threshold", "1.25"]).exit_code == 0
    assert runner.invoke(app, ["release", str(run), "--threshold", "1.25", "--delta", "0.01"]).exit_code == 1
    report = json.loads((run / "report.json").read_text())
    assert report["algo"] == "grpo" and report["release"]["delta"] == 0.01 and not report["release"]["released"]


def test_release_with_one_cost_writes_a_null_bound(tmp_path):
    run = _run_dir(tmp_path)
    _costs_file(run / "safety_eval.jsonl", [0.0])
    res = runner.invoke(app, ["release", str(run), "--threshold", "1.0"])
    assert res.exit_code == 1 and "n must be >= 2" in res.output
    assert json.loads((run / "report.json").read_text())["release"]["bound"] is None


@pytest.mark.parametrize("lines, match", [
    pytest.param("", "has no rows", id="empty-file"),
    pytest.param('{"cost": 0.1}\n{"score": 1}\n', "row 2 needs a finite number in 'cost'", id="missing-cost"),
    pytest.param('{"cost": "low"}\n', "got cost 'low'", id="string-cost"),
    pytest.param('{"cost": true}\n', "got cost True", id="boolean-cost"),
    pytest.param('{"cost": NaN}\n', "got cost nan", id="nan-cost"),
    pytest.param('{"cost": 1' + '0' * 400 + '}\n', "row 1 needs a finite number", id="integer-beyond-float"),
    pytest.param('[0.1]\n', "row 1 needs", id="not-an-object"),
    pytest.param('{"cost": 0.1\n', "line 1 is not valid JSON", id="bad-json"),
])
def test_release_rejects_a_bad_costs_file(tmp_path, lines, match):
    run = _run_dir(tmp_path, {"algo": "grpo"})
    (run / "safety_eval.jsonl").write_text(lines)
    res = runner.invoke(app, ["release", str(run), "--threshold", "1.0"])
    assert res.exit_code == 2 and match in res.output, res.output
    assert json.loads((run / "report.json").read_text()) == {"algo": "grpo"}  # untouched


def test_release_without_a_costs_file_says_how_to_give_one(tmp_path):
    res = runner.invoke(app, ["release", str(_run_dir(tmp_path)), "--threshold", "1.0"])
    assert res.exit_code == 2 and "does not exist" in res.output and "--costs" in res.output


def test_release_of_a_missing_run_dir(tmp_path):
    res = runner.invoke(app, ["release", str(tmp_path / "nope"), "--threshold", "1.0"])
    assert res.exit_code == 2 and "is not a directory" in res.output


@pytest.mark.parametrize("args, match", [
    pytest.param(["--delta", "0"], r"delta must be in (0, 0.5]", id="delta-zero"),
    pytest.param(["--delta", "0.9"], r"delta must be in (0, 0.5]", id="delta-too-large"),
    pytest.param(["--threshold", "nan"], "threshold must be a finite number", id="nan-threshold"),
])
def test_release_rejects_bad_settings(tmp_path, args, match):
    run = _run_dir(tmp_path)
    _costs_file(run / "safety_eval.jsonl", COSTS)
    res = runner.invoke(app, ["release", str(run), "--threshold", "1.0", *args])
    assert res.exit_code == 2 and match in res.output, res.output
    assert not (run / "report.json").exists()


def test_release_leaves_an_unreadable_report_alone(tmp_path):
    run = _run_dir(tmp_path)
    (run / "report.json").write_text("{not json")
    _costs_file(run / "safety_eval.jsonl", COSTS)
    res = runner.invoke(app, ["release", str(run), "--threshold", "1.25"])
    assert res.exit_code == 2 and "is not valid JSON" in res.output and "left as it is" in res.output
    assert (run / "report.json").read_text() == "{not json"


def test_release_needs_a_threshold(tmp_path):
    res = runner.invoke(app, ["release", str(_run_dir(tmp_path))])
    assert res.exit_code == 2 and "--threshold" in res.output


def test_release_adds_violation_and_refusal_rates_when_the_rows_carry_them(tmp_path):
    run = _run_dir(tmp_path, {"algo": "grpo"})
    rows = ([{"cost": 1.0, "scenario": "extraction", "violated": True, "harmful": True, "refused": False}]
            + [{"cost": 0.0, "scenario": "extraction", "violated": False, "harmful": True, "refused": True}] * 3
            + [{"cost": 0.0, "scenario": "benign", "violated": False, "harmful": False, "refused": r}
               for r in (True, False, False, False)])
    (run / "safety_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["release", str(run), "--threshold", "0.5"])
    # costs (1, 0 x 7): mean 0.125, std sqrt((0.875^2 + 7 * 0.125^2) / 7) = 0.353553, t_{0.9,7} = 1.414924
    # -> U = 0.125 + 1.414924 * 0.353553 / sqrt 8 = 0.301866 < 0.5: released
    assert res.exit_code == 0, res.output
    assert "extraction: violation rate 0.250 [0.046, 0.699] (n 4)" in res.output  # Wilson 1/4, test_safety.py
    assert "over refusal: 0.250 [0.046, 0.699] (n 4)" in res.output
    report = json.loads((run / "report.json").read_text())
    assert report["algo"] == "grpo" and report["release"]["released"]
    assert report["release"]["bound"] == pytest.approx(0.301866, abs=1e-6)
    rates = report["safety"]["violation_rates"]
    assert rates["by_scenario"]["benign"]["events"] == 0 and rates["overall"]["n"] == 8
    assert report["safety"]["refusals"]["harmful_compliance"]["events"] == 1


@pytest.mark.parametrize("rows, match", [
    pytest.param([{"cost": 0.0, "scenario": "a", "violated": False}, {"cost": 0.0}],
                 "row 2 lacks 'scenario' or 'violated'", id="scenario-on-one-row-only"),
    pytest.param([{"cost": 0.0, "scenario": "a", "violated": "no"}], "violated must be true or false",
                 id="violated-not-a-boolean"),
    pytest.param([{"cost": 0.0, "harmful": True}], "row 1 lacks 'harmful' or 'refused'", id="harmful-without-refused"),
])
def test_release_rejects_partial_safety_labels(tmp_path, rows, match):
    run = _run_dir(tmp_path)
    (run / "safety_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["release", str(run), "--threshold", "0.5"])
    assert res.exit_code == 2 and match in res.output, res.output
    assert not (run / "report.json").exists()
