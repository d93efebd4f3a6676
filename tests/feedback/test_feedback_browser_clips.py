"""A segment-pair item in a real browser (Playwright driving Debian's headless Chromium): two CartPole clips,
rendered from `rgb_array` frames to GIF, load and play side by side; the keyboard labels them (the left/right
keys follow the shuffled display order, t tie, s skip, p replays both without submitting); a double submit
stores one label. Skipped, with the reason, when Chromium, playwright or the control extra is missing.

Set FEEDBACKRL_UPDATE_SCREENSHOTS=1 to refresh docs/segment_labelling.png from this run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import LiveServer
from test_feedback_browser import browser, login  # noqa: F401  (the Chromium fixture)

from feedbackrl.feedback.app import create_app
from feedbackrl.feedback.clips import add_clip
from feedbackrl.feedback.export import labelled_pairs
from feedbackrl.feedback.items import add_items
from feedbackrl.feedback.store import Label, add_member, create_labeller, create_project, open_db

gym = pytest.importorskip("gymnasium", reason="the control extra renders the clips")
pytest.importorskip("pygame", reason="classic control draws its frames with pygame")
DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "segment_labelling.png"


def cartpole_clip(policy, seed: int, steps: int = 20) -> bytes:
    """A GIF of `steps` CartPole frames under `policy(obs)`; after the pole falls, the last frame dimmed."""
    from feedbackrl.control.video import encode_gif, headless, shrink

    headless()
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    obs, _ = env.reset(seed=seed)
    frames = []
    for _ in range(steps):
        frames.append(shrink(env.render()))
        obs, _, terminated, _, _ = env.step(policy(obs))
        if terminated:
            break
    env.close()
    dimmed = (frames[-1] * 0.35 + 150).astype("uint8")
    return encode_gif(frames + [dimmed] * (steps - len(frames)), fps=10)


def balance(obs) -> int:  # push towards where the pole leans
    return int(obs[2] + 0.5 * obs[3] > 0)


def test_label_segment_pairs_with_the_keyboard(browser, tmp_path):  # noqa: F811
    sessions = open_db(f"sqlite:///{tmp_path / 'feedback.db'}")
    clips = [(cartpole_clip(balance, s), cartpole_clip(lambda _: 0, s)) for s in range(3)]
    with sessions() as s:
        project = create_project(s, "cartpole-segments", "pairwise",
                                 instructions="Which clip keeps the pole up? 1 left, 2 right, t tie, s skip, p replay")
        alice, token = create_labeller(s, "alice")
        add_member(s, project, alice)
        refs = [[add_clip(s, project, data)[0] for data in pair] for pair in clips]  # response 0 balances
        s.commit()
        items = add_items(s, project, [{"prompt": f"segment pair {i + 1}", "responses": r}
                                       for i, r in enumerate(refs)])
        pid = project.id

    with LiveServer(create_app(sessions=sessions)) as server:
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.set_default_timeout(20_000)
        login(page, server.url, token)
        page.goto(f"{server.url}/projects/{pid}")
        # both clips load as 300 x 200 images (600 x 400 frames shrunk), side by side
        page.wait_for_function("() => [...document.querySelectorAll('img.clip')].every(i => i.complete && "
                               "i.naturalWidth === 300 && i.naturalHeight === 200)")
        boxes = [page.locator(f"#clip-{k}").bounding_box() for k in (1, 2)]
        assert boxes[0]["x"] + boxes[0]["width"] <= boxes[1]["x"] and abs(boxes[0]["y"] - boxes[1]["y"]) < 1, boxes
        # it plays: the balancing clip (the cart moves under it) looks different from one moment to the next
        balancing = page.locator(".response[data-index='0'] img.clip")
        shots = set()
        for _ in range(6):
            shots.add(balancing.screenshot())
            page.wait_for_timeout(250)
        assert len(shots) >= 2, "the clip did not change over 1.5 s: not animated"
        first = page.inner_text("#prompt")
        page.keyboard.press("p")  # replay both: no submission
        page.wait_for_timeout(200)
        assert page.inner_text("#prompt") == first
        page.wait_for_timeout(1200)  # a moment into the clips: the falling pole has tipped
        page.screenshot(path=str(tmp_path / "segment_labelling.png"))

        def key_for_balancing() -> str:  # the display order is shuffled per labeller; data-index is the stored one
            shown = page.locator(".response").evaluate_all("els => els.map(e => Number(e.dataset.index))")
            return str(shown.index(0) + 1)

        # a double submit of one rendered form (same submission id), as a double click would send it
        button = f"btn-{key_for_balancing()}"
        with page.expect_navigation():
            page.evaluate("(id) => { const f = document.getElementById('label-form'); const b = "
                          "document.getElementById(id); f.requestSubmit(b); f.requestSubmit(b); }", button)
        order = [first, page.inner_text("#prompt")]
        assert order[1] != first
        with page.expect_navigation():
            page.keyboard.press("t")
        order.append(page.inner_text("#prompt"))
        with page.expect_navigation():
            page.keyboard.press("s")
        assert page.locator("#empty").is_visible()

    if os.environ.get("FEEDBACKRL_UPDATE_SCREENSHOTS"):
        shutil.copy(tmp_path / "segment_labelling.png", DOCS_PNG)
    with sessions() as s:
        stored = s.query(Label).order_by(Label.id).all()
        rows = labelled_pairs(s, s.get(type(project), pid), ties=True)
    item_of = {f"segment pair {i + 1}": item for i, item in enumerate(items)}
    ref_of = {f"segment pair {i + 1}": r for i, r in enumerate(refs)}
    assert [(x.item_id, x.choice) for x in stored] == [(item_of[order[0]], "a"), (item_of[order[1]], "tie"),
                                                       (item_of[order[2]], "skip")]
    assert [(r["prompt"], r["chosen"], r.get("tie", False)) for r in rows] == [
        (order[0], ref_of[order[0]][0], False), (order[1], ref_of[order[1]][0], True)]
    sessions.kw["bind"].dispose()
