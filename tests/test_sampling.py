"""The sampling pipeline on hand-computed distributions."""

from __future__ import annotations

import numpy as np
import pytest

from cuca.errors import ConfigError
from cuca.sampling import TOP_CHUNK, SamplingParams, greedy_token, next_token, sample, to_probs, top_ids

LOGITS = np.log(np.array([0.1, 0.4, 0.2, 0.3], dtype=np.float64)).astype(np.float32)


def test_greedy_is_one_hot_argmax_lowest_on_ties() -> None:
    p = to_probs(LOGITS, SamplingParams())
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert greedy_token(np.array([1.0, 3.0, 3.0], np.float32)) == 1


def test_temperature_one_recovers_softmax() -> None:
    p = to_probs(LOGITS, SamplingParams(temperature=1.0))
    assert p == pytest.approx([0.1, 0.4, 0.2, 0.3], abs=1e-6)


def test_temperature_two_flattens() -> None:
    p = to_probs(LOGITS, SamplingParams(temperature=2.0))
    q = np.sqrt([0.1, 0.4, 0.2, 0.3])
    assert p == pytest.approx(q / q.sum(), abs=1e-6)


def test_top_k_then_top_p() -> None:
    p = to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert p == pytest.approx([0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7], abs=1e-6)
    # top_p 0.5: the smallest prefix by probability reaching 0.5 is {0.4, 0.3}
    p = to_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.5))
    assert p == pytest.approx([0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7], abs=1e-6)
    p = to_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.39))
    assert p == pytest.approx([0.0, 1.0, 0.0, 0.0], abs=1e-6)
    # order matters: top_k 3 drops 0.1, then top_p 0.6 over {0.4/.9, 0.3/.9, 0.2/.9} keeps two
    p = to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=3, top_p=0.6))
    assert p == pytest.approx([0.0, 4 / 7, 0.0, 3 / 7], abs=1e-6)


def test_inverse_cdf_sample() -> None:
    p = np.array([0.1, 0.4, 0.2, 0.3])
    assert [sample(p, u) for u in (0.0, 0.09, 0.1, 0.49, 0.5, 0.69, 0.7, 0.999)] == [0, 0, 1, 1, 2, 2, 3, 3]
    # zero-mass entries are never drawn
    p = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert {sample(p, u) for u in np.linspace(0, 0.9999, 101)} == {1, 3}


def test_empirical_distribution_and_seed_reproducibility() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    rng = np.random.default_rng(params.seed)
    draws = np.array([next_token(LOGITS, params, rng) for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    assert freq == pytest.approx([0.1, 0.4, 0.2, 0.3], abs=0.015)
    rng2 = np.random.default_rng(params.seed)
    again = np.array([next_token(LOGITS, params, rng2) for _ in range(200)])
    assert np.array_equal(draws[:200], again)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -3}, "seed"),
    ],
)
def test_invalid_params_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**kw)


@pytest.mark.parametrize("n", [16 * TOP_CHUNK, 248320 // 1024 * 1024, 1000, 8])
def test_top_ids_are_the_k_largest(n: int) -> None:
    """top_ids (the drafters' candidates) equals a full selection: through the chunk maxima on large rows, where
    every k largest value sits in one of the k chunks of largest maxima (a row's top values in one chunk too)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((4, n)).astype(np.float32)
    if n >= 16 * TOP_CHUNK:
        x[1, 5 * TOP_CHUNK : 5 * TOP_CHUNK + 8] += 10.0  # all eight in one chunk
        x[2, -1] = x[2, 0] = 50.0  # the ends
    k = min(8, n)
    want = np.sort(np.argsort(-x, axis=1, kind="stable")[:, :k], axis=1)
    got = top_ids(x, k)
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_top_ids_edges() -> None:
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert top_ids(x, 0).shape == (2, 0)
    assert np.array_equal(top_ids(x, 9), np.tile(np.arange(6, dtype=np.int32), (2, 1)))
    assert np.array_equal(top_ids(x, 2), [[4, 5], [4, 5]])
