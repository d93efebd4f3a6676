"""Instruction constraints: every checker has a tricky accept and a tricky reject case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feedbackrl.cli_verify import verify_app
from feedbackrl.rewards.instructions import (
    CHECKERS,
    ConstraintsVerifier,
    checker_params,
    load_constraint,
    load_constraints,
)
from feedbackrl.rewards.verdict import Problem

AT_LEAST_3 = {"relation": "at least", "num": 3}

CASES = [
    # id, spec, response, passes
    ("words-hyphen-apostrophe-count-once", {"id": "length_words", "relation": "exactly", "num": 3},
     "Don't over-think it!", True),
    ("words-punctuation-is-not-a-word", {"id": "length_words", "relation": "at least", "num": 3},
     "Yes ... -- !!", False),
    ("sentences-decimal-is-not-an-end", {"id": "length_sentences", "relation": "exactly", "num": 2},
     "Pi is 3.14 roughly. Done!", True),
    ("sentences-trailing-fragment-counts", {"id": "length_sentences", "relation": "at most", "num": 1},
     "One sentence. And a fragment", False),
    ("paragraphs-blank-line-with-spaces", {"id": "length_paragraphs", "relation": "exactly", "num": 2},
     "First.\n   \nSecond.\n", True),
    ("paragraphs-single-newline-is-one", {"id": "length_paragraphs", "relation": "at least", "num": 2},
     "Line one.\nLine two.", False),
    ("chars-ignore-outer-whitespace", {"id": "length_chars", "relation": "at most", "num": 5},
     "  hello \n", True),
    ("chars-less-than-is-strict", {"id": "length_chars", "relation": "less than", "num": 5}, "hello", False),
    ("divided-three-paragraphs", {"id": "paragraphs_divided", "num": 3}, "a\n***\nb\n***\nc", True),
    ("divided-empty-paragraph", {"id": "paragraphs_divided", "num": 3}, "a\n***\n***\nc", False),
    ("sentence-max-words-each", {"id": "sentence_max_words", "num": 3}, "Short one. Also short!", True),
    ("sentence-max-words-one-long", {"id": "sentence_max_words", "num": 3},
     "Short. This one is too long.", False),
    ("keyword-case-insensitive", {"id": "keyword_frequency", "keyword": "cat", **AT_LEAST_3},
     "Cat, CAT and cat.", True),
    ("keyword-not-inside-words", {"id": "keyword_frequency", "keyword": "cat", **AT_LEAST_3},
     "cat concatenate category", False),
    ("include-keywords-all", {"id": "include_keywords", "keywords": ["alpha", "beta"]},
     "Beta before ALPHA", True),
    ("include-keywords-substring-no", {"id": "include_keywords", "keywords": ["alpha", "beta"]},
     "alphabet beta", False),
    ("forbidden-only-as-substring", {"id": "forbidden_words", "words": ["bad"]}, "a badge of badness", True),
    ("forbidden-capitalised", {"id": "forbidden_words", "words": ["bad"]}, "That is Bad.", False),
    ("letter-frequency-any-case", {"id": "letter_frequency", "letter": "z", **AT_LEAST_3}, "Zig zag Z", True),
    ("letter-frequency-too-few", {"id": "letter_frequency", "letter": "z", **AT_LEAST_3}, "Zig zag", False),
    ("capital-words-ignore-title-case", {"id": "capital_word_frequency", "relation": "at most", "num": 1},
     "Hello World from NASA", True),
    ("capital-words-too-many", {"id": "capital_word_frequency", "relation": "less than", "num": 2},
     "USA and UK", False),
    ("no-commas-semicolons-ok", {"id": "no_commas"}, "one; two: three", True),
    ("no-commas-fullwidth", {"id": "no_commas"}, "one，two", False),
    ("no-digits-words-ok", {"id": "no_digits"}, "three apples", True),
    ("no-digits-superscript", {"id": "no_digits"}, "x²", False),
    ("lowercase-digits-punctuation-ok", {"id": "all_lowercase"}, "ok, 42 things!", True),
    ("lowercase-one-capital", {"id": "all_lowercase"}, "all lower except I", False),
    ("uppercase-digits-ok", {"id": "all_uppercase"}, "HELLO 2 YOU!", True),
    ("uppercase-no-letters", {"id": "all_uppercase"}, "123 !!", False),
    ("json-fenced", {"id": "json_format"}, '```json\n{"a": [1, 2]}\n```', True),
    ("json-trailing-prose", {"id": "json_format"}, '{"a": 1} hope this helps', False),
    ("bullets-star-and-dash", {"id": "bullet_count", "num": 2}, "Intro\n* one\n  - two\n", True),
    ("bullets-bold-is-not-bullet", {"id": "bullet_count", "num": 2}, "* one\n**bold** text\n", False),
    ("sections-custom-splitter", {"id": "section_count", "num": 2, "splitter": "SECTION"},
     "SECTION 1\nhi\nSECTION 2\nbye", True),
    ("sections-need-number", {"id": "section_count", "num": 2, "splitter": "SECTION"},
     "SECTION 1\nhi\nSECTION two", False),
    ("title-anywhere", {"id": "title"}, "Here: <<My Poem>>\nroses", True),
    ("title-empty-brackets", {"id": "title"}, "<<>> no title", False),
    ("placeholders-two", {"id": "placeholders", "num": 2}, "Dear [name], at [address]", True),
    ("placeholders-empty-not-counted", {"id": "placeholders", "num": 2}, "Dear [name], at []", False),
    ("postscript-spaced-lowercase", {"id": "postscript"}, "Body.\n\np. s. see you", True),
    ("postscript-not-at-line-start", {"id": "postscript"}, "Body. Also P.S. inline", False),
    ("quotes-around-whitespace", {"id": "quotation_wrap"}, '  "wrapped answer"\n', True),
    ("quotes-single-char", {"id": "quotation_wrap"}, '"', False),
    ("highlight-bold-counts", {"id": "highlighted_sections", "num": 2}, "*one* and **two**", True),
    ("highlight-blank-not-counted", {"id": "highlighted_sections", "num": 2}, "*one* and * *", False),
    ("two-responses", {"id": "two_responses"}, "Answer A\n******\nAnswer B", True),
    ("two-responses-identical", {"id": "two_responses"}, "Same\n******\nSame", False),
    ("nth-first-word-punctuation", {"id": "nth_paragraph_first_word", "num_paragraphs": 2, "nth": 2,
                                    "first_word": "then"}, "First.\n\n\"Then,\" he said.", True),
    ("nth-first-word-wrong-count", {"id": "nth_paragraph_first_word", "num_paragraphs": 3, "nth": 2,
                                    "first_word": "then"}, "First.\n\nThen more.", False),
    ("starts-with-case-space", {"id": "starts_with", "phrase": "My answer"}, "  my ANSWER is yes", True),
    ("starts-with-late", {"id": "starts_with", "phrase": "My answer"}, "So, my answer is yes", False),
    ("ends-with-trailing-space", {"id": "ends_with", "phrase": "Any questions?"},
     "Done. Any questions?  \n", True),
    ("ends-with-extra-punct", {"id": "ends_with", "phrase": "Any questions?"}, "Any questions?!", False),
    ("repeat-prompt", {"id": "repeat_prompt", "prompt_to_repeat": "Write a haiku."},
     "Write a haiku. Leaves fall", True),
    ("repeat-prompt-paraphrase", {"id": "repeat_prompt", "prompt_to_repeat": "Write a haiku."},
     "You asked for a haiku.", False),
    ("choose-from-inside", {"id": "choose_from", "options": ["My answer is yes.", "My answer is no."]},
     "Thinking... My answer is no.", True),
    ("choose-from-case-matters", {"id": "choose_from", "options": ["My answer is yes."]},
     "my answer is yes.", False),
]

# Where a naive rule and IFEval's reference (punkt sentences, the end checker's quote stripping,
# the title checker's blank check) disagree: these follow the reference.
EXACTLY_2_SENTENCES = {"id": "length_sentences", "relation": "exactly", "num": 2}
REFERENCE_CASES = [
    ("sentences-closing-quote", EXACTLY_2_SENTENCES, 'He said "stop." Then he left.', True),
    ("sentences-closing-curly-quote", EXACTLY_2_SENTENCES, "He shouted “stop!” Then he ran.", True),
    ("sentences-closing-single-quote", EXACTLY_2_SENTENCES, "She asked 'why?' Then she left.", True),
    ("sentences-title-abbreviation", EXACTLY_2_SENTENCES, "Dr. Smith came. He sat.", True),
    ("sentences-initials", EXACTLY_2_SENTENCES, "J. R. R. Tolkien wrote it. It sold.", True),
    ("sentences-acronym", EXACTLY_2_SENTENCES, "The U.S. is big. Really big.", True),
    ("sentences-ellipsis-lowercase-continues", EXACTLY_2_SENTENCES, "Wait... what? Yes!", True),
    ("sentences-inside-whole-quotes", EXACTLY_2_SENTENCES, '"First one. Second one."', True),
    ("sentences-three-not-two", EXACTLY_2_SENTENCES, "Hello!!! How are you?? Fine.", False),
    ("sentences-abbreviation-not-a-split", {"id": "length_sentences", "relation": "at least", "num": 3},
     "Mr. and Mrs. Smith left at 5 p.m. today. Then rain.", False),
    ("sentence-max-words-abbreviation", {"id": "sentence_max_words", "num": 3}, "Dr. Who came. He sat.", True),
    ("ends-with-inside-quotes", {"id": "ends_with", "phrase": "Is there anything else I can help with?"},
     '"Here it is. Is there anything else I can help with?"', True),
    ("ends-with-inside-curly-quotes", {"id": "ends_with", "phrase": "the end."}, "“Story... The end.”", True),
    ("ends-with-text-after-quotes", {"id": "ends_with", "phrase": "the end."}, '"The end." Bye', False),
    ("title-blank", {"id": "title"}, "<< >> a poem without a title", False),
    ("title-tab-and-space", {"id": "title"}, "<<\t >>\nroses", False),
    ("title-blank-then-real", {"id": "title"}, "<< >> then <<Real Title>>", True),
]


def test_quoted_answer_can_also_end_with_the_phrase() -> None:
    """Two constraints that used to contradict each other: wrap in quotes + end with a phrase."""
    verifier = ConstraintsVerifier.from_specs([{"id": "quotation_wrap"}, {"id": "ends_with", "phrase": "Goodbye."}])
    verdict = verifier(Problem("p", None), '"All done. Goodbye."')
    assert (verdict.score, verdict.passed) == (1.0, True), verdict.reason



@pytest.mark.parametrize(("spec", "response", "passes"),
                         [pytest.param(*c[1:], id=c[0]) for c in [*CASES, *REFERENCE_CASES]])
def test_checker_case(spec: dict, response: str, passes: bool) -> None:
    passed, why = load_constraint(spec).check(response)
    assert passed is passes, why
    assert why


def test_every_checker_has_an_accept_and_a_reject_case() -> None:
    outcomes = {(c[1]["id"], c[3]) for c in CASES}
    assert len(CHECKERS) >= 25
    assert {(cid, ok) for cid in CHECKERS for ok in (True, False)} == outcomes


def test_counts_report_what_they_saw() -> None:
    passed, why = load_constraint({"id": "length_words", "relation": "at most", "num": 2}).check("a b c")
    assert (passed, why) == (False, "3 words (at most 2 required)")


def test_score_is_fraction_satisfied_with_per_constraint_evidence() -> None:
    specs = [{"id": "all_lowercase"}, {"id": "no_commas"}, {"id": "title"},
             {"id": "length_words", "relation": "at least", "num": 2}]
    verdict = ConstraintsVerifier()(Problem("p", specs), "hello, world")
    # lowercase yes, commas no, title no, >=2 words yes -> 2/4
    assert (verdict.score, verdict.passed) == (0.5, False)
    assert [c["passed"] for c in verdict.details["constraints"]] == [True, False, False, True]
    assert verdict.details["constraints"][1]["why"] == "1 commas"
    assert verdict.reason == "2/4 constraints satisfied; failed: ['no_commas', 'title']"


def test_specs_from_meta_or_fixed() -> None:
    problem = Problem("p", answer=None, meta={"constraints": [{"id": "no_digits"}]})
    assert ConstraintsVerifier()(problem, "no numbers").score == 1.0
    fixed = ConstraintsVerifier.from_specs([{"id": "all_uppercase"}])
    assert fixed(Problem("p", None), "SHOUT").passed


def test_defaults_are_filled_in() -> None:
    assert load_constraint({"id": "bullet_count", "num": 1}).params == {"num": 1, "relation": "exactly"}


BAD_SPECS = [
    ("unknown-id", {"id": "lenght_words"},
     r"unknown constraint id 'lenght_words'; allowed: \['all_lowercase'"),
    ("missing-id", {"relation": "at least"}, "expected an object with an 'id' key"),
    ("unknown-param", {"id": "no_commas", "strict": True},
     r"'no_commas': unknown params \['strict'\]; params: none"),
    ("missing-param", {"id": "length_words", "num": 3},
     r"missing params \['relation'\]; params: relation: str, num: int"),
    ("bad-relation", {"id": "length_words", "relation": ">=", "num": 3}, "must be one of \\['at least'"),
    ("negative-num", {"id": "length_words", "relation": "at least", "num": -1},
     "'num' must be an integer >= 0"),
    ("bool-num", {"id": "bullet_count", "num": True}, "'num' must be an integer >= 0"),
    ("string-num", {"id": "bullet_count", "num": "3"}, "'num' must be an integer >= 0"),
    ("two-letters", {"id": "letter_frequency", "letter": "ab", **AT_LEAST_3},
     "'letter' must be a single letter"),
    ("keywords-not-list", {"id": "forbidden_words", "words": "bad"}, "must be a non-empty list of strings"),
    ("nth-zero", {"id": "nth_paragraph_first_word", "num_paragraphs": 2, "nth": 0, "first_word": "a"},
     "'nth' must be an integer >= 1"),
]


@pytest.mark.parametrize(("spec", "message"), [pytest.param(*c[1:], id=c[0]) for c in BAD_SPECS])
def test_bad_spec_is_a_clear_error(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_constraint(spec)


def test_bad_list_names_the_index() -> None:
    with pytest.raises(ValueError, match="constraint #1 'title': unknown params"):
        load_constraints([{"id": "no_commas"}, {"id": "title", "x": 1}])
    with pytest.raises(ValueError, match="empty"):
        load_constraints([])
    with pytest.raises(ValueError, match="must be a list"):
        load_constraints({"id": "title"})
    with pytest.raises(ValueError, match="unknown constraint id"):
        ConstraintsVerifier()(Problem("p", [{"id": "nope"}]), "text")


def test_params_come_from_signatures() -> None:
    assert [p.describe() for p in checker_params("section_count")] == [
        "num: int", "relation: str = 'at least'", "splitter: str = 'Section'"]


def test_cli_prints_one_json_verdict(tmp_path: Path) -> None:
    specs = tmp_path / "specs.json"
    # "hi, there": has a comma (fail), 2 words <= 9 (pass) -> 1/2
    specs.write_text(json.dumps([{"id": "no_commas"},
                                 {"id": "length_words", "relation": "at most", "num": 9}]))
    args = ["constraints", "--response", "hi, there", "--constraints", str(specs)]
    result = CliRunner().invoke(verify_app, args)
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert (verdict["score"], verdict["details"]["satisfied"]) == (0.5, 1)


@pytest.mark.parametrize(("content", "message"), [
    pytest.param("[{'id': 'no_commas'}]", "Expecting property name", id="not-json"),
    pytest.param('[{"id": "bogus"}]', "constraint #0: unknown constraint id 'bogus'", id="unknown-id"),
    pytest.param(None, "No such file", id="missing-file"),
])
def test_cli_bad_constraints_file(tmp_path: Path, content: str | None, message: str) -> None:
    specs = tmp_path / "specs.json"
    if content is not None:
        specs.write_text(content)
    result = CliRunner().invoke(verify_app, ["constraints", "--response", "x", "--constraints", str(specs)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "bad constraints file" in result.stderr and message in result.stderr
