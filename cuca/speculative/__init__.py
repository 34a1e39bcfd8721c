"""Speculative decoding: a drafter proposes tokens, the target verifies them in one pass, and a governor drafts
only while that is faster than plain decoding."""

from .governor import Governor
from .proposal import Proposal
from .stats import DraftStats, RequestDraftStats
from .verify import Verdict, residual, verify, verify_greedy

__all__ = ["DraftStats", "Governor", "Proposal", "RequestDraftStats", "Verdict", "residual", "verify", "verify_greedy"]
