"""Prometheus metrics of one server: what the HTTP layer counts, and what the engine reports.

Request, token and latency metrics are recorded by the server as requests pass through. KV
and scheduler figures are not copied anywhere: `EngineStatsCollector` reads `engine.stats()`
at scrape time, so `/metrics` can never disagree with the engine. Each server owns its own
registry, so several servers (or tests) in one process do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hintkv.engine.types import RequestMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_MANAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_TOK_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_BLOCK_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class EngineStatsCollector:
    """Turns one `EngineStats` snapshot into gauges and counters on every scrape."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauges = {
            "hintkv_num_requests_running": ("Requests being prefilled or decoded.", s.num_running),
            "hintkv_num_requests_waiting": ("Requests waiting to be scheduled.", s.num_waiting),
            "hintkv_kv_blocks_total": ("KV blocks in the device pool.", s.kv_blocks_total),
            "hintkv_kv_blocks_in_use": ("KV blocks held by live requests.", s.kv_blocks_in_use),
            "hintkv_kv_blocks_cached": (
                "KV blocks held only by the prefix cache.",
                s.kv_blocks_cached,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "hintkv_prefix_cache_query_tokens": (
                "Prompt tokens looked up in the prefix cache.",
                s.prefix_query_tokens,
            ),
            "hintkv_prefix_cache_hit_tokens": (
                "Prompt tokens found in the prefix cache.",
                s.prefix_hit_tokens,
            ),
            "hintkv_num_preemptions": (
                "Requests preempted for lack of KV blocks.",
                s.num_preemptions,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class TierStatsCollector:
    """KV tier figures (`LLMEngine.tier_stats()`), read at scrape time like the engine stats."""

    def __init__(self, tier_stats: Callable[[], dict]) -> None:
        self._stats = tier_stats

    def collect(self) -> Iterator[Metric]:
        t = self._stats()
        hits = CounterMetricFamily("hintkv_prefix_cache_hit_tokens_by_tier",
                                   "Prompt tokens whose KV came from each tier (first admissions).",
                                   labels=["tier"])
        for tier, n in t.get("hit_tokens", {}).items():
            hits.add_metric([tier], n)
        yield hits
        yield CounterMetricFamily("hintkv_prompt_tokens_computed",
                                  "Prompt tokens whose KV the model computed (recomputes included).",
                                  value=t.get("prompt_tokens_computed", 0))
        if not t.get("enabled"):
            return
        blocks = GaugeMetricFamily("hintkv_tier_blocks", "KV blocks held per lower tier.", labels=["tier"])
        cap = GaugeMetricFamily("hintkv_tier_capacity_blocks", "KV block capacity per lower tier.",
                                labels=["tier"])
        events = CounterMetricFamily("hintkv_tier_events", "Tier events (puts, hits, misses, "
                                     "corrupt, io_errors, evicted, ...).", labels=["tier", "event"])
        for tier, u in t.get("tiers", {}).items():
            blocks.add_metric([tier], u["num_blocks"])
            cap.add_metric([tier], u["capacity_blocks"])
            for event, n in u.items():
                if event not in ("num_blocks", "capacity_blocks", "bytes_used"):
                    events.add_metric([tier, event], n)
        yield from (blocks, cap, events)
        moved = CounterMetricFamily("hintkv_tier_bytes_moved", "KV bytes moved per direction.",
                                    labels=["direction"])
        for direction, n in t.get("bytes_moved", {}).items():
            moved.add_metric([direction], n)
        yield moved
        yield CounterMetricFamily("hintkv_tier_load_wait_seconds",
                                  "Time spent waiting on KV loads from lower tiers.",
                                  value=t.get("load_wait_s", 0.0))
        pool = t.get("pool")
        if pool:
            yield GaugeMetricFamily("hintkv_pool_bytes", "Bytes this instance stored in the shared "
                                    "pool, now.", value=pool["bytes_now"])
            yield GaugeMetricFamily("hintkv_pool_bytes_peak", "The most hintkv_pool_bytes has been.",
                                    value=pool["bytes_peak"])
            yield GaugeMetricFamily("hintkv_pool_available", "1 while the pool is reachable "
                                    "(circuit breaker closed).", value=pool["available"])
            ev = CounterMetricFamily("hintkv_pool_events", "Pool events: puts, gets, bytes, dedup "
                                     "(content keys), keep-alive calls, prefetched blocks, ...",
                                     labels=["event"])
            for event, n in pool.items():
                if isinstance(n, int | float) and not isinstance(n, bool) and event not in (
                        "bytes_now", "bytes_peak", "available"):
                    ev.add_metric([event], n)
            yield ev


class IntegrityCollector:
    """Failed integrity checks while serving (periodic, or after every step with
    --debug-integrity), as counted by the engine."""

    def __init__(self, violations: Callable[[], int]) -> None:
        self._violations = violations

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("hintkv_integrity_violations",
                                  "Failed cache integrity checks while serving.",
                                  value=self._violations())


class RequestHistograms:
    """Per-request figures from the engine (`RequestMetrics`), observed once per finished request."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.itl = Histogram("hintkv_request_inter_token_latency_seconds",
                             "Mean gap between a request's output tokens after its first.",
                             buckets=_ITL_BUCKETS, registry=registry)
        self.tok_s = Histogram("hintkv_request_decode_tokens_per_second",
                               "A request's output tokens after its first per second since its first.",
                               buckets=_TOK_S_BUCKETS, registry=registry)
        self.peak_blocks = Histogram("hintkv_request_peak_kv_blocks",
                                     "Most device KV blocks a request held at once.",
                                     buckets=_BLOCK_BUCKETS, registry=registry)
        self.acceptance = Histogram("hintkv_request_spec_acceptance_ratio",
                                    "Accepted / verified speculative drafts of a request (requests with drafts).",
                                    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=registry)
        self.drafts = Counter("hintkv_spec_draft_tokens", "Speculative draft tokens verified.", registry=registry)
        self.accepted = Counter("hintkv_spec_accepted_tokens", "Speculative draft tokens accepted.",
                                registry=registry)

    def observe(self, m: RequestMetrics) -> None:
        if m.itl_s is not None:
            self.itl.observe(m.itl_s)
        if m.decode_tokens_per_s is not None:
            self.tok_s.observe(m.decode_tokens_per_s)
        self.peak_blocks.observe(m.peak_kv_blocks)
        if m.acceptance is not None:
            self.acceptance.observe(m.acceptance)
            self.drafts.inc(m.num_draft_tokens)
            self.accepted.inc(m.num_accepted_tokens)


class ServerMetrics:
    def __init__(self, engine_stats: Callable[[], Any],
                 tier_stats: Callable[[], dict] | None = None,
                 integrity_violations: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hintkv_http_requests",
            "HTTP requests by endpoint and status code.",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "hintkv_prompt_tokens", "Prompt tokens of admitted requests.", registry=self.registry
        )
        self.generation_tokens = Counter(
            "hintkv_generation_tokens", "Tokens generated.", registry=self.registry
        )
        self.ttft = Histogram(
            "hintkv_time_to_first_token_seconds",
            "From request arrival to the first generated token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e_latency = Histogram(
            "hintkv_e2e_request_latency_seconds",
            "From request arrival to its last token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request = RequestHistograms(self.registry)
        self.hint_edits = Counter(
            "hintkv_agent_hint_edits",
            "Agent Hint edits handled, by type, target and what was done.",
            ["type", "target", "action"],
            registry=self.registry,
        )
        self.manage_latency = Histogram(
            "hintkv_agent_hint_manage_seconds",
            "Server time of a management request (manage_request: true), arrival to reply.",
            buckets=_MANAGE_BUCKETS,
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "hintkv_internal_errors",
            "Exceptions no handler mapped to a 4xx/503 (bugs; the tests assert zero).",
            registry=self.registry,
        )
        self.refused = Counter(
            "hintkv_requests_refused",
            "Generation requests refused for load, by status (429 tenant limit, 503 server full).",
            ["status"],
            registry=self.registry,
        )
        self.refuse_latency = Histogram(
            "hintkv_refusal_seconds",
            "Server time of a request refused for load, arrival to the refusal decision.",
            buckets=_MANAGE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineStatsCollector(engine_stats))
        if tier_stats is not None:
            self.registry.register(TierStatsCollector(tier_stats))
        if integrity_violations is not None:
            self.registry.register(IntegrityCollector(integrity_violations))

    def render(self) -> bytes:
        return generate_latest(self.registry)
