"""Continuous batching is exact: 12 requests (mixed prompt and reply lengths, greedy and seeded sampling, arriving
while others run) through a LocalModel with parallel lanes give, token for token, the replies each gets alone; for a
plain model, the Gemma 4 pair (target + assistant drafter file) and the Qwen 3.5 pair (in-trunk MTP head, hybrid
recurrent state). Then the lanes' prompt caches, cancellation freeing a lane, and the memory check per slot."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from synth import Tiny, write_tiny
from synth_gemma4 import write_gemma4, write_gemma4_assistant

from cuca import LocalModel, LocalModelConfig
from cuca.engine import Generation
from cuca.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35  # noqa: E402

N_REQUESTS = 12


def requests(n_vocab: int, longest: int) -> list[tuple[list[int], dict[str, Any]]]:
    """Prompts of 2..`longest` tokens (the longest spans a prefill chunk boundary where the context allows),
    replies of 3..36 tokens, every third request sampled with a seed."""
    out = []
    for i in range(N_REQUESTS):
        n = [2, 5, 9, 17, 33, 70, longest, 3, 12, 140, 6, 24][i]
        prompt = [2] + [(31 * i + 7 * j * j + j) % (n_vocab - 10) + 5 for j in range(n - 1)]
        kw = {"max_tokens": [3, 20, 7, 36, 12, 5, 9, 28, 16, 4, 30, 11][i], "temperature": 0.0}
        if i % 3 == 2:
            kw.update(temperature=0.9, top_k=40, seed=100 + i)
        out.append((prompt, kw))
    return out


def run_batched(model: LocalModel, reqs: list[tuple[list[int], dict[str, Any]]]) -> list[Generation]:
    """Every request on its own thread; request i is submitted once request i - 1 has produced its first piece
    (every fourth one without waiting), so requests join while others prefill, decode and leave."""
    gens = [Generation() for _ in reqs]
    started = [threading.Event() for _ in reqs]
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            if i % 4 and i > 0:
                started[i - 1].wait(60)
            s = model.stream_ids_sync(reqs[i][0], gen=gens[i], **reqs[i][1])
            for k, _ in enumerate(s):
                if k == 0:
                    started[i].set()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)
        finally:
            started[i].set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[0]
    return gens


def solo(model: LocalModel, reqs: list[tuple[list[int], dict[str, Any]]]) -> list[list[int]]:
    out = []
    for prompt, kw in reqs:
        gen = Generation()
        for _ in model.stream_ids_sync(prompt, gen=gen, **kw):
            pass
        out.append(gen.tokens)
    return out


@pytest.fixture(scope="module", params=["plain", "gemma4", "qwen35"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], int]:
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "plain":
        return {"source": write_tiny(d / "t.gguf", arch="gemma3", shape=Tiny(untied=True)),
                "context_length": 256}, 200
    if request.param == "gemma4":
        return {"source": write_gemma4(d / "t.gguf"), "drafter": str(write_gemma4_assistant(d / "a.gguf")),
                "draft_tokens": 3, "context_length": 512}, 300
    return {"source": synth_qwen35.write(d / "q.gguf"), "drafter": "in-trunk", "draft_tokens": 4,
            "context_length": 512}, 300


def test_batched_replies_equal_solo(case: tuple[dict[str, Any], int]) -> None:
    cfg, longest = case
    alone = LocalModel.load_sync(LocalModelConfig(threads=2, **cfg))
    batched = LocalModel.load_sync(LocalModelConfig(threads=2, parallel=4, **cfg))
    reqs = requests(int(alone.model.n_vocab), longest)
    want = solo(alone, reqs)
    gens = run_batched(batched, reqs)
    assert [g.tokens for g in gens] == want
    pairs = list(zip(reqs, gens, strict=True))
    assert all(len(g.tokens) == kw["max_tokens"] or g.finish_reason == "stop" for (_, kw), g in pairs)
    clock = batched.scheduler.clock  # type: ignore[union-attr]
    assert clock.passes < sum(len(w) for w in want)  # passes were shared
    if "drafter" in cfg:
        drafted = [g.draft for g in gens if g.draft is not None]
        assert len(drafted) == N_REQUESTS and sum(s.rounds for s in drafted) > 0
    # follow-ups extending each exchange, concurrently (the lanes' prompt caches keep what they can): still exact
    follow = [(p + g.tokens + [5, 6, 7], {"max_tokens": 6, "temperature": 0.0}) for (p, _), g in pairs]
    assert [g.tokens for g in run_batched(batched, follow)] == solo(alone, follow)
    # a conversation's next turn goes to the lane that holds the previous one, and keeps its rows
    first = batched.complete_sync(reqs[4][0], max_tokens=5)
    second = batched.complete_sync(reqs[4][0] + first.tokens + [5, 6], max_tokens=5)
    assert second.timings.n_cached > 0 and second.tokens == solo(alone, [(reqs[4][0] + first.tokens + [5, 6],
                                                                          {"max_tokens": 5})])[0]


def test_cancelling_frees_a_lane(tmp_path: Path) -> None:
    """Two lanes, both busy with long replies: closing one stream lets a third request run while the other lane
    is still decoding."""
    p = write_tiny(tmp_path / "t.gguf", arch="gemma3", shape=Tiny(untied=True))
    m = LocalModel.load_sync(LocalModelConfig(p, threads=2, context_length=256, parallel=2))
    long_gen = Generation()
    a = m.stream_ids_sync([2, 5, 6], max_tokens=240)
    b = m.stream_ids_sync([2, 8, 9], max_tokens=240, gen=long_gen)
    next(a), next(b)
    a.close()
    reply = m.complete_sync([2, 11], max_tokens=2)
    assert len(reply.tokens) == 2 and long_gen.finish_reason is None  # b still runs on the other lane
    b.close()
    m.close()


def test_memory_check_counts_every_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuca import local as local_mod

    p = write_tiny(tmp_path / "t.gguf", arch="gemma3")
    one = LocalModel.load_sync(LocalModelConfig(p, threads=1, context_length=256)).engine.cache.nbytes
    monkeypatch.setattr(local_mod, "available_memory", lambda: 3 * one + 1)
    assert LocalModel.load_sync(LocalModelConfig(p, threads=1, context_length=256, parallel=3)).config.parallel == 3
    with pytest.raises(ConfigError, match=rf"needs {4 * one:,} bytes .* for 4 parallel slots.* or parallel"):
        LocalModel.load_sync(LocalModelConfig(p, threads=1, context_length=256, parallel=4))
    with pytest.raises(ConfigError, match="parallel must be an integer"):
        LocalModelConfig(p, parallel=0).validate()


def test_server_runs_parallel_slots_then_queues(tmp_path: Path) -> None:
    """`cuca serve --parallel 2 --max-queue 0`: two streams run at once, a third request gets 429."""
    import asyncio

    import httpx
    from serving import serving

    tiny = write_tiny(tmp_path / "tiny.gguf", arch="gemma3")
    # long replies, so that the two streams still hold their slots when the third request lands however loaded the
    # machine is (200 tokens of the tiny model could end first: a flaky 200 for the third)
    with serving(tiny, "--parallel", "2", "--max-queue", "0", "--context-length", "4096", "--allow-long-context") as u:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4000, "temperature": 0, "stream": True}

        async def three() -> tuple[int, int, int]:
            async with httpx.AsyncClient(base_url=u, timeout=60) as c:
                async with c.stream("POST", "/v1/completions", json=body) as a, \
                        c.stream("POST", "/v1/completions", json=body) as b:
                    third = await c.post("/v1/completions", json={**body, "stream": False})
                    return a.status_code, b.status_code, third.status_code

        assert asyncio.run(three()) == (200, 200, 429)


def test_batch_governor_decides_per_pass_on_the_batch() -> None:
    """Every lane of a pass gets the pass's round length (capped by its room; a seeded request keeps its full
    length); each pass's cost is recorded once, in the governor of its batch-size class; acceptance per lane."""
    from cuca.speculative.batch_governor import BatchGovernor, PassClock, size_class

    assert [size_class(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [0, 1, 2, 2, 3, 3, 4, 4]
    clock = PassClock(active=4)
    shared = BatchGovernor(clock, draft_tokens=3)
    lanes = [shared.view() for _ in range(4)]
    for _ in range(40):
        depths = [g.decide(3 if i else 1) for i, g in enumerate(lanes)]
        assert depths[1] == depths[2] == depths[3] and depths[0] == min(depths[1], 1)
        assert lanes[3].decide(2, force=True) == 2
        for g, d in zip(lanes, depths, strict=True):
            g.record(d, d, 0.0)  # every draft accepted
        clock.passes += 1
        clock.period = 0.010 if depths[1] == 0 else 0.012  # drafting costs 20% more per pass, emits up to 4x
    g4 = shared.classes[size_class(4)]
    assert set(shared.classes) == {size_class(4)} and g4.rounds == 39  # one cost per pass (the last still open)
    assert g4.drafting and shared.drafting
    clock.active = 16
    assert lanes[0].decide(3) == 0 and size_class(16) in shared.classes  # a new class measures plain first
