"""Drafters propose tokens; the target verifies them. Each returns a Proposal(tokens, q_draft)."""

from __future__ import annotations

from typing import Protocol

from ..proposal import Proposal


class Drafter(Protocol):
    """`begin` sees the prompt of a request; `propose` sees the whole history (prompt + generated)."""

    def begin(self, prompt: list[int]) -> None: ...

    def propose(self, history: list[int], n: int) -> Proposal: ...
