"""DraftStats (summed over requests) and RequestDraftStats (one request)."""

from __future__ import annotations

import json

import pytest

from cuca.speculative import DraftStats, RequestDraftStats
from cuca.speculative.governor import GovernorEvent


def test_acceptance_rate_is_none_before_the_first_round() -> None:
    assert DraftStats().acceptance_rate() is None
    assert DraftStats(rounds=2, drafted=0, accepted=0).acceptance_rate() is None
    assert DraftStats(rounds=2, drafted=6, accepted=3).acceptance_rate() == 0.5


def test_request_stats_count_positions_and_tokens_per_round() -> None:
    req = RequestDraftStats()
    assert req.acceptance_rate() is None and req.tokens_per_round() is None
    req.record_round(3, 3)
    req.record_round(3, 1)
    req.record_round(2, 0)
    assert (req.rounds, req.drafted, req.accepted) == (3, 8, 4)
    assert req.accepted_per_position == [2, 1, 1]
    assert req.drafted_per_position == [3, 3, 2]
    assert req.acceptance_rate() == 0.5
    assert req.tokens_per_round() == pytest.approx((4 + 3) / 3)
    with pytest.raises(ValueError):
        req.record_round(2, 3)


def test_model_totals_add_requests() -> None:
    total = DraftStats()
    for accepted in (1, 2):
        req = RequestDraftStats()
        req.record_round(3, accepted)
        total.add(req)
    total.add(DraftStats(1, 3, 3))
    assert total == DraftStats(3, 9, 6)


def test_to_dict_is_json() -> None:
    req = RequestDraftStats()
    req.record_round(2, 1)
    req.record_depth(2)
    req.record_depth(0)
    req.governor_events.append(GovernorEvent("spec_on", 4, 2))
    d = json.loads(json.dumps(req.to_dict()))
    assert d == {
        "rounds": 1,
        "drafted": 2,
        "accepted": 1,
        "acceptance_rate": 0.5,
        "tokens_per_round": 2.0,
        "accepted_per_position": [1, 0],
        "drafted_per_position": [1, 1],
        "rounds_per_depth": [1, 0, 1],
        "governor_events": [["spec_on", 4, 2]],
    }
