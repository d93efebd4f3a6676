"""A real browser (Playwright driving Debian's headless Chromium) logs in and labels with the
keyboard only (pairs: 1/2 by position, / reason, Esc, s skip, u undo, t tie; rankings: digits,
Backspace; accept/reject: a/r); the export holds exactly those judgements. Skipped, with the
reason, when /usr/bin/chromium or playwright is missing.

Set FEEDBACKRL_UPDATE_SCREENSHOTS=1 to refresh docs/labelling.png from this run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import LiveServer

from feedbackrl.data.preferences import load_preference_pairs
from feedbackrl.feedback import labels as L
from feedbackrl.feedback.app import create_app
from feedbackrl.feedback.export import export_rows, labelled_pairs
from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.store import add_member, create_labeller, create_project, open_db

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "labelling.png"
WORDS = ["graph theory", "reward model", "human feedback"]


def rev(words: str, keep_last: bool = False) -> str:
    parts = [w[::-1] for w in words.split()]
    return " ".join(parts[:-1] + [words.split()[-1]]) if keep_last else " ".join(parts)


ROWS = [{"prompt": f"Reverse the letters of each word.\nInput: {w}", "responses": [rev(w), rev(w, keep_last=True)]}
        for w in WORDS]  # response 0 is right, response 1 forgets the last word


def login(page, url: str, token: str) -> None:
    page.goto(f"{url}/login")
    page.fill("input[name=token]", token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{url}/")  # the cookie is set once the redirect lands


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, timeout=60_000)
        yield b
        b.close()


def test_label_pairs_with_the_keyboard_and_export(browser, tmp_path):
    sessions = open_db(f"sqlite:///{tmp_path / 'feedback.db'}")
    with sessions() as s:
        project = create_project(s, "reverse-words", "pairwise", overlap=2,
                                 instructions="Which response reverses every word correctly?")
        (alice, token), (bob, _) = create_labeller(s, "alice"), create_labeller(s, "bob")
        add_member(s, project, alice)
        add_member(s, project, bob)
        s.commit()
        items = add_items(s, project, ROWS)
        for n, item in enumerate(items):  # bob prefers the right answer every time
            L.submit(s, bob, project, L.Submission(f"bob{n}", item, "a"))

    with LiveServer(create_app(sessions=sessions)) as server:
        page = browser.new_page(viewport={"width": 1100, "height": 720})
        page.set_default_timeout(20_000)
        login(page, server.url, token)
        page.click("text=reverse-words")
        page.wait_for_selector("#label-form")

        def press(key: str) -> None:
            with page.expect_navigation():
                page.keyboard.press(key)

        def key_for_right_answer() -> str:  # responses are shown shuffled; data-index is the stored one
            shown = page.locator(".response").evaluate_all("els => els.map(e => Number(e.dataset.index))")
            return str(shown.index(0) + 1)

        press(key_for_right_answer())
        page.keyboard.press("/")
        page.keyboard.type("the second word is not reversed")
        page.keyboard.press("Escape")
        page.screenshot(path=str(tmp_path / "labelling.png"))
        press(key_for_right_answer())
        third = page.inner_text("#prompt")
        press("s")
        assert page.locator("#empty").is_visible()  # skipped the last one: nothing left
        press("u")  # undo the skip: the item comes back
        assert page.inner_text("#prompt") == third
        press("t")
        progress = page.inner_text("#progress")
        assert page.locator("#empty").is_visible()
        assert "done 3" in progress and "remaining 0" in progress and "67%" in progress, progress

    if os.environ.get("FEEDBACKRL_UPDATE_SCREENSHOTS"):
        shutil.copy(tmp_path / "labelling.png", DOCS_PNG)
    with sessions() as s:
        p = s.get(type(project), project.id)
        pairs, dropped = load_preference_pairs(labelled_pairs(s, p))
        raw = export_rows(s, p, "labels")
    alice_pairs = [pp for pp in pairs if pp.meta["labeller"] == "alice"]
    assert dropped == [] and len(alice_pairs) == 2  # the tie states no preference
    assert all(pp.chosen == rev(pp.prompt.split(": ")[1]) for pp in alice_pairs)
    assert alice_pairs[1].meta["reason"] == "the second word is not reversed"
    assert sorted(r["choice"] for r in raw if r["labeller"] == "alice") == ["a", "a", "tie"]  # skip was undone
    sessions.kw["bind"].dispose()


def test_ranking_and_accept_reject_keys(browser, tmp_path):
    """Digits rank best first and submit at k; a/r accept and reject."""
    sessions = open_db(f"sqlite:///{tmp_path / 'feedback.db'}")
    with sessions() as s:
        ranking, verdicts = create_project(s, "rank", "ranking"), create_project(s, "keep", "accept_reject")
        alice, token = create_labeller(s, "alice")
        add_member(s, ranking, alice)
        add_member(s, verdicts, alice)
        s.commit()
        add_items(s, ranking, [{"prompt": "order these", "responses": ["first", "second", "third"]}])
        add_items(s, verdicts, [{"prompt": "q", "response": "keep me"}, {"prompt": "q", "response": "drop me"}])
        ids = ranking.id, verdicts.id

    with LiveServer(create_app(sessions=sessions)) as server:
        page = browser.new_page()
        page.set_default_timeout(20_000)
        login(page, server.url, token)
        page.goto(f"{server.url}/projects/{ids[0]}")
        shown = page.locator(".response").evaluate_all("els => els.map(e => Number(e.dataset.index))")
        keys = [str(shown.index(j) + 1) for j in (2, 0, 1)]  # want third > first > second
        page.keyboard.press(keys[0])
        page.keyboard.press(keys[1])
        page.keyboard.press("Backspace")  # changed my mind: type it again
        page.keyboard.press(keys[1])
        with page.expect_navigation():
            page.keyboard.press(keys[2])  # the k-th digit submits
        assert page.locator("#empty").is_visible()
        page.goto(f"{server.url}/projects/{ids[1]}")
        for _ in range(2):
            key = "a" if page.inner_text(".response pre") == "keep me" else "r"
            with page.expect_navigation():
                page.keyboard.press(key)
        assert page.locator("#empty").is_visible()
    with sessions() as s:
        pairs = [labelled_pairs(s, s.get(type(ranking), i)) for i in ids]
    assert [(p["chosen"], p["rejected"]) for p in pairs[0]] == [("third", "first"), ("third", "second"),
                                                               ("first", "second")]
    assert [(p["chosen"], p["rejected"]) for p in pairs[1]] == [("keep me", "drop me")]
    sessions.kw["bind"].dispose()
