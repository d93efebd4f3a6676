import json

import pytest

from feedbackrl.data.preferences import (
    DatasetError,
    PreferencePair,
    Ranking,
    load_preference_pairs,
    load_rankings,
)

GOOD = {"prompt": "2+2?", "chosen": "4", "rejected": "5", "source": "toy"}


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _write_jsonl(path, rows) -> None:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")


def test_text_pairs_from_jsonl_keep_extra_columns_as_meta(tmp_path):
    path = tmp_path / "prefs.jsonl"
    _write_jsonl(path, [GOOD, "", {"prompt": "3+3?", "chosen": "6", "rejected": "9"}])  # blank line skipped
    pairs, dropped = load_preference_pairs(path)
    assert dropped == []
    assert pairs == [
        PreferencePair("2+2?", "4", "5", {"source": "toy", "row_index": 0}),
        PreferencePair("3+3?", "6", "9", {"row_index": 1}),
    ]


BAD_ROWS = [
    pytest.param({"prompt": "p", "rejected": "r"}, "missing column 'chosen'", id="missing-chosen"),
    pytest.param({"chosen": "c", "rejected": "r"}, "missing column 'prompt'", id="missing-prompt"),
    pytest.param({"prompt": "p", "chosen": None, "rejected": "r"}, "missing column 'chosen'",
                 id="null-chosen"),
    pytest.param({"prompt": "p", "chosen": "  \n", "rejected": "r"}, "empty chosen response",
                 id="empty-chosen"),
    pytest.param({"prompt": "p", "chosen": "same", "rejected": "same"}, "chosen and rejected are identical",
                 id="identical"),
    pytest.param({"prompt": "p", "chosen": 4, "rejected": "r"}, "column 'chosen' must be text",
                 id="int-chosen"),
    pytest.param({"prompt": "p", "chosen": [{"content": "c"}], "rejected": "r"}, "'chosen[0]' must be a",
                 id="message-without-role"),
    pytest.param({"prompt": [_user("p")], "chosen": [_assistant("")], "rejected": [_assistant("r")]},
                 "empty chosen response", id="empty-chat-turn"),
    pytest.param({"prompt": [_user("p")], "chosen": [_assistant("c")], "rejected": [_assistant("c")]},
                 "chosen and rejected are identical", id="identical-chat"),
    pytest.param({"chosen": [_user("a"), _assistant("x")], "rejected": [_user("b"), _assistant("x")]},
                 "chosen and rejected first differ at a 'user' message", id="chat-diverges-at-user"),
]


@pytest.mark.parametrize("bad, problem", BAD_ROWS)
def test_each_bad_row_is_rejected_with_its_index_and_columns(bad, problem):
    with pytest.raises(DatasetError) as err:
        load_preference_pairs([GOOD, bad, GOOD])
    msg = str(err.value)
    assert f"row 1: {problem}" in msg
    assert f"(columns: {', '.join(bad)})" in msg
    assert "on_bad_row='drop'" in msg
    assert [i.index for i in err.value.issues] == [1]


def test_non_mapping_row_and_invalid_json_line_are_bad_rows(tmp_path):
    path = tmp_path / "prefs.jsonl"
    _write_jsonl(path, [GOOD, "[1, 2]", "{not json", GOOD])
    pairs, dropped = load_preference_pairs(path, on_bad_row="drop")
    assert len(pairs) == 2
    assert [str(i) for i in dropped] == [
        "row 1: row is a list, not a mapping of column -> value (columns: none)",
        "row 2: invalid JSON on line 3: Expecting property name enclosed in double quotes (columns: none)",
    ]


def test_drop_mode_returns_good_rows_and_dropped_issues():
    rows = [GOOD, {"prompt": "p", "chosen": "x", "rejected": "x"}, {"chosen": "c"}, {**GOOD, "prompt": "q"}]
    pairs, dropped = load_preference_pairs(rows, on_bad_row="drop")
    assert [p.prompt for p in pairs] == ["2+2?", "q"]
    assert [p.meta["row_index"] for p in pairs] == [0, 3]
    assert [(i.index, i.columns) for i in dropped] == [(1, ("prompt", "chosen", "rejected")),
                                                       (2, ("chosen",))]


def test_fail_mode_lists_only_the_first_few_problems():
    rows = [{"prompt": "p"}] * 8
    with pytest.raises(DatasetError) as err:
        load_preference_pairs(rows)
    msg = str(err.value)
    assert msg.startswith("8 bad preference row(s) out of 8")
    assert "row 4:" in msg and "row 5:" not in msg and "... and 3 more" in msg
    assert len(err.value.issues) == 8


def test_on_bad_row_must_be_fail_or_drop():
    with pytest.raises(ValueError, match="on_bad_row must be 'fail' or 'drop'; got 'skip'"):
        load_preference_pairs([GOOD], on_bad_row="skip")


def test_chat_pair_with_explicit_prompt_renders_simple_template():
    row = {"prompt": [{"role": "system", "content": "Be brief."}, _user("2+2?")],
           "chosen": [_assistant("4")], "rejected": [_assistant("5")]}
    (pair,), _ = load_preference_pairs([row])
    assert pair.prompt == "<|system|>\nBe brief.<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n"
    assert pair.chosen == "4<|end|>\n"
    assert pair.rejected == "5<|end|>\n"


def test_chat_pair_with_implicit_prompt_uses_shared_prefix():
    # Anthropic-HH-style: whole conversations, shared up to the last assistant turn.
    chosen = [_user("hi"), _assistant("hello"), _user("2+2?"), _assistant("4")]
    rejected = [_user("hi"), _assistant("hello"), _user("2+2?"), _assistant("5")]
    (pair,), _ = load_preference_pairs([{"chosen": chosen, "rejected": rejected}])
    assert pair.prompt == ("<|user|>\nhi<|end|>\n<|assistant|>\nhello<|end|>\n"
                           "<|user|>\n2+2?<|end|>\n<|assistant|>\n")
    assert (pair.chosen, pair.rejected) == ("4<|end|>\n", "5<|end|>\n")


def test_chat_pair_with_string_prompt_inside_conversations_is_not_repeated():
    # UltraFeedback-binarized style: prompt string and full conversations that already hold it.
    row = {"prompt": "2+2?", "chosen": [_user("2+2?"), _assistant("4")],
           "rejected": [_user("2+2?"), _assistant("5")]}
    (pair,), _ = load_preference_pairs([row])
    assert pair.prompt == "<|user|>\n2+2?<|end|>\n<|assistant|>\n"
    # ... and a string prompt with assistant-only continuations becomes the user turn.
    (pair2,), _ = load_preference_pairs([{"prompt": "2+2?", "chosen": [_assistant("4")],
                                          "rejected": [_assistant("5")]}])
    assert pair2 == PreferencePair(pair.prompt, "4<|end|>\n", "5<|end|>\n", {"row_index": 0})


class _FakeTokenizer:
    """ChatML-like template, as Qwen's tokenizers render it."""

    def apply_chat_template(self, conversation, tokenize=True, add_generation_prompt=False):
        assert tokenize is False
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_chat_pair_with_tokenizer_chat_template():
    row = {"prompt": [_user("2+2?")], "chosen": [_assistant("4")], "rejected": [_assistant("5")]}
    (pair,), _ = load_preference_pairs([row], tokenizer=_FakeTokenizer())
    assert pair.prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert (pair.chosen, pair.rejected) == ("4<|im_end|>\n", "5<|im_end|>\n")


def test_chat_template_that_does_not_prefix_is_a_bad_row():
    class Reordering(_FakeTokenizer):
        def apply_chat_template(self, conversation, tokenize=True, add_generation_prompt=False):
            return ("<gen>" if add_generation_prompt else "<full>") + str(len(conversation))

    row = {"prompt": [_user("2+2?")], "chosen": [_assistant("4")], "rejected": [_assistant("5")]}
    with pytest.raises(DatasetError, match="row 0: the chat template does not render the prompt as a prefix"):
        load_preference_pairs([row], tokenizer=Reordering())


def test_rankings_best_first_and_from_ranks():
    rows = [
        {"prompt": "p", "responses": ["best", "mid", "worst"]},
        # rank 1 = best: "a" is 3rd, "b" 1st, "c" 2nd -> b, c, a
        {"prompt": "q", "responses": ["a", "b", "c"], "ranks": [3, 1, 2], "id": 7},
    ]
    rankings, dropped = load_rankings(rows)
    assert dropped == []
    assert rankings == [Ranking("p", ["best", "mid", "worst"], {"row_index": 0}),
                        Ranking("q", ["b", "c", "a"], {"id": 7, "row_index": 1})]


BAD_RANKINGS = [
    pytest.param({"prompt": "p"}, "missing column 'responses'", id="missing-responses"),
    pytest.param({"prompt": "p", "responses": ["only"]}, "column 'responses' must be a list of at least 2",
                 id="one-response"),
    pytest.param({"prompt": "p", "responses": ["a", "b"], "ranks": [1, 1]}, "'ranks' has ties", id="ties"),
    pytest.param({"prompt": "p", "responses": ["a", "b"], "ranks": [1]}, "'ranks' has 1 entries",
                 id="ranks-len"),
    pytest.param({"prompt": "p", "responses": ["a", "b"], "ranks": ["1", "2"]},
                 "column 'ranks' must be a list of integers",
                 id="ranks-type"),
    pytest.param({"prompt": "p", "responses": ["a", ""]}, "empty response 1", id="empty"),
    pytest.param({"prompt": "p", "responses": ["a", "b", "a"]}, "response 0 and response 2 are identical",
                 id="duplicate"),
    pytest.param({"prompt": "p", "responses": ["a", 3]}, "column 'responses[1]' must be text",
                 id="int-response"),
]


@pytest.mark.parametrize("bad, problem", BAD_RANKINGS)
def test_bad_ranking_rows_are_rejected_with_their_index(bad, problem):
    good = {"prompt": "p", "responses": ["a", "b"]}
    with pytest.raises(DatasetError) as err:
        load_rankings([good, good, bad])
    assert f"row 2: {problem}" in str(err.value)


def test_chat_rankings_render_each_response_after_the_prompt():
    rows = [{"prompt": [_user("hi")], "responses": [[_assistant("hello")], "hey"], "ranks": [2, 1]}]
    (ranking,), _ = load_rankings(rows)
    assert ranking.prompt == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    assert ranking.responses == ["hey<|end|>\n", "hello<|end|>\n"]


def test_parquet_round_trip(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / "prefs.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD, {**GOOD, "chosen": "four"}]), path)
    pairs, _ = load_preference_pairs(path)
    assert [p.chosen for p in pairs] == ["4", "four"]


def test_csv_pairs_and_a_missing_file(tmp_path):
    path = tmp_path / "prefs.csv"
    path.write_text('prompt,chosen,rejected\n2+2?,4,"5, or so"\n')
    pairs, _ = load_preference_pairs(path)
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("2+2?", "4", "5, or so")]
    with pytest.raises(DatasetError, match=r"data file '.*nope\.csv' does not exist"):
        load_preference_pairs(tmp_path / "nope.csv")


def test_json_array_file(tmp_path):
    path = tmp_path / "prefs.json"
    path.write_text(json.dumps([GOOD]))
    pairs, _ = load_preference_pairs(path)
    assert pairs[0].chosen == "4"


def test_hugging_face_dataset():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([
        {"prompt": [_user("2+2?")], "chosen": [_assistant("4")], "rejected": [_assistant("4")]},
        {"prompt": [_user("2+2?")], "chosen": [_assistant("4")], "rejected": [_assistant("5")]},
    ])
    pairs, dropped = load_preference_pairs(ds, on_bad_row="drop")
    assert [(p.chosen, p.rejected) for p in pairs] == [("4<|end|>\n", "5<|end|>\n")]
    assert [(i.index, i.problem) for i in dropped] == [(0, "chosen and rejected are identical")]
