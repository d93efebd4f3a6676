"""Items to judge: from JSONL rows (`label import`) or sampled from a policy (`label fill`).

An item row is ``{"prompt": str, "responses": [str, ...], ...}``; any other keys are kept as the
item's `meta`. How many responses a row needs depends on the project kind: 2 (pairwise), 2 or
more (ranking), 1 (accept_reject; ``"response": str`` is accepted too). Responses within an item
must be distinct and non-empty, so every exported pair is a valid preference pair.

A response ``"clip:<sha256>"`` names a clip uploaded to the project (`clips.py`): the item shows it as an
animated clip, e.g. the two trajectory segments of a segment pair; an item's responses are all clips or none.

`add_items` is also the queue-refill seam for an online loop: it validates every row first and
writes all or nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from feedbackrl.data.rows import DatasetError, read_jsonl, read_text
from feedbackrl.feedback.clips import is_clip, missing_clips
from feedbackrl.feedback.store import FeedbackError, Item, Project, check_text

TEXT_MAX = 100_000
SHOWN = 5


def _bad(index: int, problem: str) -> str:
    return f"row {index}: {problem}"


def parse_item_row(row: Any, index: int, kind: str) -> dict[str, Any]:
    """One row -> {"prompt", "responses", "meta"}; raises FeedbackError naming the row and the problem."""
    if not isinstance(row, Mapping):
        raise FeedbackError(_bad(index, f"expected an object with prompt and responses, got {type(row).__name__}"))
    responses = row.get("responses")
    if responses is None and kind == "accept_reject" and "response" in row:
        responses = [row["response"]]
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise FeedbackError(_bad(index, f"'prompt' must be non-empty text (columns: {', '.join(map(str, row))})"))
    if not isinstance(responses, list) or not all(isinstance(r, str) for r in responses):
        raise FeedbackError(_bad(index, "'responses' must be a list of strings"))
    need = {"pairwise": "exactly 2", "ranking": "at least 2", "accept_reject": "exactly 1"}[kind]
    ok = {"pairwise": len(responses) == 2, "ranking": len(responses) >= 2,
          "accept_reject": len(responses) == 1}[kind]
    if not ok:
        raise FeedbackError(_bad(index, f"a {kind} item needs {need} responses, got {len(responses)}"))
    if any(not r.strip() for r in responses):
        raise FeedbackError(_bad(index, "empty response"))
    if len(set(responses)) != len(responses):
        raise FeedbackError(_bad(index, "identical responses: there is nothing to compare"))
    if max(len(prompt), *map(len, responses)) > TEXT_MAX:
        raise FeedbackError(_bad(index, f"a prompt or response is longer than {TEXT_MAX} characters"))
    meta = {k: v for k, v in row.items() if k not in ("prompt", "responses", "response")}
    try:
        check_text(prompt, "'prompt'")
        for i, response in enumerate(responses):
            check_text(response, f"response {i}")
        check_text(meta, "metadata")
    except FeedbackError as e:
        raise FeedbackError(_bad(index, str(e))) from None
    return {"prompt": prompt, "responses": list(responses), "meta": meta}


def add_items(s: Session, project: Project, rows: Iterable[Any]) -> list[int]:
    """Validate all rows, then add them as items of `project` (all or nothing). -> new item ids. Commits."""
    parsed, problems = [], []
    for i, row in enumerate(rows):
        try:
            parsed.append(parse_item_row(row, i, project.kind))
        except FeedbackError as e:
            problems.append(str(e))
    for i, p in enumerate(parsed):
        clips = [is_clip(r) for r in p["responses"]]
        if any(clips) and not all(clips):
            problems.append(_bad(i, "responses mix clips and text: an item shows clips or text, not both"))
        elif any(clips) and (missing := missing_clips(s, project, p["responses"])):
            problems.append(_bad(i, f"no clip {', '.join(missing)} in this project: upload it first "
                                    f"(POST /api/projects/{project.id}/clips)"))
    if problems:
        more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise FeedbackError(f"{len(problems)} bad item row(s), nothing imported:\n  "
                            + "\n  ".join(problems[:SHOWN]) + more)
    items = [Item(project_id=project.id, **p) for p in parsed]
    s.add_all(items)
    s.commit()
    return [item.id for item in items]


def read_prompts(path: Path) -> list[str]:
    """Prompts from a .jsonl file (a "prompt" field per line) or a text file (one prompt per line)."""
    if path.suffix.lower() == ".jsonl":
        try:
            rows = read_jsonl(path)
        except DatasetError as e:
            raise FeedbackError(str(e)) from None
        bad = [i for i, r in enumerate(rows) if not (isinstance(r, dict) and isinstance(r.get("prompt"), str))]
        if bad:
            raise FeedbackError(f"{path}: rows {bad[:SHOWN]} have no text 'prompt' field")
        return [r["prompt"] for r in rows]
    try:
        text = read_text(path)
    except DatasetError as e:
        raise FeedbackError(str(e)) from None
    return [line for line in text.splitlines() if line.strip()]


def group_samples(prompt: str, samples: list[str], kind: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """K samples for one prompt -> item rows: disjoint pairs, one ranking of the distinct samples,
    or one accept/reject item per sample. Identical or empty samples are dropped (nothing to judge)."""
    distinct = list(dict.fromkeys(x for x in samples if x.strip()))
    if kind == "pairwise":
        groups = [distinct[i:i + 2] for i in range(0, len(distinct) - 1, 2)]
    elif kind == "ranking":
        groups = [distinct] if len(distinct) >= 2 else []
    else:
        groups = [[x] for x in distinct]
    return [{"prompt": prompt, "responses": g, **meta} for g in groups]


def sample_items(model_dir: str, prompts: list[str], samples: int, kind: str, max_new_tokens: int,
                 temperature: float, seed: int, batch_size: int = 32) -> list[dict[str, Any]]:
    """Sample `samples` completions per prompt from a checkpoint -> item rows for `kind`."""
    import torch

    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.rollout.generate import generate

    model, tokenizer = load_policy(model_dir), load_tokenizer(model_dir)
    gen = torch.Generator().manual_seed(seed)
    meta = {"source": "fill", "model": str(model_dir), "temperature": temperature, "seed": seed}
    rows: list[dict[str, Any]] = []
    per_batch = max(1, batch_size // samples)
    for start in range(0, len(prompts), per_batch):
        chunk = prompts[start:start + per_batch]
        texts = generate(model, tokenizer, [p for p in chunk for _ in range(samples)], max_new_tokens,
                         temperature=temperature, generator=gen).texts
        for j, prompt in enumerate(chunk):
            rows += group_samples(prompt, texts[j * samples:(j + 1) * samples], kind, meta)
    return rows
