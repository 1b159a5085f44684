"""What `hintkv bench engine` measures on a server, and how the servers' samples are interleaved.

Every server (plain hintkv, its variants, vLLM) is up at once and idle between its samples. Each
round takes one sample of each figure from every server, figure by figure, so the samples a ratio
compares were taken seconds apart (a load spike lands on both sides, not on one server's whole
run); the servers' order steps through the rows of a Williams design from round to round within each figure
(`sample_orders`: figure k of round r runs row (r + k) mod the row count, so no figure repeats an order before
every row has run; a figure run for as many rounds as rows (n servers: n rows, 2n when n is odd) takes every row
once: every server takes every place equally often and directly follows every other server equally often within
a row, the crossover trials' balance for carry-over: what one server leaves behind, a spinning worker or a cold
cache, lands on each of the others alike. Rows taken in sample sequence instead (222e8e8) gave a figure the same
order, or A B C / C B A, in every round whenever the figure count shared a factor with the row count:
review_eng21 finding 1), and each figure is the median over rounds. The per-round samples stay in
`ServerFigures.samples`: the report gives the spread of every ratio over the rounds. Before each sample every
server's process group must be at rest (`idle_wait.wait_idle`: at least `SWITCH_PAUSE_S`, then nothing runnable
and at most 2 ticks of CPU over 0.2 s, at most `REST_MAX_S`; each server's longest wait and samples not at rest are in
its figures): vLLM's worker spins for 1 s after its last request, which landed on the next server's sample.
Whether the others stayed at rest DURING a sample is measured too: the most CPU the other servers'
process groups used while one of a server's samples ran, in CPU s and as a share of one CPU over the sample
(`ServerFigures.others_cpu_max_s`, `others_cpu_share_max`: the goals' `rest` takes the share, at most 0.1).

- prefill tok/s at 512 / 2048 / 8192 prompt tokens (`max_tokens=1`; prompt tokens / TTFT)
- decode tok/s at batch 1 and 8 (128-token prompts, `ignore_eos`, fixed `max_tokens`; batch 8 is
  8 concurrent streams, counted over the window where all 8 decode)
- TTFT of a 2048-token prompt whose first 1920 tokens were just sent (cached), against a cold
  128-token prefill (1920 = 15 x 128, block-aligned for vLLM CPU's 128-token prefix blocks too)

For every TTFT sample a hintkv server also reports its own engine TTFT (`hintkv_metrics.ttft_s`: the
request's arrival at the scheduler -> its first token, the forward included), kept as `engine_ms_<figure>`;
the client's TTFT less it is what the serving path around the engine cost that request (HTTP, the
handler, the hand-offs between threads, the first chunk): `ServerFigures.outside_ms`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hintkv.bench.common import PromptFactory, log, median, ratio
from hintkv.bench.idle_wait import group_cpu_s, wait_idle
from hintkv.bench.stream_client import CompletionTiming, batch_decode_tok_per_s, stream_batch, stream_completion

SWITCH_PAUSE_S = 0.3  # between two servers' samples: a peer's spinning OpenMP threads go to sleep
REST_MAX_S = 3.0  # the longest wait for every server to come to rest (idle_wait.py)


@dataclass(slots=True)
class Workload:
    """What is measured on every server (the same for hintkv and vLLM)."""

    prefill_lengths: tuple[int, ...] = (512, 2048, 8192)
    decode_prompt_tokens: int = 128
    decode_tokens: int = 64  # max_tokens of each decode stream (ignore_eos)
    batch: int = 8
    cached_prefix_tokens: int = 1920
    cached_prompt_tokens: int = 2048
    cold_prompt_tokens: int = 128
    repeats: int = 5  # interleaved rounds
    max_num_batched_tokens: int = 2048  # both servers' chunked-prefill budget per step

    def __post_init__(self) -> None:
        if not 0 < self.cached_prefix_tokens < self.cached_prompt_tokens:
            raise ValueError("the cached prefix must be shorter than the prompt")
        if self.repeats < 1 or self.batch < 1 or self.decode_tokens < 2:
            raise ValueError("repeats and batch must be >= 1, decode_tokens >= 2")

    @property
    def max_model_len(self) -> int:
        """Room for an 8192-token prompt plus output on both servers; the same in `--quick`, so
        vLLM's compile cache (keyed by its config) is shared by quick and full runs."""
        longest = max(8192, *self.prefill_lengths, self.cached_prompt_tokens,
                      self.decode_prompt_tokens + self.decode_tokens)
        return longest + 256

    @property
    def kv_cache_tokens(self) -> int:
        """The KV pool both servers get: the longest prompt plus the batch, twice over."""
        return 2 * (self.max_model_len + self.batch * (self.decode_prompt_tokens + self.decode_tokens))

    @classmethod
    def for_run(cls, quick: bool) -> Workload:
        if quick:
            return cls(prefill_lengths=(512, 2048), decode_tokens=32, repeats=3)
        return cls()


@dataclass(slots=True)
class ServerFigures:
    """One server's measurements on one model: medians over the rounds (None: not measured or failed)."""

    prefill_tok_s: dict[int, float] = field(default_factory=dict)
    prefill_ms: dict[int, float] = field(default_factory=dict)
    engine_ms: dict[str, float] = field(default_factory=dict)  # TTFT figure -> hintkv's own engine TTFT (median)
    decode_tok_s_b1: float | None = None
    decode_tok_s_batch: float | None = None
    ttft_cached_ms: float | None = None
    ttft_cold_ms: float | None = None
    startup_s: float | None = None
    error: str | None = None
    rest_wait_max_s: float | None = None  # the longest wait for every server to rest before one of its samples
    samples_not_at_rest: int = 0  # its samples taken after `REST_MAX_S` with some server still busy
    others_cpu_max_s: float | None = None  # the most CPU s the other servers used during one of its samples
    others_cpu_share_max: float | None = None  # the same as a share of one CPU over that sample's own length
    samples: dict[str, list[float | None]] = field(default_factory=dict)  # figure -> one value per round
    # hintkv's environment switches this server ran with (engine_servers.server_switches; None: unset, the default)
    switches: dict[str, str | None] = field(default_factory=dict)

    def record_others(self, used_s: float, sample_s: float) -> None:
        """The other servers used `used_s` CPU seconds during one of this server's samples, `sample_s` long."""
        share = used_s / sample_s if sample_s > 0 else 0.0
        self.others_cpu_max_s = max(used_s, self.others_cpu_max_s or 0.0)
        self.others_cpu_share_max = max(share, self.others_cpu_share_max or 0.0)

    @property
    def cached_vs_cold(self) -> float | None:
        return ratio(self.ttft_cached_ms, self.ttft_cold_ms)

    def summarize(self) -> None:
        """The medians from `samples`."""
        for key, values in self.samples.items():
            m = median_or_none(values)
            if key.startswith("prefill_ms_"):
                n = int(key.removeprefix("prefill_ms_"))
                if m is not None:
                    self.prefill_ms[n], self.prefill_tok_s[n] = m, n / (m / 1000)
            elif key.startswith("engine_ms_"):
                if m is not None:
                    self.engine_ms[key.removeprefix("engine_ms_")] = m
            elif key in ("decode_tok_s_b1", "decode_tok_s_batch", "ttft_cached_ms", "ttft_cold_ms"):
                setattr(self, key, m)

    def outside_ms(self) -> dict[str, float]:
        """TTFT figure -> the median over rounds of the client's TTFT less the server's engine TTFT
        (hintkv only: other servers report no engine TTFT)."""
        out = {}
        for figure, client_key in TTFT_FIGURES.items():
            pairs = zip(self.samples.get(client_key, []), self.samples.get(f"engine_ms_{figure}", []))
            m = median_or_none([c - e for c, e in pairs if c is not None and e is not None])
            if m is not None:
                out[figure] = m
        return out


# a TTFT figure's name in `engine_ms_<name>` -> its client-side sample
TTFT_FIGURES = {"prefill_512": "prefill_ms_512", "prefill_2048": "prefill_ms_2048", "prefill_8192": "prefill_ms_8192",
                "cached": "ttft_cached_ms", "cold": "ttft_cold_ms"}


def median_or_none(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return median(xs) if xs else None


def williams_rows(n: int) -> list[list[int]]:
    """A Williams design on n treatments: n rows (2n when n is odd), each a permutation of range(n); over all rows
    every position holds every treatment equally often and every ordered pair (a directly before b) occurs equally
    often within the rows."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


def sample_orders(live: list[str], repeats: int, figures: int) -> list[list[list[str]]]:
    """orders[r][k]: the servers' order for figure k of round r, the Williams rows over `live` stepped by round
    within each figure (row (r + k) mod the row count): a figure's order changes every round, and its rounds run the
    rows in turn (all of them, once each, over as many rounds as rows)."""
    rows = williams_rows(len(live)) if live else [[]]
    return [[[live[j] for j in rows[(r + k) % len(rows)]] for k in range(figures)] for r in range(repeats)]


# ---------------------------------------------------------------- one sample of each figure


def _engine_ms(figure: str, t: CompletionTiming) -> dict[str, float | None]:
    """{engine_ms_<figure>: the server's own engine TTFT (hintkv), or None where a server gave none (vLLM, or a
    chunk without metrics)}: every round keeps its place, so `outside_ms` pairs each client sample with its own
    round's engine sample."""
    engine_ttft = (t.server_metrics or {}).get("ttft_s")
    return {f"engine_ms_{figure}": None if engine_ttft is None else engine_ttft * 1000}


async def _prefill_ms(url: str, model: str, prompts: PromptFactory, n: int) -> dict[str, float]:
    t = await stream_completion(url, model, prompts.make(n), max_tokens=1)
    return {f"prefill_ms_{n}": t.ttft_s * 1000, **_engine_ms(f"prefill_{n}", t)}


async def _decode_b1(url: str, model: str, prompts: PromptFactory, w: Workload) -> float | None:
    t = await stream_completion(url, model, prompts.make(w.decode_prompt_tokens), max_tokens=w.decode_tokens)
    if t.num_tokens != w.decode_tokens:
        log(f"warning: asked for {w.decode_tokens} tokens, got {t.num_tokens} (ignore_eos not honoured?)")
    return t.decode_tok_per_s


async def _decode_batch(url: str, model: str, prompts: PromptFactory, w: Workload) -> float | None:
    batch = [prompts.make(w.decode_prompt_tokens) for _ in range(w.batch)]
    return batch_decode_tok_per_s(await stream_batch(url, model, batch, max_tokens=w.decode_tokens))


async def _cached_and_cold_ms(url: str, model: str, prompts: PromptFactory, w: Workload) -> dict[str, float]:
    prompt = prompts.make(w.cached_prompt_tokens)
    await stream_completion(url, model, prompt[: w.cached_prefix_tokens], max_tokens=1)  # caches the prefix
    cached = await stream_completion(url, model, prompt, max_tokens=1)
    cold = await stream_completion(url, model, prompts.make(w.cold_prompt_tokens), max_tokens=1)
    return {"ttft_cached_ms": cached.ttft_s * 1000, "ttft_cold_ms": cold.ttft_s * 1000,
            **_engine_ms("cached", cached), **_engine_ms("cold", cold)}


async def warm_up(url: str, model: str, prompts: PromptFactory, w: Workload) -> None:
    """First requests pay for lazy init, allocator growth and (vLLM) compiled-shape lookups."""
    for n in (w.cold_prompt_tokens, 512, min(2048, max(w.prefill_lengths))):
        await _prefill_ms(url, model, prompts, n)
    await _decode_b1(url, model, prompts, Workload(decode_tokens=8, repeats=1))
    await _decode_batch(url, model, prompts, Workload(decode_tokens=8, batch=w.batch, repeats=1))
    await _cached_and_cold_ms(url, model, prompts, w)


Sampler = Callable[[str, str, PromptFactory, Workload], Awaitable[dict[str, float | None]]]


def samplers(w: Workload) -> list[Sampler]:
    """One sampler per figure (a sampler returns {figure: value}); a round runs each on every server."""
    out: list[Sampler] = []
    for n in w.prefill_lengths:
        async def prefill(url, model, prompts, w, n=n):
            return await _prefill_ms(url, model, prompts, n)
        out.append(prefill)

    async def b1(url, model, prompts, w):
        return {"decode_tok_s_b1": await _decode_b1(url, model, prompts, w)}

    async def batch(url, model, prompts, w):
        return {"decode_tok_s_batch": await _decode_batch(url, model, prompts, w)}

    async def ttft(url, model, prompts, w):
        return await _cached_and_cold_ms(url, model, prompts, w)
    return [*out, b1, batch, ttft]


async def measure_interleaved(servers: dict[str, str], model: str, prompts: PromptFactory,
                              w: Workload, groups: dict[str, int] | None = None) -> dict[str, ServerFigures]:
    """`servers` ({name: base url}, all up): warm each up, then `w.repeats` interleaved rounds; `groups`
    ({name: process group id}) are waited for to be at rest before each sample."""
    figures = {name: ServerFigures() for name in servers}
    pgids = list((groups or {}).values())
    for name, url in servers.items():
        t0 = time.perf_counter()
        try:
            await warm_up(url, model, prompts, w)
        except Exception as exc:  # noqa: BLE001 - a broken server is reported, the others go on
            figures[name].error = f"{type(exc).__name__}: {str(exc)[:2000]}"
        log(f"  {name}: warm-up {time.perf_counter() - t0:.1f}s")
    live = [n for n in servers if figures[n].error is None]
    sampler_list = samplers(w)
    orders = sample_orders(live, w.repeats, len(sampler_list))
    for r in range(w.repeats):
        waits: list[float] = []
        restless, shared = 0, 0.0
        for k, sample in enumerate(sampler_list):
            for name in orders[r][k]:
                if figures[name].error is not None:
                    continue
                waited, idle = await wait_idle(pgids, min_s=SWITCH_PAUSE_S, max_s=REST_MAX_S)
                waits.append(waited)
                restless += not idle
                f = figures[name]
                f.rest_wait_max_s = max(waited, f.rest_wait_max_s or 0.0)
                f.samples_not_at_rest += not idle
                others = [g for n, g in (groups or {}).items() if n != name]
                cpu0, t0 = sum(group_cpu_s(g) for g in others), time.perf_counter()
                try:
                    got = await sample(servers[name], model, prompts, w)
                except Exception as exc:  # noqa: BLE001
                    figures[name].error = f"{type(exc).__name__}: {str(exc)[:2000]}"
                    continue
                used = sum(group_cpu_s(g) for g in others) - cpu0
                f.record_others(used, time.perf_counter() - t0)
                shared = max(used, shared)
                for key, value in got.items():
                    figures[name].samples.setdefault(key, []).append(value)
        log(f"  round {r + 1}/{w.repeats}: " + ", ".join(
            f"{n} b1 {_last(figures[n], 'decode_tok_s_b1')} b{w.batch} {_last(figures[n], 'decode_tok_s_batch')}"
            for n in live) + (f"; rest waits max {max(waits):.2f}s, {restless} not at rest, "
                                     f"others' CPU during a sample max {shared:.2f}s" if waits else ""))
    for f in figures.values():
        f.summarize()
    return figures


def _last(f: ServerFigures, key: str) -> str:
    v = (f.samples.get(key) or [None])[-1]
    return "-" if v is None else f"{v:.1f}"
