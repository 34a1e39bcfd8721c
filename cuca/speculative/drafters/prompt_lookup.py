"""Prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence of the history's last
n-gram (longest n first). No drafter model; pays on code edits, lists and text that quotes its prompt."""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...sampling import SamplingParams, is_int
from ..proposal import Proposal

MAX_NGRAM = 32  # the index holds (max_ngram - min_ngram + 1) n-grams per position: keep it small


class PromptLookupDrafter:
    """Keeps the history (prompt + committed tokens) and, for every n-gram (n = min_ngram..max_ngram) of it, the
    position right after its latest occurrence; the index grows incrementally as tokens are committed, so a round
    costs O(max_ngram)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not (is_int(min_ngram) and is_int(max_ngram) and 1 <= min_ngram <= max_ngram <= MAX_NGRAM):
            raise ConfigError(f"prompt lookup needs integers 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}, got "
                              f"{min_ngram!r}, {max_ngram!r}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.history: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._seen = 0  # history length indexed so far

    def for_cache(self, cache: object) -> PromptLookupDrafter:
        """Another instance for another target cache (a batcher's lane): it keeps only the history."""
        return PromptLookupDrafter(self.max_ngram, self.min_ngram)

    def begin(
        self, prompt: list[int], params: SamplingParams | None = None, rng: np.random.Generator | None = None
    ) -> None:
        self.history = list(prompt[:1])  # commits bring the tokens that follow each row, from position 1 on
        self._index.clear()
        self._seen = 0

    def resume(self, prompt: list[int], keep: int, params: SamplingParams | None = None,
               rng: np.random.Generator | None = None) -> int:
        """Begin on `prompt` whose first `keep` rows the target kept (prompt cache): the history holds no state
        beyond the tokens, so every kept row is fine."""
        self.begin(prompt)
        self.history = list(prompt[: keep + 1])
        return keep

    def commit(self, tokens: list[int], positions: np.ndarray, hidden: np.ndarray | None = None) -> None:
        if len(positions) and int(positions[0]) + 1 != len(self.history):
            raise ValueError(f"commit at position {int(positions[0])} does not continue the {len(self.history)} "
                             f"tokens held")
        self.history += tokens

    def _extend(self) -> None:
        # index n-grams that end before the last token, so a lookup never matches the suffix itself
        history = self.history
        for end in range(max(self._seen, 1), len(history)):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    self._index[tuple(history[end - n : end])] = end
        self._seen = max(self._seen, len(history))

    def propose(self, n: int) -> Proposal:
        self._extend()
        history = self.history
        for k in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(history) < k:
                continue
            start = self._index.get(tuple(history[-k:]))
            if start is not None:
                # copy what followed the match; past the end of the history keep copying with the same period
                # (LZ77-style overlap), so a repeating pattern yields full-length proposals
                out: list[int] = []
                for i in range(n):
                    j = start + i
                    out.append(history[j] if j < len(history) else out[j - len(history)])
                return Proposal(out, None)
        return Proposal([], None)
