"""A search tool over a local corpus, ranked by BM25 (the `bm25s` library, `agents` extra).

`Bm25Search(documents)` indexes the documents once (English stopwords removed, no stemming);
calling it with a query returns the top `k` documents with a positive score as
``1: TEXT; 2: TEXT`` (each cut to `max_chars`), or ``no match`` when no query term occurs in the
corpus. Queries are cut to `max_query_chars` before tokenizing, so a policy cannot stall a turn
with a huge query.
"""

from __future__ import annotations

from collections.abc import Sequence


class Bm25Search:
    """BM25 retrieval as a tool: query text -> the best documents' text."""

    def __init__(self, documents: Sequence[str], k: int = 2, max_chars: int = 200, max_query_chars: int = 200):
        try:
            import bm25s
        except ImportError as e:
            raise ImportError("the search tool needs bm25s: pip install 'feedbackrl[agents]'") from e
        if not documents:
            raise ValueError("Bm25Search needs at least one document")
        self._bm25s, self.documents = bm25s, list(documents)
        self.k, self.max_chars, self.max_query_chars = min(k, len(self.documents)), max_chars, max_query_chars
        self.retriever = bm25s.BM25()
        self.retriever.index(self._tokens(self.documents), show_progress=False)

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return self._bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def search(self, query: str) -> list[tuple[int, float]]:
        """(document index, score) of the top-k documents with a positive score, best first."""
        tokens = self._tokens([query[: self.max_query_chars]])
        if not tokens[0]:
            return []
        ids, scores = self.retriever.retrieve(tokens, k=self.k, show_progress=False)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]

    def __call__(self, query: str) -> str:
        hits = self.search(query)
        if not hits:
            return "no match"
        return "; ".join(f"{n}: {self.documents[i][: self.max_chars]}" for n, (i, _) in enumerate(hits, 1))
