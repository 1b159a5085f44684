"""The cost model: how long a forward step or a copy takes, interpolated from a `Profile`.

    cm = CostModel(load_profile("h200-llama3-8b"))
    cm.prefill_ms(new=512, cached=8192)        # 28.89: a measured point comes back as measured
    cm.step_ms([(2048, 0)], decode_contexts=[9000] * 8)
    cm.transfer_ms("host", "device", nbytes)   # bandwidth + latency of that link

Prefill of `new` tokens on a cached prefix of `cached` tokens is split in two parts:

    prefill(new, cached) = cold(new) + attn(new, cached)

`cold(new)` (the GEMMs, plus attention within the new tokens) is piecewise linear over the
measured cold prefills, flat below the smallest (launch-bound) and extended with the last
segment's slope above the largest. `attn(new, cached)` (attending to the cached prefix) is zero at
cached = 0; at each measured `new` it is piecewise linear in `cached` through the measured points
(slope of the last segment beyond them, never negative); between measured `new` values it is
interpolated linearly in `new` (to zero below the smallest, proportional to `new` above the
largest: attention to a prefix is linear in the query tokens). At
every measured point this returns the measured figure (a cold point measured twice returns the
cached-prefix grid's figure).

Decode of a batch at a context length is bilinear over the measured (batch, context) grid,
clamped inside it and extended beyond it: per extra sequence by the last batch segment's slope,
per extra context token by the KV-read cost per sequence-token the largest batch shows (slopes
clamped at zero: the small-batch figures are launch-bound noise). A step that mixes prefill
chunks and decodes costs cold(all tokens) + each chunk's attention + each decode's KV read.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from hintkv.sim.profile import Profile


def _interp(xs: list[float], ys: list[float], x: float, below: str = "flat") -> float:
    """Piecewise linear through (xs, ys); above the last point, the last slope (>= 0).
    below: "flat" (the first y) or "zero-anchored" (linear to the origin)."""
    if len(xs) == 1:
        return ys[0] if below == "flat" else ys[0] * x / xs[0]
    if x <= xs[0]:
        return ys[0] if below == "flat" else ys[0] * x / xs[0]
    i = min(bisect_right(xs, x), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    slope = (y1 - y0) / (x1 - x0)
    if x > xs[-1]:
        slope = max(slope, 0.0)
    return y0 + slope * (x - x0)


class CostModel:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        cold: dict[int, list[float]] = {}
        grid: dict[int, dict[int, float]] = {}
        for n, c, ms in profile.prefill_points:
            if c == 0:
                cold.setdefault(n, []).append(ms)
            else:
                grid.setdefault(n, {})[c] = ms
        # A cold point measured in both tables: the cached-prefix grid's figure (same harness).
        self._cold_x = sorted(cold)
        self._cold_y = [cold[n][0] for n in self._cold_x]
        # attention on the cached prefix, per new token, at each measured `new`
        self._attn: dict[int, tuple[list[float], list[float]]] = {}
        for n, row in sorted(grid.items()):
            cs = sorted(row)
            self._attn[n] = (cs, [(row[c] - self.cold_ms(n)) / n for c in cs])
        self._attn_n = sorted(self._attn)
        self._decode_grid(profile.decode_points)
        self.non_monotone = self._floor_premise()

    def _floor_premise(self) -> str | None:
        """Why `sim.contended`'s floors do not hold on this profile, or None where they do. They
        take a step of more tokens to cost no less (`cold` non-decreasing), `cold` convex (an even
        split is the cheapest chunking's cold part), the step's extra parts non-negative, and a
        token's attention to a prefix never dearer in a larger chunk. The built-in profiles have
        them; a profile measured in wall time on a loaded box need not (sim/calibrate.py: a 16-token
        prefill at 572 ms vs 262 ms for 128). Exact, not sampled: `cold` is linear between its
        points, and each row's per-token attention too, so each check is one at every point."""
        ys, xs = self._cold_y, self._cold_x
        slopes = [0.0] + [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
        for i in range(1, len(slopes)):
            if slopes[i] < slopes[i - 1] - 1e-12:
                what = "falls" if slopes[i] < 0 else "is not convex"
                return f"cold prefill {what} from {xs[i - 1]} to {xs[i]} tokens ({ys[i - 1]:.4g} -> {ys[i]:.4g} ms)"
        if self.profile.step_overhead_ms < 0:
            return f"step_overhead_ms {self.profile.step_overhead_ms} < 0"
        for n in self._attn_n:
            if min(self._attn[n][1]) < 0:
                return f"a {n}-token chunk's attention to a cached prefix is negative (below its cold prefill)"
        ns = self._attn_n
        for n0, n1 in zip(ns, ns[1:]):
            # both rows are linear from (0, 0) to their first point, between their points and past
            # the last, so every point of either and the slope past the last decide for every prefix
            cs = sorted({*self._attn[n0][0], *self._attn[n1][0]})
            gap = [self._attn_at(n0, c) / n0 - self._attn_at(n1, c) / n1 for c in (*cs, cs[-1] + 1)]
            worst = min(range(len(cs)), key=lambda i: gap[i])
            if gap[worst] < -1e-12 or gap[-1] < gap[-2] - 1e-12:
                at = f"a {cs[worst]}-token prefix" if gap[worst] < -1e-12 else f"a prefix past {cs[-1]} tokens"
                return f"a token's attention to {at} costs more in a {n1}-token chunk than in a {n0}-token one"
        return None

    # ---- prefill -------------------------------------------------------------------------
    def cold_ms(self, new: int) -> float:
        return _interp(self._cold_x, self._cold_y, new) if new > 0 else 0.0

    def _attn_at(self, n: int, cached: int) -> float:
        cs, ys = self._attn[n]
        return max(0.0, n * _interp(cs, ys, cached, below="zero-anchored"))

    def attn_ms(self, new: int, cached: int) -> float:
        """Extra time of `new` tokens attending to `cached` prefix tokens."""
        if new <= 0 or cached <= 0 or not self._attn_n:
            return 0.0
        ns = self._attn_n
        if new >= ns[-1]:  # linear in the new tokens beyond the grid
            return self._attn_at(ns[-1], cached) * new / ns[-1]
        return _interp(ns, [self._attn_at(n, cached) for n in ns], new, below="zero-anchored")

    def prefill_ms(self, new: int, cached: int = 0) -> float:
        return self.cold_ms(new) + self.attn_ms(new, cached)

    # The least per-token rates (`sim.contended`'s floors). Each cost is piecewise linear in the
    # chunk's size (flat or zero-anchored below the first measured size, linear above the last), so
    # its per-token rate is monotone between the measured sizes: the least is at one of them or an end.
    def least_cold_rate_ms(self, upto: int, least: int = 1) -> float:
        """The least `cold_ms(n) / n` over least <= n <= upto (a step of at least `least` tokens
        and at most `upto`: what a chunk of `least` tokens in a batched step pays a token at best)."""
        xs = {least, upto, *(int(x) for x in self._cold_x if least <= x <= upto)}
        return min(self.cold_ms(n) / n for n in xs)

    def attn_breaks(self) -> list[int]:
        """The cached-prefix lengths where `attn_ms(n, cached)` bends, for every n (0 and the
        measured ones): between them it is linear in `cached`, and beyond the last one too."""
        return sorted({0, *(int(c) for n in self._attn_n for c in self._attn[n][0])})

    def least_attn_rate_ms(self, cached: int, largest: int) -> float:
        """The least `attn_ms(n, cached) / n` over 1 <= n <= largest: a chunk's attention per query
        token to a `cached`-token prefix, at the cheapest chunk size."""
        xs = {1, largest, *(n for n in self._attn_n if 1 <= n <= largest)}
        return min(self.attn_ms(n, cached) / n for n in xs)

    # ---- decode --------------------------------------------------------------------------
    def _decode_grid(self, points: list[tuple[int, int, float]]) -> None:
        self._batches = sorted({b for b, _, _ in points})
        self._ctxs = sorted({c for _, c, _ in points})
        table = {(b, c): ms for b, c, ms in points}
        missing = [(b, c) for b in self._batches for c in self._ctxs if (b, c) not in table]
        if missing:
            raise ValueError(f"decode points must form a full batch x context grid; missing {missing}")
        self._decode = table
        self._rows = [[table[b, x] for x in self._ctxs] for b in self._batches]  # per batch, by context
        bmax = self._batches[-1]
        if len(self._ctxs) > 1:
            c0, c1 = self._ctxs[-2], self._ctxs[-1]
            self._kv_read_ms = max(0.0, (table[bmax, c1] - table[bmax, c0]) / (bmax * (c1 - c0)))
        else:
            self._kv_read_ms = 0.0

    def kv_read_ms(self, context: int) -> float:
        """Decode cost of one sequence's context beyond what the grid's base covers."""
        return self._kv_read_ms * context

    def decode_ms(self, batch: int, context: int) -> float:
        """One decode step of `batch` sequences at (mean) context `context`."""
        if batch <= 0:
            return 0.0
        bs, cs, rows = self._batches, self._ctxs, self._rows
        c = min(max(context, cs[0]), cs[-1])
        # `_interp(bs, [each row at c], batch)`, interpolating only the rows it reads
        if len(bs) == 1 or batch <= bs[0]:
            ms = _interp(cs, rows[0], c)
        else:
            i = min(bisect_right(bs, batch), len(bs) - 1)
            y0, y1 = _interp(cs, rows[i - 1], c), _interp(cs, rows[i], c)
            slope = (y1 - y0) / (bs[i] - bs[i - 1])
            if batch > bs[-1]:
                slope = max(slope, 0.0)
            ms = y0 + slope * (batch - bs[i - 1])
        if context > cs[-1]:
            ms += batch * self.kv_read_ms(context - cs[-1])
        return ms

    # ---- a whole step --------------------------------------------------------------------
    def step_ms(self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int] = ()) -> float:
        """One forward: prefill `chunks` as (new, cached) plus one token for each decode."""
        over = self.profile.step_overhead_ms
        if not chunks:
            return self.decode_step_ms(len(decode_contexts), sum(decode_contexts))
        total = sum(n for n, _ in chunks) + len(decode_contexts)
        return (over + self.cold_ms(total) + sum(self.attn_ms(n, c) for n, c in chunks)
                + sum(self.kv_read_ms(c) for c in decode_contexts))

    def decode_step_ms(self, batch: int, context_sum: int) -> float:
        """A decode-only step of `batch` sequences whose contexts sum to `context_sum` (what
        `step_ms((), contexts)` gives; a decode stretch's steps need only the batch and the sum)."""
        if batch <= 0:
            return 0.0
        return self.profile.step_overhead_ms + self.decode_ms(batch, context_sum // batch)

    def decode_steps_ms(self, batch: int, context_sum: int, count: int) -> list[float]:
        """`decode_step_ms(batch, context_sum + i * batch)` for i in range(count), the same floats: a
        decode stretch's steps (`sim.stretch`), each one token further on. Past the grid's largest
        context only the KV read grows, so there each step is one multiply-add (the per-step calls
        were ~15% of a full-scale lru+host run under cProfile, twenty-fourth session)."""
        if batch <= 0:
            return [0.0] * count
        first = context_sum // batch  # step i's mean context: (context_sum + i * batch) // batch = first + i
        last = self._ctxs[-1]
        slow = min(count, max(0, last + 1 - first))  # steps at or inside the grid: the general path
        out = [self.decode_step_ms(batch, context_sum + i * batch) for i in range(slow)]
        if slow < count:
            over, base, kv = self.profile.step_overhead_ms, self.decode_ms(batch, last), self._kv_read_ms
            out.extend(over + (base + batch * (kv * (first + i - last))) for i in range(slow, count))
        return out

    # ---- copies --------------------------------------------------------------------------
    def transfer_ms(self, src: str, dst: str, nbytes: int) -> float:
        """A batched copy of `nbytes` over the `src->dst` link (latency once per batch)."""
        return self.profile.link(src, dst).ms(nbytes)

    def exposed_copy_ms(self, copy_ms: float) -> float:
        """What a device<->host copy running beside compute adds to the step."""
        return copy_ms * (1 - self.profile.copy_overlap)

    def tokens_ms(self, src: str, dst: str, num_tokens: int) -> float:
        return self.transfer_ms(src, dst, num_tokens * self.profile.kv_bytes_per_token)
