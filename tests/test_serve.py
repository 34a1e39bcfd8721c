"""`cuca serve` as a real process on 127.0.0.1, with the official `openai` client: chat and completions, streaming
or not, stop sequences, usage, drafting statistics, errors and status codes, the API key, a client that goes away
mid-stream, 16 concurrent clients each equal to the same request alone, the prompt cache over a 3-turn chat, and
RemoteModel equal to LocalModel. SmolLM2-135M (real), greedy, short replies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import real_model_path
from serving import serving
from synth import write_tiny

from cuca import ConfigError, DraftStats, LocalModel, LocalModelConfig, RemoteModel
from cuca.engine import Generation
from cuca.errors import ContextLengthError

KEY = "test-key-123"
NAME = "smol"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def smol() -> Path:
    return real_model_path("smollm2")


@pytest.fixture(scope="module")
def url(smol: Path) -> Iterator[str]:
    with serving(smol, "--api-key", KEY, "--name", NAME, "--drafter", "prompt-lookup") as u:
        yield u


@pytest.fixture(scope="module")
def local(smol: Path) -> LocalModel:
    """The same file in this process, without the prompt cache: every request cold, no drafter."""
    return LocalModel.load_sync(LocalModelConfig(smol, threads=1, prompt_cache=False))


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_models_and_health(client: openai.OpenAI, url: str) -> None:
    assert [m.id for m in client.models.list()] == [NAME]
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_chat_and_completion_equal_local(client: openai.OpenAI, local: LocalModel) -> None:
    r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    want = local.chat_sync(CHAT, max_tokens=12)
    assert r.choices[0].message.content == want.text and r.choices[0].finish_reason == want.finish_reason
    assert r.usage is not None and r.usage.completion_tokens == len(want.tokens)
    assert r.usage.prompt_tokens == want.timings.n_prompt
    extra = r.model_extra or {}
    assert extra["cuca"]["tokens"] == want.tokens
    d, t = extra["cuca"]["draft"], extra["timings"]
    assert t["draft_n"] == d["drafted"] and t["draft_n_accepted"] == d["accepted"] and t["predicted_n"] == 12
    assert sum(d["drafted_per_position"]) == d["drafted"] and "predicted_per_second" in t
    c = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert c.choices[0].text == local.complete_sync("The capital of France is", max_tokens=8).text


def test_streaming_equals_whole_reply(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0)  # type: ignore
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0,  # type: ignore
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert (finish[0].model_extra or {})["cuca"]["tokens"] == (whole.model_extra or {})["cuca"]["tokens"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    pieces = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
    streamed = "".join(c.choices[0].text for c in pieces)
    assert streamed == client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8,
                                                 temperature=0).choices[0].text


def test_stop_sequences(client: openai.OpenAI) -> None:
    full = client.completions.create(model=NAME, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0]
    stop = full.text[4:7]
    assert stop.strip()
    for s in (stop, [stop, "zzz"]):
        r = client.completions.create(model=NAME, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=s)
        assert r.choices[0].text == full.text[: full.text.index(stop)] and r.choices[0].finish_reason == "stop"


def test_errors_and_status_codes(client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=CHAT, temperature=5)  # type: ignore[arg-type]
    assert e.value.status_code == 400 and "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model=NAME, messages=CHAT, n=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=NAME, messages=[{"role": "wizard", "content": "x"}])  # type: ignore
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="word " * 5000, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="x")
    assert e.value.code == "model_not_found"
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx.post(url + "/v1/chat/completions", json={"model": NAME, "messages": CHAT})  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url + "/v1/completions", content=b"x" * (5 << 20), headers=headers)
    assert r.status_code == 413
    r = httpx.post(url + "/v1/completions", json=[1, 2], headers=headers)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.get(url + "/v1/nothing", headers=headers)
    assert r.status_code == 404 and "error" in r.json()


def test_client_gone_mid_stream_frees_the_model(client: openai.OpenAI, url: str) -> None:
    """The abandoned request asks for 2000 tokens (a minute or more here); the next one must not wait for them:
    it gets the client's 60 s timeout at most, and the server counts the abandoned request as 499."""
    body = {"model": NAME, "prompt": "Count: 1, 2, 3,", "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first event arrived: the model is generating; now hang up
    r2 = client.completions.create(model=NAME, prompt="Hello", max_tokens=4, temperature=0)
    assert r2.choices[0].finish_reason in ("length", "stop")
    metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'cuca_requests_total{endpoint="completions",status="499"} 1.0' in metrics
    assert "cuca_draft_drafted_tokens_total" in metrics and "cuca_queue_depth 0.0" in metrics


def test_sixteen_concurrent_clients_equal_alone(client: openai.OpenAI, url: str) -> None:
    prompts = [[{"role": "user", "content": f"Tell me about {w}."}] for w in ("cats", "rain", "bread", "maps")]
    alone = [client.chat.completions.create(model=NAME, messages=p, max_tokens=4,  # type: ignore[arg-type]
                                            temperature=0).choices[0].message.content for p in prompts]

    async def together() -> list[str | None]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120) as c:
            rs = await asyncio.gather(*(c.chat.completions.create(model=NAME, messages=prompts[i % 4],  # type: ignore
                                                                  max_tokens=4, temperature=0) for i in range(16)))
        return [r.choices[0].message.content for r in rs]

    assert asyncio.run(together()) == [alone[i % 4] for i in range(16)]


def test_prompt_cache_three_turns(client: openai.OpenAI, local: LocalModel) -> None:
    history = [{"role": "system", "content": "You are terse."}]
    cached = []
    for msg in ("Hi!", "What is 2+2?", "And 3+3?"):
        history.append({"role": "user", "content": msg})
        r = client.chat.completions.create(model=NAME, messages=history, max_tokens=8, temperature=0)  # type: ignore
        want = local.chat_sync(history, max_tokens=8)  # cold: no prompt cache in this process
        ext = (r.model_extra or {})["cuca"]
        assert ext["tokens"] == want.tokens and r.choices[0].message.content == want.text
        assert ext["prefilled_tokens"] + ext["cached_tokens"] == ext["prompt_tokens"] == want.timings.n_prompt
        cached.append(ext["cached_tokens"])
        history.append({"role": "assistant", "content": want.text})
    assert cached[1] > 0 and cached[2] > cached[1]


def test_remote_model_equals_local(url: str, local: LocalModel) -> None:
    remote = RemoteModel(url + "/v1", NAME, api_key=KEY)
    replies = []
    for prompt in ("The sky is", [1, 504, 3117, 314]):
        r, w = remote.complete_sync(prompt, max_tokens=6), local.complete_sync(prompt, max_tokens=6)
        assert (r.text, r.tokens, r.finish_reason) == (w.text, w.tokens, w.finish_reason)
        replies.append(r)
    w = local.chat_sync(CHAT, max_tokens=6, stop=["\n"])
    r = remote.chat_sync(CHAT, max_tokens=6, stop=["\n"])
    assert (r.text, r.tokens, r.finish_reason, r.timings.n_prompt) == (w.text, w.tokens, w.finish_reason,
                                                                       w.timings.n_prompt)
    replies.append(r)
    g1, g2 = Generation(), Generation()
    assert "".join(remote.stream_chat_sync(CHAT, max_tokens=6, stop=["\n"], gen=g1)) == w.text
    assert g1.tokens == w.tokens and g1.finish_reason == w.finish_reason

    async def run() -> tuple[str, str]:
        a = await remote.chat(CHAT, max_tokens=6, stop=["\n"])
        replies.append(a)
        b = "".join([p async for p in remote.stream("The sky is", max_tokens=6, gen=g2)])
        return a.text, b

    assert asyncio.run(run()) == (w.text, replies[0].text)
    drafts = [r.draft for r in replies] + [g1.draft, g2.draft]
    assert all(d is not None for d in drafts)  # the server drafts (prompt lookup) and says how it went
    want = DraftStats()
    for d in drafts:
        want.add(d)  # type: ignore[arg-type]
    assert remote.draft_stats() == want
    plain = remote.complete_sync("The sky is", max_tokens=6, draft=False)  # cuca serve's extension: no drafting
    assert plain.draft is None and plain.tokens == replies[0].tokens
    with pytest.raises(ContextLengthError):
        remote.complete_sync("word " * 5000, max_tokens=4)
    with pytest.raises(ConfigError):
        remote.complete_sync("x", max_tokens=0)
    with pytest.raises(ConfigError, match="unknown request parameter"):
        remote.stream_sync("x", nonsense=1)
    remote.close()


def test_queue_full_is_429(tmp_path: Path) -> None:
    tiny = write_tiny(tmp_path / "tiny.gguf", arch="gemma3")
    with serving(tiny, "--max-queue", "0") as u:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 200, "temperature": 0, "stream": True}

        async def two() -> int:
            async with httpx.AsyncClient(base_url=u, timeout=60) as c:
                async with c.stream("POST", "/v1/completions", json=body) as first:
                    assert first.status_code == 200  # headers come with the first token: it is running
                    second = await c.post("/v1/completions", json={**body, "stream": False})
                    return second.status_code

        assert asyncio.run(two()) == 429
        assert httpx.post(u + "/v1/completions", json={**body, "max_tokens": 2}).status_code == 200
    from cuca.serve.cli import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


def test_open_bind_without_key_warns(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from cuca.serve.cli import run_serve

    def load(a: argparse.Namespace) -> LocalModel:
        raise ConfigError("stopped before loading")

    for host, key, warned in (("0.0.0.0", None, True), ("0.0.0.0", "k", False), ("127.0.0.1", None, False)):
        a = argparse.Namespace(host=host, port=8080, api_key=key, max_queue=4, name=None, model="m")
        with pytest.raises(ConfigError, match="stopped"):
            run_serve(a, load)
        assert ("without --api-key" in capsys.readouterr().err) == warned
    with pytest.raises(ConfigError, match="--port"):
        run_serve(argparse.Namespace(host="127.0.0.1", port=70000, api_key=None, max_queue=4), load)


def test_remote_reads_llama_server_timings() -> None:
    """A reply shaped as llama-server sends it (its `timings` names; no cuca field) parsed by the openai client's own
    types: draft counts come from draft_n / draft_n_accepted, and a reply without them counts zero."""
    from openai.types.chat import ChatCompletion

    from cuca.remote import _Request

    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 44, "completion_tokens": 9, "total_tokens": 53,
                      "prompt_tokens_details": {"cached_tokens": 40}},
            "timings": {"cache_n": 40, "prompt_n": 4, "prompt_ms": 20.0, "predicted_n": 9, "predicted_ms": 80.0,
                        "predicted_per_second": 112.5, "draft_n": 12, "draft_n_accepted": 7}}
    r = _Request({})
    r.finish(ChatCompletion.model_validate(body), "stop")
    d, t = r.gen.draft, r.gen.timings
    assert d is not None and (d.rounds, d.drafted, d.accepted) == (0, 12, 7)
    assert (t.n_prompt, t.n_generated, t.n_cached, t.prompt_s, t.decode_s) == (44, 9, 40, 0.02, 0.08)
    plain = _Request({})
    del body["timings"]["draft_n"], body["timings"]["draft_n_accepted"]  # type: ignore[attr-defined]
    plain.finish(ChatCompletion.model_validate(body), "stop")
    assert plain.gen.draft is None and plain.reply().finish_reason == "stop"
