"""Speculative decoding: a drafter proposes tokens, the target verifies them in one pass, and a governor drafts
only while that is faster than plain decoding, at the round length it measures to be fastest. `SpeculativeDecoder`
(decoder.py) runs the rounds."""

from .decoder import SpeculativeDecoder, round_size
from .governor import AlwaysDraft, Governor, GovernorEvent, SpeedGovernor
from .proposal import Proposal
from .stats import DraftStats, RequestDraftStats
from .verify import Verdict, residual, verify, verify_greedy

__all__ = [
    "AlwaysDraft", "DraftStats", "Governor", "GovernorEvent", "Proposal", "RequestDraftStats", "SpeculativeDecoder",
    "SpeedGovernor", "Verdict", "residual", "round_size", "verify", "verify_greedy",
]
