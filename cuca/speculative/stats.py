"""Drafting statistics: DraftStats summed over a model's requests (LocalModel.draft_stats()), and the richer
RequestDraftStats of one request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .governor import GovernorEvent


@dataclass
class DraftStats:
    """Speculative rounds, drafted tokens and accepted drafts, summed over every request."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    def acceptance_rate(self) -> float | None:
        """The accepted fraction of drafted tokens; None before the first round (or while nothing was drafted)."""
        if self.rounds == 0 or self.drafted == 0:
            return None
        return self.accepted / self.drafted

    def add(self, other: DraftStats | RequestDraftStats) -> None:
        """Add another request's (or model's) counts into these."""
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted


@dataclass
class RequestDraftStats:
    """One request's drafting. `accepted_per_position[i]` counts the rounds that accepted the draft at position i
    (`drafted_per_position[i]` the rounds that drafted one there); `rounds_per_depth[k]` counts the rounds the
    governor gave k drafts (k = 0: plain steps); `governor_events` are the governor's decisions taken during the
    request, as (kind, round index, round length), the index counted over the governor's lifetime."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    rounds_per_depth: list[int] = field(default_factory=list)
    governor_events: list[GovernorEvent] = field(default_factory=list)

    def record_round(self, n_drafted: int, n_accepted: int) -> None:
        """One speculative round: n_drafted drafts, of which the first n_accepted were accepted."""
        if not 0 <= n_accepted <= n_drafted:
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
        self.rounds += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        for counts, n in ((self.drafted_per_position, n_drafted), (self.accepted_per_position, n_accepted)):
            if len(counts) < n_drafted:
                counts.extend([0] * (n_drafted - len(counts)))
            for i in range(n):
                counts[i] += 1

    def record_depth(self, depth: int) -> None:
        """One round (plain or speculative) that the governor gave `depth` drafts."""
        if depth < 0:
            raise ValueError(f"need depth >= 0, got {depth}")
        if len(self.rounds_per_depth) <= depth:
            self.rounds_per_depth.extend([0] * (depth + 1 - len(self.rounds_per_depth)))
        self.rounds_per_depth[depth] += 1

    def acceptance_rate(self) -> float | None:
        """The accepted fraction of drafted tokens; None before the first round."""
        return DraftStats(self.rounds, self.drafted, self.accepted).acceptance_rate()

    def tokens_per_round(self) -> float | None:
        """Mean tokens emitted per speculative round: the accepted drafts plus the one token that ends each round."""
        return None if self.rounds == 0 else (self.accepted + self.rounds) / self.rounds

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate(),
            "tokens_per_round": self.tokens_per_round(),
            "accepted_per_position": list(self.accepted_per_position),
            "drafted_per_position": list(self.drafted_per_position),
            "rounds_per_depth": list(self.rounds_per_depth),
            "governor_events": [list(e) for e in self.governor_events],
        }
