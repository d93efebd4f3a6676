"""Checkers for verifiable instructions, after IFEval (Zhou et al. 2023, arXiv:2311.07911) and IFBench.

Each checker takes the response and keyword-only parameters and returns (passed, why): `why`
says what was counted, so a person can see why a constraint failed. Only language-free checks are
here (no language detection). The registry and spec validation live in `instructions.py`.

Where we depart from IFEval (reference: google-research/instruction_following_eval,
instructions.py and instructions_util.py), on purpose:
- Paragraphs are separated by blank lines (IFEval's `***` divider is the separate
  `paragraphs_divided` check).
- Words are runs of letters/digits with inner apostrophes or hyphens, not NLTK tokens, so
  punctuation never counts as a word.
- Sentences come from `sentencex` (Wikimedia's rule-based splitter), not NLTK's punkt: punkt
  needs a data download at run time, which a training job cannot rely on. sentencex handles what
  a naive "[.!?] then space" rule gets wrong: a closing quote or bracket after the full stop
  (`He said "stop." Then he left.` is 2), abbreviations and titles (`Dr. Smith came. He sat.` is
  2), initials (`J. R. R. Tolkien`) and decimals. Quotation marks around the whole response are
  removed first, so a quoted answer counts its inner sentences, as punkt does. Like punkt, an
  ellipsis followed by a lowercase word (`Wait... what?`) does not end a sentence.
- Every count takes a relation, not only the one IFEval used.
- `ends_with` strips surrounding whitespace and quotation marks (`"`, curly quotes) from the
  response, as IFEval's end checker strips `"`: a quoted answer can also end with the phrase.
- `title` needs a non-blank title inside `<< >>` (IFEval: `<<[^\n]+>>` with the brackets and
  whitespace stripped must leave text); we also exclude `<` and `>` inside, so `<<a>> <<b>>` is
  two titles rather than one spanning both.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable

from sentencex import segment

Result = tuple[bool, str]

RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "at least": operator.ge,
    "at most": operator.le,
    "exactly": operator.eq,
    "less than": operator.lt,
    "more than": operator.gt,
}

_WORD = re.compile(r"\w+(?:['’-]\w+)*")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_BULLET = re.compile(r"^\s*[*-]\s+\S", re.MULTILINE)
_TITLE = re.compile(r"<<([^\n<>]+)>>")
_PLACEHOLDER = re.compile(r"\[[^\[\]\n]+\]")
_HIGHLIGHT = re.compile(r"\*([^\n*]+)\*")
_JSON_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL | re.IGNORECASE)


def _count(count: int, relation: str, num: int, what: str) -> Result:
    return RELATIONS[relation](count, num), f"{count} {what} ({relation} {num} required)"


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


_QUOTES = "\"“”"


def _sentences(text: str) -> list[str]:
    """Sentences with at least one word (sentencex, see the module docstring), outer quotes removed."""
    return [s for s in segment("en", text.strip().strip(_QUOTES)) if _words(s)]


def _paragraphs(text: str) -> list[str]:
    return [p for p in _PARAGRAPH_BREAK.split(text.strip()) if p.strip()]


# --- length ---------------------------------------------------------------------------------------


def length_words(response: str, *, relation: str, num: int) -> Result:
    """Number of words."""
    return _count(len(_words(response)), relation, num, "words")


def length_sentences(response: str, *, relation: str, num: int) -> Result:
    """Number of sentences (a trailing fragment counts as one)."""
    return _count(len(_sentences(response)), relation, num, "sentences")


def length_paragraphs(response: str, *, relation: str, num: int) -> Result:
    """Number of paragraphs separated by blank lines."""
    return _count(len(_paragraphs(response)), relation, num, "paragraphs")


def length_chars(response: str, *, relation: str, num: int) -> Result:
    """Number of characters, surrounding whitespace excluded."""
    return _count(len(response.strip()), relation, num, "characters")


def paragraphs_divided(response: str, *, num: int, relation: str = "exactly") -> Result:
    """Paragraphs separated by a `***` line (IFEval's number_paragraphs); none may be empty."""
    parts = [p.strip() for p in re.split(r"\s*\*\*\*\s*", response.strip())]
    if "" in parts and len(parts) > 1:
        return False, f"empty paragraph around a *** divider ({len(parts)} parts)"
    return _count(len(parts) if parts != [""] else 0, relation, num, "***-separated paragraphs")


def sentence_max_words(response: str, *, num: int) -> Result:
    """Every sentence has at most `num` words."""
    lengths = [len(_words(s)) for s in _sentences(response)]
    longest = max(lengths, default=0)
    return longest <= num, f"longest sentence has {longest} words (at most {num} allowed)"


# --- keywords and letters -------------------------------------------------------------------------


def _occurrences(response: str, word: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(word)}(?!\w)", response, re.IGNORECASE))


def keyword_frequency(response: str, *, keyword: str, relation: str, num: int) -> Result:
    """How often `keyword` appears as a whole word, ignoring case."""
    return _count(_occurrences(response, keyword), relation, num, f"occurrences of {keyword!r}")


def include_keywords(response: str, *, keywords: list[str]) -> Result:
    """Every keyword appears as a whole word, ignoring case."""
    missing = [k for k in keywords if not _occurrences(response, k)]
    return not missing, f"missing {missing}" if missing else f"all of {keywords} present"


def forbidden_words(response: str, *, words: list[str]) -> Result:
    """None of `words` appears as a whole word, ignoring case."""
    found = [w for w in words if _occurrences(response, w)]
    return not found, f"used forbidden {found}" if found else "no forbidden word used"


def letter_frequency(response: str, *, letter: str, relation: str, num: int) -> Result:
    """How often `letter` appears, ignoring case."""
    return _count(response.lower().count(letter.lower()), relation, num, f"letter {letter!r}")


def capital_word_frequency(response: str, *, relation: str, num: int) -> Result:
    """Number of words written in capitals (IFEval: `word.isupper()`)."""
    return _count(sum(w.isupper() for w in _words(response)), relation, num, "all-capital words")


def no_commas(response: str) -> Result:
    """No comma anywhere (the full-width and Arabic commas count too)."""
    commas = sum(response.count(c) for c in ",，،")
    return commas == 0, f"{commas} commas"


def no_digits(response: str) -> Result:
    """No digit anywhere."""
    digits = sum(c.isdigit() for c in response)
    return digits == 0, f"{digits} digits"


# --- case -----------------------------------------------------------------------------------------


def _case_reason(ok: bool, wrong_case: int, wrong_name: str) -> str:
    return f"{wrong_case} {wrong_name} letters" if wrong_case else ("ok" if ok else "no letters")


def all_lowercase(response: str) -> Result:
    """Letters present and all lowercase."""
    ok = response.islower()
    return ok, _case_reason(ok, sum(c.isupper() for c in response), "uppercase")


def all_uppercase(response: str) -> Result:
    """Letters present and all uppercase."""
    ok = response.isupper()
    return ok, _case_reason(ok, sum(c.islower() for c in response), "lowercase")


# --- structure ------------------------------------------------------------------------------------


def json_format(response: str) -> Result:
    """The whole response is one JSON value (a ```json fence around it is allowed)."""
    text = response.strip()
    fenced = _JSON_FENCE.match(text)
    try:
        json.loads(fenced.group(1) if fenced else text)
    except ValueError as e:
        return False, f"not JSON: {e}"
    return True, "valid JSON"


def bullet_count(response: str, *, num: int, relation: str = "exactly") -> Result:
    """Markdown bullet lines starting with `* ` or `- `."""
    return _count(len(_BULLET.findall(response)), relation, num, "bullet points")


def section_count(response: str, *, num: int, relation: str = "at least",
                  splitter: str = "Section") -> Result:
    """Sections opened by `<splitter> <number>` (e.g. "SECTION 1"), matched case-sensitively."""
    headers = re.findall(rf"(?<!\w){re.escape(splitter)}\s*\d+", response)
    return _count(len(headers), relation, num, f"'{splitter} N' sections")


def title(response: str) -> Result:
    """A non-blank title wrapped in double angular brackets, like <<poem of joy>>."""
    found = next((t for t in _TITLE.findall(response) if t.strip()), None)
    return found is not None, f"title <<{found}>>" if found is not None else "no <<title>>"


def placeholders(response: str, *, num: int, relation: str = "at least") -> Result:
    """Square-bracket placeholders such as [address]."""
    return _count(len(_PLACEHOLDER.findall(response)), relation, num, "[placeholders]")


def highlighted_sections(response: str, *, num: int, relation: str = "at least") -> Result:
    """Markdown-highlighted spans such as *key point* (or **key point**)."""
    spans = [s for s in _HIGHLIGHT.findall(response) if s.strip()]
    return _count(len(spans), relation, num, "*highlighted* sections")


def postscript(response: str, *, marker: str = "P.S.") -> Result:
    """A line starting with `marker` (P.S., P.P.S); spaces after its dots are allowed."""
    pattern = r"\.\s?".join(re.escape(part) for part in marker.split("."))
    found = re.search(rf"^\s*{pattern}", response, re.MULTILINE | re.IGNORECASE)
    return bool(found), f"found {marker}" if found else f"no line starting with {marker}"


def quotation_wrap(response: str) -> Result:
    """The whole response is wrapped in double quotes."""
    text = response.strip()
    ok = len(text) > 1 and text[0] == '"' and text[-1] == '"'
    return ok, "wrapped in double quotes" if ok else "not wrapped in double quotes"


def two_responses(response: str) -> Result:
    """Exactly two different, non-empty responses separated by six asterisks (******)."""
    parts = [p.strip() for p in response.split("******")]
    if len(parts) != 2 or not all(parts):
        return False, f"{len(parts)} parts around ****** (2 non-empty needed)"
    differ = parts[0] != parts[1]
    return differ, "two different responses" if differ else "the two responses are identical"


def nth_paragraph_first_word(response: str, *, num_paragraphs: int, nth: int, first_word: str) -> Result:
    """`num_paragraphs` paragraphs (blank-line separated) and the `nth` (1-based) starts with `first_word`."""
    paragraphs = _paragraphs(response)
    if len(paragraphs) != num_paragraphs or not 1 <= nth <= len(paragraphs):
        return False, f"{len(paragraphs)} paragraphs ({num_paragraphs} required)"
    words = _words(paragraphs[nth - 1])
    word = words[0].lower() if words else ""
    return word == first_word.lower(), f"paragraph {nth} starts with {word!r} ({first_word!r} required)"


# --- start, end, whole ----------------------------------------------------------------------------


def starts_with(response: str, *, phrase: str) -> Result:
    """Starts with `phrase`, ignoring case and surrounding whitespace."""
    ok = response.strip().lower().startswith(phrase.strip().lower())
    return ok, f"starts with {response.strip()[:len(phrase) + 10]!r}"


def ends_with(response: str, *, phrase: str) -> Result:
    """Ends with `phrase` (IFEval end_checker), ignoring case, surrounding whitespace and quotation marks."""
    text = response.strip().strip(_QUOTES).strip()
    ok = text.lower().endswith(phrase.strip().lower())
    return ok, f"ends with {text[-len(phrase) - 10:]!r}"


def repeat_prompt(response: str, *, prompt_to_repeat: str) -> Result:
    """Begins by repeating the request word for word (ignoring case), then answers it."""
    return starts_with(response, phrase=prompt_to_repeat)


def choose_from(response: str, *, options: list[str]) -> Result:
    """Contains one of the allowed answers (IFEval constrained_response: "My answer is yes.")."""
    found = [o for o in options if o in response]
    return bool(found), f"contains {found[0]!r}" if found else f"none of {options}"
