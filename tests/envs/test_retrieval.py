"""The BM25 search tool: ranking on a small corpus, no-match and hostile queries."""

from __future__ import annotations

import pytest

pytest.importorskip("bm25s")

from feedbackrl.envs.retrieval import Bm25Search  # noqa: E402
from feedbackrl.envs.tools import Toolbox, ToolCall  # noqa: E402

CORPUS = ["the cat sat on the mat", "dogs chase cats in the park", "paris is the capital of france",
          "the capital of italy is rome"]


def test_ranking_and_format() -> None:
    search = Bm25Search(CORPUS, k=2)
    hits = search.search("capital of france")
    assert [i for i, _ in hits] == [2, 3] and hits[0][1] > hits[1][1] > 0
    assert search("capital of france") == "1: paris is the capital of france; 2: the capital of italy is rome"
    assert search("who chase dogs") == "1: dogs chase cats in the park"  # only documents that share a term


@pytest.mark.parametrize("query", ["", "the of is", "zzz qqq", "!!!", "x" * 100_000],
                         ids=["empty", "stopwords", "unknown", "punctuation", "huge"])
def test_queries_without_a_match(query: str) -> None:
    assert Bm25Search(CORPUS)(query) == "no match"


def test_long_documents_are_cut_and_the_tool_never_raises_through_a_toolbox() -> None:
    search = Bm25Search(["rome " + "a" * 1000], max_chars=20)
    assert search("rome") == "1: rome aaaaaaaaaaaaaaa"
    assert Toolbox({"search": search}).call(ToolCall("search", "rome")).ok
    with pytest.raises(ValueError, match="at least one document"):
        Bm25Search([])
