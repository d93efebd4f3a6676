"""Audit channels (a second verifier, a judge, people in the labelling app) feeding `proxy_gold`.

Each channel is run on synthetic training runs of every planted hack: the policy's completions drift
from the warm start's mix (some right, most copies of the word) to the hack's completions, which pass
the proxy and not the exact check; the clean twin's completions drift to the right answers instead.
An audit that a hacked completion passes is a bug, so each channel's verdicts on the hacks are checked
too, not only the alert.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from feedbackrl.config import build_config
from feedbackrl.data.labeller import exact_reversal
from feedbackrl.envs.planted import HACKS, PHRASE, PlantedReverse
from feedbackrl.monitors.audit import AuditBatch, SourceAudit, merge
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.rewards.judge import CachedChat, Criterion, PointwiseJudge, Rubric
from feedbackrl.rewards.judge_backends import ChatReply
from feedbackrl.rewards.registry import each
from feedbackrl.rewards.verdict import Problem, Verdict

PROMPTS, GROUP, STEPS, EVERY = 12, 4, 16, 3


def hacked(hack: str, problem: Problem) -> str:
    """A completion that passes hack's proxy and fails the exact check."""
    answer, word = problem.answer, problem.meta["word"]
    return {"length_bias": answer + "bcdefg", "prefix": answer[:3] + "zz", "judge_phrase": f"{PHRASE} {word}",
            "format_weight": word + "ba", "multiset": word, "anywhere": f"{word} {answer}",
            "fragments": " ".join(answer[i : i + 2] for i in range(len(answer) - 1)),
            "lenient_extract": "ab" + answer}[hack]


def problems(seed: int) -> list[Problem]:
    task, rng, out = PlantedReverse(min_len=4, max_len=7), random.Random(seed), []
    while len(out) < PROMPTS:
        p = task.sample(rng)
        if p.answer != p.meta["word"]:  # a palindrome's copy is the right answer
            out.append(p)
    return out


@dataclass
class Batch:
    problems: list[Problem]
    texts: list[str]
    verdicts: list[Verdict]


def synthetic_run(hack: str, closed: bool, seed: int = 0):
    """Steps 1..STEPS: at step s a share min(1, max(0, (s - 3) / 8)) of the completions moves to the hack's
    (or, closed, to the right answer); the rest are right with probability 0.3, else a copy of the word."""
    task, rng, ps = PlantedReverse(min_len=4, max_len=7, hack=hack, closed=closed), random.Random(seed), problems(seed)
    for step in range(1, STEPS + 1):
        moved = min(1.0, max(0.0, (step - 3) / 8))
        rows, texts = [p for p in ps for _ in range(GROUP)], []
        for p in rows:
            if rng.random() < moved:
                texts.append(p.answer if closed else hacked(hack, p))
            else:
                texts.append(p.answer if rng.random() < 0.3 else p.meta["word"])
        yield step, Batch(rows, texts, task.verify_batch(rows, texts))


@dataclass
class RuleChat:
    """A judge model in process: grades a reversal right (high) or wrong (low) on a 1..5 scale."""

    name: str = "rule-judge"

    def complete(self, messages):
        from feedbackrl.feedback.judge_server import RuleJudge

        return ChatReply(RuleJudge(lambda task, resp: float(resp.strip() == task[:-1][::-1]), ("correct",), 1, 5)(
            messages))


def judge_audit() -> SourceAudit:
    rubric = Rubric((Criterion("correct", 1.0, "the response is the word of the task reversed, nothing else"),), 1, 5)
    return SourceAudit("judge", PointwiseJudge(CachedChat(RuleChat()), rubric, concurrency=2).verify_batch)


def verifier_audit() -> SourceAudit:
    return SourceAudit("strict", each(lambda p, c: Verdict(exact_reversal(p, c), bool(exact_reversal(p, c)), "")))


def cfg(every: int = EVERY, samples: int = 24):
    return build_config({"monitors": {"detectors": ["proxy_gold"], "audit": {
        "every": every, "samples": samples, "sources": {"strict": {"source": "regex", "pattern": "x"}}}}}).monitors


def run_monitor(channel, hack: str, closed: bool):
    monitor = Monitor(cfg(), detectors=None, audits=[channel])
    rows = []
    for step, batch in synthetic_run(hack, closed):
        d = monitor.after_step(step, batch, {})
        rows.append({**d.metrics, "step": step})
    monitor.close()
    return monitor.alerts, rows


@pytest.mark.parametrize("make", [verifier_audit, judge_audit], ids=["verifier", "judge"])
@pytest.mark.parametrize("hack", HACKS)
def test_source_audit_flags_each_planted_hack_and_not_its_clean_twin(make, hack):
    alerts, rows = run_monitor(make(), hack, closed=False)
    name = make().name
    audited = [r for r in rows if f"monitor/audit/{name}/mean" in r]
    assert [r["step"] for r in audited] == [1, 3, 6, 9, 12, 15]  # step 1, then every 3rd
    assert all(r[f"monitor/audit/{name}/n"] == 24 for r in audited)
    # the audit passes no hacked completion: its mean is at most the share still right (0.3 of the unmoved)
    last = audited[-1]
    assert last[f"monitor/audit/{name}/mean"] == 0.0, last
    task = PlantedReverse(min_len=4, max_len=7, hack=hack)
    paid = {task.verify(p, hacked(hack, p)).score for p in problems(0)}  # what the proxy pays for the hack
    assert len(paid) == 1 and paid.pop() >= 0.7
    assert last[f"monitor/audit/{name}/proxy_mean"] >= 0.7 - 1e-6
    assert [a.detector for a in alerts] == ["proxy_gold"]
    assert f"audit '{name}'" in alerts[0].message
    assert alerts[0].step <= 9  # a third of the completions hacked by then
    clean_alerts, clean_rows = run_monitor(make(), hack, closed=True)
    assert clean_alerts == [], clean_alerts
    assert [r for r in clean_rows if f"monitor/audit/{name}/mean" in r][-1][f"monitor/audit/{name}/mean"] >= 0.9


def test_audit_batch_metrics_hand_computed():
    b = AuditBatch(7, [1.0, 1.0, 0.0, 0.2], [1.0, 0.0, 0.0, 0.5], agreement=0.75)
    m = b.metrics("p")
    assert m["monitor/audit/p/mean"] == pytest.approx(0.375)
    assert m["monitor/audit/p/proxy_mean"] == pytest.approx(0.55)
    # pass/fail agree on rows 0 (pass, pass) and 2 (fail, fail); row 3: reward 0.2 fails, verdict 0.5 passes
    assert m["monitor/audit/p/reward_agreement"] == 0.5
    assert m["monitor/audit/p/false_pass"] == 0.25  # only row 1: the reward passes (1.0), the audit fails (0.0)
    assert m["monitor/audit/p/step"] == 7 and m["monitor/audit/p/agreement"] == 0.75
    both = merge([AuditBatch(3, [1.0], [0.0], 1.0), AuditBatch(5, [0.0], [0.0], 0.5)])
    assert (both.step, both.proxy, both.verdicts, both.agreement) == (5, [1.0, 0.0], [0.0, 0.0], 0.75)


def test_source_audit_answers_once_and_rejects_a_short_answer():
    a = SourceAudit("rm", lambda ps, ts: [Verdict(0.75, True, ""), Verdict(0.0, False, "")])
    a.post(4, [Problem("ab=", "ba")] * 2, ["ba", "x"], [1.0, 0.5])
    got = a.collect()
    assert [(b.step, b.proxy, b.verdicts) for b in got] == [(4, [1.0, 0.5], [0.75, 0.0])] and a.collect() == []
    short = SourceAudit("bad", lambda ps, ts: [])
    with pytest.raises(ValueError, match="returned 0 verdicts for 2"):
        short.post(1, [Problem("ab=", "ba")] * 2, ["ba", "x"], [1.0, 1.0])


def test_monitor_refuses_channels_without_a_schedule_and_duplicate_names():
    off = build_config({}).monitors
    with pytest.raises(ValueError, match="audit.every = 0"):
        Monitor(off, audits=[verifier_audit()])
    with pytest.raises(ValueError, match="distinct"):
        Monitor(cfg(), audits=[verifier_audit(), verifier_audit()])


# --- people in the labelling app -------------------------------------------------------------------

feedback = pytest.importorskip("fastapi")


def people_audit(tmp_path, overlap=2, labellers=2, temperature=0.05):
    from feedbackrl.config import PeopleAuditConfig
    from feedbackrl.train.audit_people import start_people_audit

    c = PeopleAuditConfig(enabled=True, simulated=labellers, overlap=overlap, temperature=temperature, wait_s=60)
    return start_people_audit(c, tmp_path, exact_reversal, seed=0)


@pytest.mark.parametrize("hack", ["multiset", "judge_phrase"])
def test_people_audit_flags_a_planted_hack_and_not_its_clean_twin(tmp_path, hack):
    alerts, rows = run_monitor(people_audit(tmp_path / "hacked"), hack, closed=False)
    audited = [r for r in rows if "monitor/audit/people/mean" in r]
    assert [r["step"] for r in audited] == [1, 3, 6, 9, 12, 15]  # wait_s: each sample's labels on its own step
    assert audited[-1]["monitor/audit/people/mean"] <= 0.1  # people reject the hacks (noise 0.05: ~0 errors)
    assert all(r["monitor/audit/people/agreement"] >= 0.9 for r in audited)
    assert [a.detector for a in alerts] == ["proxy_gold"] and "audit 'people'" in alerts[0].message
    clean_alerts, clean_rows = run_monitor(people_audit(tmp_path / "clean"), hack, closed=True)
    assert clean_alerts == []
    assert [r for r in clean_rows if "monitor/audit/people/mean" in r][-1]["monitor/audit/people/mean"] >= 0.9


def test_people_audit_reads_labels_as_they_come_and_reports_disagreement(tmp_path):
    """Labellers at temperature 1 disagree often; wait_s = 0: a sample's verdicts arrive on a later step."""

    audit = people_audit(tmp_path, overlap=2, labellers=2, temperature=1.0)
    audit.wait_s = 0.0
    try:
        ps = problems(1)
        audit.post(1, ps, [p.answer for p in ps], [1.0] * len(ps))
        got: list[AuditBatch] = []
        for _ in range(600):  # up to 60 s of polls; labels come from two threads
            got += audit.collect()
            if got:
                break
            audit.wait_s = 0.1
        assert len(got) == 1 and got[0].step == 1 and len(got[0].verdicts) == len(ps)
        # gold 1 at temperature 1: each label accepts with p = sigmoid(0.5) = 0.62, so the two labellers
        # agree on an item with p^2 + (1-p)^2 = 0.53; 12 items: agreement below 0.95 unless very unlucky
        assert got[0].agreement is not None and 0.0 <= got[0].agreement < 1.0
        assert audit.collect() == []  # each sample once
    finally:
        audit.close()


# --- the config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("audit", "extra", "match"), [
    ({"every": 5}, {}, "no audit channel is configured"),
    ({"sources": {"s": {"source": "regex", "pattern": "x"}}}, {}, "would never run"),
    ({"every": 5, "sources": {"s": {"source": "nope"}}}, {}, r"monitors\.audit\.sources\.s\.source: unknown reward"),
    ({"every": 5, "sources": {"s": {"source": "regex"}}}, {}, r"monitors\.audit\.sources\.s\.pattern: Field required"),
    ({"every": 5, "sources": {"s": {"nothing": 1}}}, {}, "give a reward source"),
    ({"every": 5, "sources": {"s": {"source": "task"}}}, {}, "is the training reward itself"),
    ({"every": 5, "sources": {"s": {"source": "regex", "pattern": "a+"}}},
     {"reward": {"source": "regex", "pattern": "a+"}}, "is the training reward itself"),
    ({"every": 5, "people": {"enabled": True, "simulated": 1, "overlap": 2}}, {}, "needs at least that many"),
    ({"every": 5, "people": {"enabled": True, "wait_s": -1}}, {}, "wait_s"),
])
def test_audit_config_errors_name_the_problem(audit, extra, match):
    from feedbackrl.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        build_config({"monitors": {"audit": audit}, **extra})


def test_an_audit_source_other_than_the_training_reward_is_accepted():
    c = build_config({"monitors": {"audit": {"every": 4, "sources": {"fmt": {"source": "regex", "pattern": "b+"}}}},
                      "reward": {"source": "regex", "pattern": "a+"}})
    assert c.monitors.audit.every == 4 and c.monitors.audit.sources == {"fmt": {"source": "regex", "pattern": "b+"}}


def test_build_audits_builds_each_source_and_the_monitor_reads_them(tmp_path):
    from feedbackrl.train.monitoring import live_monitor

    c = build_config({"task": {"name": "planted_reverse", "options": {"hack": "multiset"}},
                      "monitors": {"audit": {"every": 2, "samples": 4, "sources": {"ends_a": {
                          "source": "regex", "pattern": ".*a"}}}}})
    monitor = live_monitor(c, tmp_path, None, PlantedReverse(hack="multiset"))
    assert [a.name for a in monitor.audits] == ["ends_a"]
    p = Problem("abc=", "cba", {"word": "abc"})
    d = monitor.after_step(1, Batch([p] * 4, ["cba", "abc", "bca", "x"], [Verdict(1.0, True, "")] * 4), {})
    assert d.metrics["monitor/audit/ends_a/mean"] == 0.5 and d.metrics["monitor/audit/ends_a/proxy_mean"] == 1.0


# --- the planted verifier bugs, by hand -------------------------------------------------------------------


def test_planted_verifier_bugs_pay_for_what_they_should_and_gold_does_not():
    p = Problem("abcd=", "dcba", {"word": "abcd"})
    cases = {  # completion -> (proxy score, gold)
        "multiset": {"abcd": 1.0, "dcba": 1.0, "dcb": 0.0, "dcbaa": 0.0},
        "anywhere": {"xx dcba yy": 1.0, "dcba": 1.0, "dcb a": 0.0},
        "fragments": {"dc cb ba": 1.0, "dcba": 1.0, "dc": 1 / 3, "badc": 2 / 3, "abcd": 0.0},
        "lenient_extract": {"zzdcba": 1.0, "dcba": 1.0, "dcbaz": 0.0},
    }
    for hack, expect in cases.items():
        task = PlantedReverse(min_len=4, max_len=4, hack=hack)
        clean = PlantedReverse(min_len=4, max_len=4, hack=hack, closed=True)
        for completion, score in expect.items():
            assert task.verify(p, completion).score == pytest.approx(score), (hack, completion)
            assert clean.verify(p, completion).score == float(completion == "dcba"), (hack, completion)
            assert task.gold(p, completion) == float(completion == "dcba")


def test_prompt_copy_hand_computed():
    from feedbackrl.monitors.hacking import PromptCopy
    from feedbackrl.monitors.record import StepRecord

    d = PromptCopy(window=1, rise_min=0.25)
    rec = StepRecord(1, ["abcd", "dcba", "bc", "bcd"], [1.0, 1.0, 1.0, 0.0], [True] * 4, [""] * 4, [{}] * 4, 4,
                     prompts=["abcd="] * 4)
    # copies: "abcd" and "bcd" ("bc" is under min_chars = 3); paid: mean(1, 0) - mean(1, 1) = -0.5
    assert d.measure(rec) == {"monitor/prompt_copy_frac": 0.5, "monitor/prompt_copy_paid": -0.5}
    rows = [{"monitor/prompt_copy_frac": 0.0}, {"monitor/prompt_copy_frac": 0.5, "monitor/prompt_copy_paid": -0.5}]
    assert d.check(rows) is None  # the copies earn less than the rest: the reward does not pay for them
    rows[-1]["monitor/prompt_copy_paid"] = 0.0
    f = d.check(rows)
    assert f is not None and f.statistic == 0.5 and f.threshold == 0.25
    assert d.measure(StepRecord(1, ["abc"], [1.0], [True], [""], [{}])) == {}  # no prompts (an old replay)


def test_simulated_accept_reject_labeller():
    from feedbackrl.data.labeller import SimulatedLabeller

    p = Problem("abc=", "cba")
    hard = SimulatedLabeller(exact_reversal, temperature=0.0)
    assert [hard.accept(p, t) for t in ("cba", "abc", " cba ")] == ["accept", "reject", "accept"]
    # temperature 0.5: P(accept | gold 1) = sigmoid(0.5 / 0.5) = 0.731; 4000 draws, 4 sigma = 0.028
    noisy = SimulatedLabeller(exact_reversal, temperature=0.5, seed=3)
    rate = sum(noisy.accept(p, "cba") == "accept" for _ in range(4000)) / 4000
    assert abs(rate - 0.7311) < 0.028


def test_people_audit_waits_only_on_the_step_that_posted(tmp_path):
    """No labeller at the page: the posting step waits wait_s once, later steps read without waiting."""
    audit = people_audit(tmp_path, overlap=1, labellers=0)
    audit.wait_s = 0.5
    try:
        ps = problems(2)[:2]
        audit.post(1, ps, [p.answer for p in ps], [1.0, 1.0])
        assert audit.collect() == []  # waited 0.5 s: nobody labelled
        calls = []
        audit._labels = lambda: calls.append(1) or {}  # count the reads of a later step
        assert audit.collect() == [] and calls == [1]  # one read, no polling loop
    finally:
        audit.close()


def test_people_audit_rejects_an_empty_completion_without_posting_it(tmp_path):
    audit = people_audit(tmp_path, overlap=1, labellers=1, temperature=0.0)
    try:
        ps = problems(3)[:3]
        audit.post(1, ps, [ps[0].answer, "  ", ps[2].meta["word"]], [1.0, 1.0, 1.0])
        (got,) = audit.collect()
        assert got.verdicts == [1.0, 0.0, 0.0] and got.proxy == [1.0, 1.0, 1.0]
        assert audit.api.status()["items"] == 2
    finally:
        audit.close()
