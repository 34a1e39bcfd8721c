"""`GET /metrics`: Prometheus text through prometheus_client, in a registry of the server's own (no globals)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine import Generation

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Counters of the requests served; `queue_depth` and `drafting` are read at scrape time."""

    def __init__(self, queue_depth: Callable[[], float], drafting: Callable[[], float]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("cuca_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("cuca_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.prefilled_tokens = Counter("cuca_prefilled_tokens", "Prompt rows run through the model (the rest came "
                                        "from the prompt cache)", registry=r)
        self.completion_tokens = Counter("cuca_completion_tokens", "Generated tokens", registry=r)
        self.tokens_per_second = Gauge("cuca_tokens_per_second", "Decode speed of the last finished request",
                                       registry=r)
        self.ttft = Histogram("cuca_time_to_first_token_seconds", "Seconds from arrival to the first token",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.rounds = Counter("cuca_draft_rounds", "Speculative rounds that drafted", registry=r)
        self.drafted = Counter("cuca_draft_drafted_tokens", "Drafted tokens", registry=r)
        self.accepted = Counter("cuca_draft_accepted_tokens", "Accepted drafted tokens", registry=r)
        self.drafted_at = Counter("cuca_draft_drafted_at_position", "Rounds that drafted a token at this position",
                                  ["position"], registry=r)
        self.accepted_at = Counter("cuca_draft_accepted_at_position", "Rounds that accepted the draft at this "
                                   "position", ["position"], registry=r)
        self.governor_events = Counter("cuca_governor_events", "Governor decisions, by kind", ["kind"], registry=r)
        Gauge("cuca_queue_depth", "Requests waiting for the model", registry=r).set_function(queue_depth)
        Gauge("cuca_governor_drafting", "1 while the governor has drafting on, 0 while off", registry=r) \
            .set_function(drafting)

    def finished(self, gen: Generation) -> None:
        t, d = gen.timings, gen.draft
        self.prompt_tokens.inc(t.n_prompt)
        self.prefilled_tokens.inc(t.n_prefilled)
        self.completion_tokens.inc(len(gen.tokens))
        if t.decode_s > 0:
            self.tokens_per_second.set(t.tokens_per_second)
        if d is None:
            return
        self.rounds.inc(d.rounds)
        self.drafted.inc(d.drafted)
        self.accepted.inc(d.accepted)
        for counter, counts in ((self.drafted_at, d.drafted_per_position), (self.accepted_at,
                                                                              d.accepted_per_position)):
            for i, n in enumerate(counts):
                counter.labels(position=str(i)).inc(n)
        for kind, *_ in d.governor_events:
            self.governor_events.labels(kind=kind).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
