"""The swarm replay's pace: how many trace seconds pass in one replay second, from serving speed.

    pace = deployment_serving_s(wl) / serving_s(wl, speed)   # speed: measured, or the offline model's

A trace records an agent's tool and think times next to what its real deployment served. How much
a cache is contended depends on the ratio of the two: serve slowly against the same tool times
and more sessions overlap, the working set grows, the queue grows. A fixed time scale made that
ratio a property of the machine (a fast idle CPU served the `--quick` swarm with little overlap,
lru hit 0.29; the same run at load 7 hit 0.09). So the replay keeps the deployment's ratio
instead: the trace's times are divided by

    pace = serving time of the workload at full token scale on the deployment profile
           (`h200-llama3-8b`: an H200 serving Llama-3-8B, `hintkv.sim` profiles)
         / serving time of the replayed (token-scaled) workload on the engine that replays it

so that an agent's tool time is as long, relative to one of its calls, as it was in the deployment.
The offline replay uses its own time model (`OfflineConfig`'s per-token costs); a live run measures
its server through HTTP just before it starts (`measure_speed`: lone cold prompts of two lengths,
and a stream's token gaps), so the same workload is equally contended at any load and on any CPU.
A call's serving time is its prefill of what it adds to its agent's previous prompt (the rest is
that agent's cached prefix) plus its decode; the pace is a ratio of sums over every call.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from hintkv.replay import OfflineConfig
from hintkv.workload.program import Workload

DEPLOYMENT_PROFILE = "h200-llama3-8b"
PROBE = {"new": (32, 256), "cached": (0,), "batch": (1,), "context": (64,), "repeats": 3}


@dataclass(frozen=True, slots=True)
class Speed:
    """A serving engine's time per call: a fixed part, per new prompt token, per output token."""

    call_s: float
    prefill_s_per_token: float
    decode_s_per_token: float

    def serve_s(self, new: int, out: int) -> float:
        return self.call_s + new * self.prefill_s_per_token + out * self.decode_s_per_token


def call_tokens(wl: Workload) -> Iterator[tuple[int, int, int]]:
    """(new, cached, out) tokens of every call: new is what the prompt adds to the agent's
    previous prompt (a whole prompt when its context was compressed)."""
    for task in wl.tasks():
        for agent in task.agents():
            prev = 0
            for c in agent.calls:
                p = c.num_prompt_tokens
                new = p - prev if p >= prev else p
                yield new, p - new, c.max_tokens
                prev = p


def serving_s(wl: Workload, speed: Speed) -> float:
    return sum(speed.serve_s(new, out) for new, _, out in call_tokens(wl))


def slowdown(wl: Workload, model: Speed, measured: Speed) -> float:
    """`wl`'s serving time at `measured` over its serving time at `model`."""
    return serving_s(wl, measured) / serving_s(wl, model)


def deployment_serving_s(wl: Workload, profile: str = DEPLOYMENT_PROFILE) -> float:
    """The workload's serving time at full token scale (tokens / the workload's token scale) on
    `profile`: prefill of the new tokens over the cached prefix, then decode at batch 1."""
    from hintkv.sim.costs import CostModel
    from hintkv.sim.profile import load_profile

    cm = CostModel(load_profile(profile))
    f = 1.0 / float(wl.meta.get("token_scale") or 1.0)
    total_ms = 0.0
    for new, cached, out in call_tokens(wl):
        full_new, full_cached, full_out = round(new * f), round(cached * f), round(out * f)
        total_ms += cm.prefill_ms(max(full_new, 1), full_cached)
        total_ms += full_out * cm.decode_ms(1, full_new + full_cached)
    return total_ms / 1e3


def reference_speed(cfg: OfflineConfig) -> Speed:
    """The offline replay's engine model as a `Speed` (no per-call part)."""
    return Speed(0.0, cfg.prefill_s_per_token, cfg.decode_s_per_token)


def pace(wl: Workload, speed: Speed) -> float:
    """Trace seconds per replay second that give `wl` its deployment's tool : serving ratio."""
    return deployment_serving_s(wl) / serving_s(wl, speed)


def fit_speed(prefill_ms: list[tuple[int, float]], decode_gap_ms: float) -> Speed:
    """A `Speed` from cold-prompt times to the first token [(tokens, ms)] and a token gap."""
    (n0, t0), (n1, t1) = min(prefill_ms), max(prefill_ms)
    per_token = max(0.0, (t1 - t0) / (n1 - n0)) / 1e3 if n1 > n0 else 0.0
    return Speed(max(0.0, t0 / 1e3 - n0 * per_token), per_token, decode_gap_ms / 1e3)


async def measure_speed(base_url: str, model: str, seed: int = 0, vocab: int = 49152) -> Speed:
    """The server's `Speed` as a client sees it, now: lone cold prompts of 32 and 256 random
    tokens (median of 3 each, HTTP included) and the median token gap of a lone stream. Its
    prompts are fresh random ids: their blocks are unheld cached blocks, the first to go."""
    from hintkv.sim.calibrate_server import _measure

    points, decode, _, _ = await _measure(base_url, model, PROBE, seed, vocab, None, keep_warm=False)
    gap = statistics.median(ms for _, _, ms in decode)
    return fit_speed([(n, ms) for n, _, ms in points], gap)
