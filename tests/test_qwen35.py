"""qwen35: the hybrid trunk against transformers' Qwen 3.5 (golden fixture on the same random weights), the MTP
head against a float64 reference written from the spec, chunked vs per-token DeltaNet, bit-exact rollback through
snapshots, greedy speculative decoding with the in-trunk drafter equal to plain decoding, and the error cases."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35 as S  # noqa: E402
from helpers import GREEDY, Scripted  # noqa: E402

from cuca.engine import Engine, Generation  # noqa: E402
from cuca.errors import ConfigError, GGUFError, ProviderError  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.kernels import implementations  # noqa: E402
from cuca.models import layers, load_model  # noqa: E402
from cuca.models.deltanet_state import L2_EPS, gdn_chunked  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402
from cuca.quants import Q4_0  # noqa: E402
from cuca.sampling import SamplingParams, to_probs  # noqa: E402
from cuca.speculative import AlwaysDraft, SpeculativeDecoder  # noqa: E402
from cuca.speculative.drafters import mtp as mtp_mod  # noqa: E402
from cuca.speculative.drafters.mtp import MTPDrafter  # noqa: E402
from cuca.tokenizer import Tokenizer  # noqa: E402

GOLDEN = Path(__file__).parent / "fixtures" / "qwen35_golden.npz"


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return S.write(tmp_path_factory.mktemp("q") / "qwen35-tiny.gguf", S.TINY, seed=0)


@pytest.fixture(scope="module")
def model(path: Path):
    return load_model(open_gguf(path), Ops(1))


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model with an MTP head that repeats its input token (eh_proj passes the embedding half through,
    the block adds nothing): on the tiny model's repetitive greedy output, some drafts are accepted, some not."""
    s, t = S.TINY, S.weights(S.TINY, 0)
    p = f"blk.{s.n_layer}."
    t[p + "nextn.eh_proj.weight"] = np.concatenate([np.eye(s.n_embd), np.zeros((s.n_embd, s.n_embd))], 1)
    t[p + "attn_output.weight"] = np.zeros_like(t[p + "attn_output.weight"])
    t[p + "ffn_down.weight"] = np.zeros_like(t[p + "ffn_down.weight"])
    path = S.write(tmp_path_factory.mktemp("q") / "qwen35-copy.gguf", s, edits=S.Edits(tensors=t))
    return load_model(open_gguf(path), Ops(1))


def _pos(a: int, b: int) -> np.ndarray:
    return np.arange(a, b, dtype=np.int32)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float((np.abs(got - want).max(axis=-1) / np.abs(want).max(axis=-1)).max())


# ---------------------------------------------------------------------------------------------- trunk and head
def test_layout_and_tokenizer(path: Path, model) -> None:
    f = open_gguf(path)
    assert f.architecture == "qwen35" and f.get("qwen35.block_count") == S.TINY.n_layer + 1
    assert "blk.0.ssm_a" in f.tensors and "blk.8.nextn.eh_proj.weight" in f.tensors
    assert model.c.recurrent == (True, True, True, False) * 2 and model.make_cache(8).max_rollback == 16
    assert model.mtp is not None
    tok = Tokenizer.from_gguf(f)
    assert tok.decode(tok.encode("the cat sat")) == "the cat sat"


def test_trunk_matches_transformers(model, golden) -> None:
    assert S.checksum(S.weights(S.TINY, 0)) == str(golden["checksum"]), "the writer no longer builds the golden model"
    prompt, decode = golden["prompt"], golden["decode"]
    n = len(prompt)
    cache = model.make_cache(128)
    hs = [model.forward_hidden(prompt, _pos(0, n), cache)]
    for i, t in enumerate(decode):
        assert int(np.argmax(model.head(hs[-1][-1:]))) == int(t)  # greedy continuation is transformers' too
        hs.append(model.forward_hidden(np.array([t], np.int32), _pos(n + i, n + i + 1), cache))
    h = np.concatenate(hs)
    logits = model.head(h)
    assert _rel(logits, golden["logits"]) < 1e-4
    assert _rel(h, golden["hidden"]) < 1e-4
    # llama.cpp on the same file (tools/make_qwen35_llamacpp_fixture.py): its own kernels, so a looser bound
    llama = np.load(GOLDEN.with_name("qwen35_llamacpp.npz"))["logits"]
    assert _rel(logits, llama) < 1e-3
    assert np.array_equal(logits.argmax(1), llama.argmax(1))


def test_mtp_matches_reference(model, golden) -> None:
    prompt, first = golden["prompt"], int(golden["decode"][0])
    n = len(prompt)
    cache = model.make_cache(128)
    hid = model.forward_hidden(prompt, _pos(0, n), cache)
    nxt = np.array([*prompt[1:], first], np.int32)
    h = model.mtp_forward(nxt, hid, _pos(0, n), model.make_mtp_cache(128))
    assert _rel(model.mtp_logits(h, model.n_vocab), golden["mtp_logits"][:n]) < 1e-4
    # chained drafts through the drafter: same tokens, from the first DRAFT_VOCAB_TINY ids only
    d = MTPDrafter(model, 128, draft_vocab=S.DRAFT_VOCAB_TINY)
    d.begin(list(prompt), GREEDY, np.random.default_rng(0))
    d.commit(list(nxt), _pos(0, n), hid)
    chain = golden["chain"]
    prop = d.propose(len(chain))
    assert prop.tokens == chain.tolist() and prop.q_draft is None
    # the chained head outputs themselves
    mc = model.make_mtp_cache(128)
    hh = model.mtp_forward(nxt, hid, _pos(0, n), mc)[-1:]
    for i, t in enumerate(chain):
        hh = model.mtp_forward(np.array([t], np.int32), hh, _pos(n + i, n + i + 1), mc)
        assert _rel(model.mtp_logits(hh, model.n_vocab), golden["mtp_logits"][n + i : n + i + 1]) < 1e-4


def test_mtp_last_only_is_the_full_pass_bit_for_bit(model) -> None:
    """The drafter's catch-up pass (`last_only`: earlier rows write only their K/V) leaves the same K/V and gives
    the same last row as the full pass, at any start position and row count."""
    rng = np.random.default_rng(11)
    for p0, m in ((0, 1), (0, 7), (3, 2), (5, 30)):
        hid = rng.standard_normal((m, model.c.n_embd)).astype(np.float32)
        toks = rng.integers(0, model.n_vocab, m).astype(np.int32)
        caches = [model.make_mtp_cache(64) for _ in range(2)]
        for c in caches:  # the same earlier rows in both
            if p0:
                model.mtp_forward(toks[:1].repeat(p0), hid[:1].repeat(p0, 0), _pos(0, p0), c)
        full = model.mtp_forward(toks, hid, _pos(p0, p0 + m), caches[0])
        last = model.mtp_forward(toks, hid, _pos(p0, p0 + m), caches[1], last_only=True)
        assert last.shape == (1, model.c.n_embd) and np.array_equal(last, full[-1:])
        assert caches[0].n == caches[1].n == p0 + m
        for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v, strict=True):
            assert np.array_equal(a[:, : p0 + m], b[:, : p0 + m])


def test_long_prefill_is_the_token_by_token_run(model) -> None:
    """On the CPU no batch takes the chunked form (Ops.deltanet_chunk_min is None): a 150-token prefill in one pass
    leaves the very states, and gives the very last row, of 150 one-token passes."""
    assert model.ops.deltanet_chunk_min is None and model.chunked_prefill_min is None
    toks = np.random.default_rng(7).integers(0, 320, 150).astype(np.int32)
    one = model.make_cache(256)
    h_one = model.forward_hidden(toks, _pos(0, 150), one)
    step = model.make_cache(256)
    for i in range(150):
        h_step = model.forward_hidden(toks[i : i + 1], _pos(i, i + 1), step)
    assert np.array_equal(h_one[-1:], h_step)
    for a, b in zip(one.states(), step.states(), strict=True):
        assert np.array_equal(a, b)


def test_chunked_prefill_matches_per_token(model) -> None:
    toks = np.random.default_rng(5).integers(0, 320, 150).astype(np.int32)
    per = model.make_cache(256)
    want = model.forward(toks, _pos(0, 150), per, "all")
    model.chunked_prefill_min = 20
    try:
        ch = model.make_cache(256)
        got = model.forward(toks, _pos(0, 150), ch, "all")  # 150 tokens: two full chunks of 64 and a partial one
    finally:
        del model.chunked_prefill_min
    assert _rel(got, want) < 1e-5
    for a, b in zip(ch.states(), per.states(), strict=True):
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    # the kernel-level form, several chunk sizes against the token-by-token kernel
    rng = np.random.default_rng(6)
    T, H, d = 37, 3, 16
    q, k = (rng.standard_normal((T, H, d), dtype=np.float32) for _ in range(2))
    v = rng.standard_normal((T, H, 8), dtype=np.float32)
    g = -rng.uniform(0.0, 1.0, (T, H)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, H)).astype(np.float32)
    s0 = rng.standard_normal((H, d, 8), dtype=np.float32)
    ref_s, ref_o = s0.copy(), np.empty((T, H, 8), np.float32)
    model.ops.k.deltanet(q, k, v, g, beta, ref_s, None, ref_o, L2_EPS, 0.25)
    for chunk in (1, 5, 16, 64):
        s, o = s0.copy(), np.empty_like(ref_o)
        gdn_chunked((q, k, v), (g, beta), s, o, 0.25, chunk)
        assert np.abs(o - ref_o).max() < 1e-5 and np.abs(s - ref_s).max() < 1e-5


def _state(cache) -> list[np.ndarray]:
    n = cache.n
    kv = [a[:, :n] for a in cache.kv.k + cache.kv.v]
    return [*cache.states(), *cache.conv, *kv]


@pytest.mark.parametrize("n_acc", [0, 1, 3, 5])
def test_rollback_restores_snapshot_bit_for_bit(model, n_acc: int) -> None:
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 320, 20).astype(np.int32)
    batch = rng.integers(0, 320, 6).astype(np.int32)  # fed token + 5 drafts
    nxt = np.array([77], np.int32)
    a = model.make_cache(64)
    model.forward(prompt, _pos(0, 20), a)
    verify = model.forward(batch, _pos(20, 26), a, "all")
    a.trim(5 - n_acc)
    after_a = model.forward(nxt, _pos(21 + n_acc, 22 + n_acc), a, "all")
    b = model.make_cache(64)
    model.forward(prompt, _pos(0, 20), b)
    rows = [model.forward(batch[i : i + 1], _pos(20 + i, 21 + i), b, "all") for i in range(n_acc + 1)]
    assert np.array_equal(np.concatenate(rows), verify[: n_acc + 1])  # verify rows == decode rows
    after_b = model.forward(nxt, _pos(21 + n_acc, 22 + n_acc), b, "all")
    assert np.array_equal(after_a, after_b)
    assert all(np.array_equal(x, y) for x, y in zip(_state(a), _state(b), strict=True))


def test_rollback_limits(model) -> None:
    c = model.make_cache(64)
    model.forward(np.arange(18, dtype=np.int32), _pos(0, 18), c)  # 18 > 16 + 1 tokens: no snapshots
    c.trim(0)
    with pytest.raises(ValueError):
        c.trim(1)
    model.forward(np.arange(17, dtype=np.int32), _pos(18, 35), c)  # 16 drafts + 1: the deepest rollback
    c.trim(16)
    assert c.n == 19
    with pytest.raises(ValueError):
        c.trim(1)  # the batch's first token is never rolled back
    with pytest.raises(ValueError):
        model.forward(np.arange(2, dtype=np.int32), _pos(25, 27), c)  # positions must continue the cache
    c.reset()
    assert c.n == 0 and not any(s.any() for s in c.ssm)


def _plain(model, prompt: list[int], n: int, n_ctx: int = 128):
    eng = Engine(model, n_ctx)
    return list(eng.stream(prompt, n, GREEDY, frozenset(), Generation())), eng


def _spec(model, prompt: list[int], n: int, drafter, k: int, n_ctx: int = 128):
    eng = Engine(model, n_ctx)
    s = SpeculativeDecoder(eng.model, eng.cache, drafter, AlwaysDraft(), k)
    return list(eng.stream(prompt, n, GREEDY, frozenset(), Generation(), s)), eng, s.stats


PROMPTS = [[5, 40, 41, 42, 43, 40, 41, 42], [300, 5, 17, 260, 99, 1, 150, 7, 7, 7, 9]]


_PLAIN: dict[tuple[int, int], tuple[list[int], Engine]] = {}


@pytest.mark.parametrize(("which", "k"), [("copy", k) for k in range(1, 17)] + [("random", k) for k in (1, 4, 16)])
def test_mtp_speculative_greedy_equals_plain(request, which: str, k: int) -> None:
    """Every draft length up to the rollback limit with the copying head (some drafts accepted, some rejected);
    the random head (never accepted) for a few lengths."""
    model = request.getfixturevalue("copy_model" if which == "copy" else "model")
    accepted = drafted = 0
    for prompt in PROMPTS:
        key = (id(model), len(prompt))
        if key not in _PLAIN:
            _PLAIN[key] = _plain(model, prompt, 40)
        want, peng = _PLAIN[key]
        d = MTPDrafter(model, 128, draft_vocab=S.DRAFT_VOCAB_TINY)
        got, seng, st = _spec(model, prompt, 40, d, k)
        assert got == want
        accepted, drafted = accepted + st.accepted, drafted + st.drafted
        assert all(np.array_equal(x, y) for x, y in zip(_state(peng.cache), _state(seng.cache), strict=True))
        assert st.rounds > 0 and 0 <= st.accepted <= st.drafted <= st.rounds * min(k, 16)
        # the head's own cache holds exactly what one pass over the committed rows writes
        n = seng.cache.n
        seq = [*prompt, *got]
        hid = Engine(model, 128)
        h = hid.model.forward_hidden(np.array(seq[:n], np.int32), _pos(0, n), hid.cache)
        ref = model.make_mtp_cache(128)
        model.mtp_forward(np.array(seq[1 : n + 1], np.int32), h, _pos(0, n), ref)
        d.flush()  # committed rows wait for the next draft; bring the head level now
        assert d.cache.n == n
        assert np.array_equal(d.cache.k[0][:, :n], ref.k[0][:, :n])
        assert np.array_equal(d.cache.v[0][:, :n], ref.v[0][:, :n])
    if which == "copy":
        assert 0 < accepted < drafted


@pytest.mark.parametrize("k", [2, 5, 16])
def test_oracle_rounds_roll_back_the_trunk(model, k: int) -> None:
    """Drafts right except at random places: many rollback depths are exercised; output and state equal plain."""
    prompt = PROMPTS[1]
    want, peng = _plain(model, prompt, 60)
    future = list(want[1:])
    wrong = np.random.default_rng(k).random(len(future)) < 0.25
    future = [(t + 1) % 320 if w else t for t, w in zip(future, wrong, strict=True)]
    got, seng, st = _spec(model, prompt, 60, Scripted(future, len(prompt) + 1), k)
    assert got == want and 0 < st.accepted < st.drafted
    assert all(np.array_equal(x, y) for x, y in zip(_state(peng.cache), _state(seng.cache), strict=True))


def test_mtp_sampling_returns_draft_distributions(model) -> None:
    prompt = PROMPTS[0]
    eng = Engine(model, 64)
    hid = model.forward_hidden(np.array(prompt, np.int32), _pos(0, len(prompt)), eng.cache)
    d = MTPDrafter(model, 64, draft_vocab=S.DRAFT_VOCAB_TINY)
    d.begin(prompt, SamplingParams(temperature=0.8, top_k=20), np.random.default_rng(3))
    d.commit([*prompt[1:], 9], _pos(0, len(prompt)), hid)
    p = d.propose(3)
    assert p.q_draft is not None and p.q_draft.shape == (3, model.n_vocab)
    assert not p.q_draft[:, S.DRAFT_VOCAB_TINY :].any() and np.allclose(p.q_draft.sum(1), 1.0)
    assert all(p.q_draft[i, t] > 0 for i, t in enumerate(p.tokens))


def test_coarse_head_drafts_the_heads_own_argmax(model, golden, monkeypatch) -> None:
    """The coarse ranking (a Q4_0 copy of the draft rows; a greedy draft rescores its RESCORE best with the head
    itself) drafts the golden chain of the head; its logits are the copy's; the rescored ids get the head's own
    bits. Off by default below COARSE_MIN_WEIGHTS (the tiny head) and where the backend says so."""
    assert not MTPDrafter(model, 64, draft_vocab=S.DRAFT_VOCAB_TINY).coarse
    monkeypatch.setattr(layers, "COARSE_MIN_WEIGHTS", 0)
    n_rank = S.DRAFT_VOCAB_TINY
    coarse = model.mtp.coarse_rows(n_rank)
    assert coarse is not None and coarse.wtype == Q4_0 and (coarse.n_out, coarse.n_in) == (n_rank, model.c.n_embd)
    assert model.mtp.coarse_rows(n_rank) is coarse  # made once
    h = np.random.default_rng(4).standard_normal((3, model.c.n_embd)).astype(np.float32)
    exact, rough = model.mtp_logits(h, n_rank), model.mtp_logits(h, n_rank, coarse=True)
    assert not np.array_equal(exact, rough) and _rel(rough, exact) < 0.2
    ids = np.array([0, 7, 100, 255], np.int32)
    assert np.array_equal(model.mtp_logits_of(h[1:2], ids), exact[1, ids])
    # where the copy's arg-max is not the head's, the rescored draft is still the head's
    many = np.random.default_rng(6).standard_normal((64, model.c.n_embd)).astype(np.float32)
    best = model.mtp_logits(many, n_rank).argmax(1)
    assert (model.mtp_logits(many, n_rank, coarse=True).argmax(1) != best).sum() >= 3
    greedy = MTPDrafter(model, 64, draft_vocab=n_rank)
    greedy.begin([1], GREEDY, np.random.default_rng(0))
    assert [greedy._draft(many[i : i + 1])[0] for i in range(64)] == best.tolist()
    prompt, first = golden["prompt"], int(golden["decode"][0])
    n = len(prompt)
    hid = model.forward_hidden(prompt, _pos(0, n), model.make_cache(128))
    nxt = np.array([*prompt[1:], first], np.int32)
    rescored = []
    orig = model.mtp_logits_of
    monkeypatch.setattr(model, "mtp_logits_of", lambda hh, ii: rescored.append(ii) or orig(hh, ii))
    d = MTPDrafter(model, 128, draft_vocab=n_rank)
    assert d.coarse and not MTPDrafter(model, 128, draft_vocab=n_rank, coarse=False).coarse
    d.begin(list(prompt), GREEDY, np.random.default_rng(0))
    d.commit(list(nxt), _pos(0, n), hid)
    chain = golden["chain"]
    assert d.propose(len(chain)).tokens == chain.tolist()
    assert len(rescored) == len(chain) and all(len(i) == mtp_mod.RESCORE for i in rescored)

    class NoCoarse(Ops):
        coarse_draft_heads = False

    bare = load_model(open_gguf(model.path), NoCoarse(1))
    assert not MTPDrafter(bare, 64, draft_vocab=n_rank).coarse


@pytest.mark.parametrize("k", [1, 3, 16])
def test_coarse_drafter_greedy_equals_plain(copy_model, monkeypatch, k: int) -> None:
    """Speculation with the coarse drafter: the output and the trunk state equal plain decoding; the drafts are
    the exact drafter's, so are the acceptance counts."""
    monkeypatch.setattr(layers, "COARSE_MIN_WEIGHTS", 0)
    for prompt in PROMPTS:
        want, peng = _plain(copy_model, prompt, 40)
        runs = [_spec(copy_model, prompt, 40, MTPDrafter(copy_model, 128, draft_vocab=S.DRAFT_VOCAB_TINY,
                                                         coarse=c), k) for c in (True, False)]
        (got, seng, st), (_, _, st_exact) = runs
        assert got == want and st.accepted > 0
        assert (st.accepted, st.drafted) == (st_exact.accepted, st_exact.drafted)
        assert all(np.array_equal(x, y) for x, y in zip(_state(peng.cache), _state(seng.cache), strict=True))


def test_coarse_sampled_drafts_come_from_the_coarse_logits(model, monkeypatch) -> None:
    monkeypatch.setattr(layers, "COARSE_MIN_WEIGHTS", 0)
    prompt = PROMPTS[0]
    hid = model.forward_hidden(np.array(prompt, np.int32), _pos(0, len(prompt)), Engine(model, 64).cache)
    params = SamplingParams(temperature=0.8, top_k=20)
    props = []
    for coarse in (True, False):
        d = MTPDrafter(model, 64, draft_vocab=S.DRAFT_VOCAB_TINY, coarse=coarse)
        d.begin(prompt, params, np.random.default_rng(3))
        d.commit([*prompt[1:], 9], _pos(0, len(prompt)), hid)
        props.append(d.propose(1))
    p, exact = props
    h = model.mtp_forward(np.array([*prompt[1:], 9], np.int32), hid, _pos(0, len(prompt)),
                          model.make_mtp_cache(64))[-1:]
    full = np.full(model.n_vocab, -np.inf, np.float32)
    full[: S.DRAFT_VOCAB_TINY] = model.mtp_logits(h, S.DRAFT_VOCAB_TINY, coarse=True)[0]
    assert p.q_draft is not None and exact.q_draft is not None
    assert np.allclose(p.q_draft[0], to_probs(full, params)) and not np.array_equal(p.q_draft, exact.q_draft)


# ---------------------------------------------------------------------------------------------- errors
def test_in_trunk_errors(tmp_path: Path, model) -> None:
    """The drafter checks its head (the device rule is the config's: test_local); a bad draft vocabulary."""
    bare = load_model(open_gguf(S.write(tmp_path / "nohead.gguf", S.TINY, mtp=False)), Ops(1))
    assert bare.mtp is None and bare.c.n_layer == S.TINY.n_layer
    with pytest.raises(ProviderError, match="nohead.gguf has no prediction head"):
        MTPDrafter(bare, 64)
    with pytest.raises(ConfigError, match="draft_vocab"):
        MTPDrafter(model, 64, draft_vocab=0)


def test_file_errors(tmp_path: Path) -> None:
    p = S.write(tmp_path / "a.gguf", S.TINY, edits=S.Edits(drop_keys=("ssm.conv_kernel",)))
    with pytest.raises(GGUFError, match="qwen35.ssm.conv_kernel"):
        load_model(open_gguf(p))
    p = S.write(tmp_path / "b.gguf", S.TINY, edits=S.Edits(skip=("blk.1.ssm_a",)))
    with pytest.raises(ProviderError, match="blk.1.ssm_a"):
        load_model(open_gguf(p))
    p = S.write(tmp_path / "c.gguf", S.TINY, edits=S.Edits(skip=("blk.8.nextn.eh_proj.weight",)))
    with pytest.raises(ProviderError, match="nextn.eh_proj"):
        load_model(open_gguf(p))
    p = S.write(tmp_path / "d.gguf", S.tiny(v_heads=6))  # fewer key heads are fine, a ragged share is not
    with pytest.raises(ProviderError, match="4 key heads and 6 value heads: the value heads must be a multiple"):
        load_model(open_gguf(p))


def test_threads_do_not_change_bits(path: Path, model) -> None:
    two = load_model(open_gguf(path), Ops(2))
    toks = np.arange(3, 9, dtype=np.int32)
    ca, cb = model.make_cache(16), two.make_cache(16)
    assert np.array_equal(model.forward(toks, _pos(0, 6), ca, "all"), two.forward(toks, _pos(0, 6), cb, "all"))
    ca.trim(3)
    cb.trim(3)
    assert all(np.array_equal(x, y) for x, y in zip(_state(ca), _state(cb), strict=True))


def test_numpy_twins_run_the_model(path: Path, model) -> None:
    slow = load_model(open_gguf(path), Ops(1, implementations()["numpy"]))
    toks = np.arange(3, 12, dtype=np.int32)
    a = model.forward(toks, _pos(0, 9), model.make_cache(16), "all")
    b = slow.forward(toks, _pos(0, 9), slow.make_cache(16), "all")
    assert _rel(a, b) < 1e-4


def test_mtp_speculative_sampling_is_seeded(copy_model) -> None:
    """Temperature > 0 through the round loop: q_draft rows feed the acceptance rule; equal seeds, equal tokens."""
    runs = []
    for _ in range(2):
        eng = Engine(copy_model, 128)
        d = MTPDrafter(copy_model, 128, draft_vocab=S.DRAFT_VOCAB_TINY)
        s = SpeculativeDecoder(eng.model, eng.cache, d, AlwaysDraft(), 4)
        params = SamplingParams(temperature=0.7, top_k=40, seed=11)
        runs.append((list(eng.stream(PROMPTS[0], 30, params, frozenset(), Generation(), s)), s.stats))
    (a, sa), (b, sb) = runs
    assert a == b and len(a) == 30 and sa.drafted > 0 and sa == sb
