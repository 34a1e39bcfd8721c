"""The governor's schedule, rule by rule, on synthetic rounds with known rates (no model, no real clock)."""

from __future__ import annotations

import pytest

from cuca.speculative.governor import ALPHA, PROBE_FIRST, PROBE_MAX, REFRESH_EVERY, MovingAverage, SpeedGovernor
from cuca.speculative.stats import RequestDraftStats

PLAIN_TPS = 2.0  # a plain round: 1 token in 0.5 s


def step(gov: SpeedGovernor, spec_tps: float, plain_tps: float = PLAIN_TPS, force: bool = False) -> bool:
    """One round at the given rates: a speculative round emits 3 tokens."""
    drafting = gov.decide(force)
    if drafting:
        gov.record(True, 3, 3 / spec_tps)
    else:
        gov.record(False, 1, 1 / plain_tps)
    return drafting


def run(gov: SpeedGovernor, n: int, spec_tps: float, plain_tps: float = PLAIN_TPS, force: bool = False) -> list[bool]:
    return [step(gov, spec_tps, plain_tps, force) for _ in range(n)]


def kinds(gov: SpeedGovernor, kind: str) -> list[int]:
    return [i for k, i in gov.events if k == kind]


def test_moving_average_is_a_mean_at_first_then_exponential() -> None:
    avg = MovingAverage(ALPHA)
    assert avg.value is None
    avg.add(4.0)
    assert avg.value == 4.0
    for _ in range(100):
        avg.add(4.0)
    assert avg.value == 4.0  # a constant series stays exact
    avg.add(14.0)
    assert avg.value == pytest.approx(4.0 + ALPHA * 10.0, rel=1e-4)
    avg.restart()
    avg.add(1.0)
    avg.add(3.0)
    assert avg.value == pytest.approx((0.9 * 1.0 + 3.0) / 1.9)  # bias-corrected: a weighted mean of the two


def test_measures_plain_first_then_speculation() -> None:
    gov = SpeedGovernor()
    assert gov.plain.value is None and gov.spec.value is None
    assert run(gov, 2, spec_tps=3.0) == [False, False]
    assert gov.plain.value == PLAIN_TPS and gov.spec.value is None
    assert run(gov, 2, spec_tps=3.0) == [True, True]
    assert gov.spec.value == 3.0
    assert gov.events == [("spec_on", 4)]


def test_drafts_from_1_02_times_plain() -> None:
    # 51 tokens in 25 s is 2.04 tok/s, exactly 1.02 x 2.0 in floating point too
    for seconds, on in [(25.0, True), (25.001, False)]:
        gov = SpeedGovernor()
        for drafted in [False, False, True, True]:
            gov.record(drafted, 51 if drafted else 1, seconds if drafted else 0.5)
        assert gov.drafting is on
        assert gov.events == [("spec_on" if on else "spec_off", 4)]


def test_turns_off_when_plain_is_faster() -> None:
    gov = SpeedGovernor()
    run(gov, 4 + 20, spec_tps=3.0)
    assert gov.drafting
    decisions = run(gov, 30, spec_tps=1.0)
    off = decisions.index(False)
    # the average crosses 2.04 tok/s after a few slow rounds, and drafting stops at the next round
    assert 2 <= off <= 10 and not any(decisions[off:])
    assert kinds(gov, "spec_off") == [24 + off]


def test_reprobes_after_32_plain_rounds() -> None:
    gov = SpeedGovernor()
    run(gov, 4, spec_tps=1.0)
    assert gov.events == [("spec_off", 4)]
    assert run(gov, PROBE_FIRST + 2, spec_tps=1.0) == [False] * PROBE_FIRST + [True, True]
    assert kinds(gov, "probe") == [4 + PROBE_FIRST]


def test_failed_probes_double_the_interval_up_to_512() -> None:
    gov = SpeedGovernor()
    run(gov, 4 + 32 + 2 + 64 + 2 + 128 + 2 + 256 + 2 + 512 + 2 + 512 + 2 + 512 + 2, spec_tps=1.0)
    offs, probes = kinds(gov, "spec_off"), kinds(gov, "probe")
    assert len(offs) == len(probes) + 1  # the first measurement, then one outcome per probe
    gaps = [probe - off for off, probe in zip(offs[:-1], probes, strict=True)]
    assert gaps == [32, 64, 128, 256, 512, 512, 512]
    assert [off - probe for probe, off in zip(probes, offs[1:], strict=True)] == [2] * 7  # each probe is two rounds
    assert gov.interval == PROBE_MAX


def test_a_successful_probe_resets_the_interval() -> None:
    gov = SpeedGovernor()
    run(gov, 4 + 32 + 2 + 64 + 2, spec_tps=1.0)
    assert gov.interval == 128
    decisions = run(gov, 128 + 2 + 10, spec_tps=3.0)
    assert decisions[:128] == [False] * 128 and all(decisions[128:])
    assert gov.events[-2:] == [("probe", 4 + 32 + 2 + 64 + 2 + 128), ("spec_on", 4 + 32 + 2 + 64 + 2 + 128 + 2)]
    assert gov.interval == PROBE_FIRST
    while gov.drafting:  # slow again: off, and the next probe comes 32 plain rounds later
        step(gov, spec_tps=1.0)
    assert run(gov, PROBE_FIRST + 2, spec_tps=1.0) == [False] * PROBE_FIRST + [True, True]
    assert kinds(gov, "probe")[-1] - kinds(gov, "spec_off")[-2] == PROBE_FIRST  # [-1]: the probe failed


def test_refreshes_plain_with_two_rounds_every_64() -> None:
    gov = SpeedGovernor()
    run(gov, 4, spec_tps=3.0)
    decisions = run(gov, 2 * (REFRESH_EVERY + 2) + 5, spec_tps=3.0)
    expected = ([True] * REFRESH_EVERY + [False, False]) * 2 + [True] * 5
    assert decisions == expected
    assert kinds(gov, "refresh") == [4 + REFRESH_EVERY, 4 + 2 * REFRESH_EVERY + 2]
    assert kinds(gov, "spec_off") == []


def test_a_refresh_that_finds_plain_faster_turns_drafting_off() -> None:
    gov = SpeedGovernor()
    run(gov, 4 + REFRESH_EVERY, spec_tps=3.0)
    assert run(gov, 3, spec_tps=3.0, plain_tps=4.0) == [False, False, False]
    assert gov.plain.value == 4.0  # the refresh restarted the plain average: two fresh rounds decide
    assert gov.events[-2:] == [("refresh", 4 + REFRESH_EVERY), ("spec_off", 4 + REFRESH_EVERY + 2)]


def test_force_always_drafts_and_leaves_the_schedule_alone() -> None:
    gov = SpeedGovernor()
    assert run(gov, 10, spec_tps=1.0, force=True) == [True] * 10  # even before any plain measurement
    assert gov.spec.value == 1.0 and gov.events == []
    assert run(gov, 4, spec_tps=1.0) == [False, False, True, True]  # the warm-up still runs, in order
    assert not gov.drafting
    assert run(gov, 5, spec_tps=1.0, force=True) == [True] * 5  # plain is faster: forced requests draft anyway
    assert run(gov, PROBE_FIRST, spec_tps=1.0)[-1] is False  # the 5 forced rounds did not count towards the probe
    assert gov.drafting  # probe due now


def test_force_during_a_refresh() -> None:
    gov = SpeedGovernor()
    run(gov, 4 + REFRESH_EVERY, spec_tps=3.0)
    assert not gov.drafting  # a refresh is due
    assert run(gov, 3, spec_tps=3.0, force=True) == [True] * 3
    assert run(gov, 3, spec_tps=3.0) == [False, False, True]


def test_plain_rounds_without_room_to_draft_are_measurements_only() -> None:
    gov = SpeedGovernor()
    run(gov, 4 + 10, spec_tps=3.0)
    for _ in range(100):  # rounds near max_tokens run plain without asking
        gov.record(False, 1, 0.5)
    assert run(gov, REFRESH_EVERY - 10 + 2, spec_tps=3.0)[-3:] == [True, False, False]


def test_state_is_kept_across_requests() -> None:
    gov = SpeedGovernor()
    first = RequestDraftStats()
    mark = gov.event_count
    run(gov, 40, spec_tps=1.0)  # request 1: warm-up, off, then plain rounds
    first.governor_events += gov.events_since(mark)
    assert first.governor_events == [("spec_off", 4), ("probe", 36), ("spec_off", 38)]
    second = RequestDraftStats()
    mark = gov.event_count
    decisions = run(gov, 70, spec_tps=3.0)  # request 2: no new warm-up; the interval is still 64
    assert decisions[:62] == [False] * 62 and decisions[62:64] == [True, True]
    second.governor_events += gov.events_since(mark)
    assert second.governor_events == [("probe", 102), ("spec_on", 104)]
    assert gov.rounds == 110


def test_begin_and_end_round_use_the_injected_clock() -> None:
    now = [100.0]
    gov = SpeedGovernor(clock=lambda: now[0])
    for drafting, seconds, tokens in [(False, 0.5, 1), (False, 0.25, 1), (True, 1.0, 5), (True, 1.0, 5)]:
        gov.begin_round(drafting)
        now[0] += seconds
        gov.end_round(tokens)
    assert gov.plain.value == pytest.approx((0.9 * 2.0 + 4.0) / 1.9)
    assert gov.spec.value == 5.0
    assert gov.drafting
    with pytest.raises(RuntimeError):
        gov.end_round(1)


def test_the_event_log_is_bounded() -> None:
    gov = SpeedGovernor()
    run(gov, 4, spec_tps=1.0)
    mark = gov.event_count
    run(gov, 20_000, spec_tps=1.0)
    assert gov.events_since(mark) == gov.events[-(gov.event_count - mark) :]
    assert gov.events_since(gov.event_count) == []
