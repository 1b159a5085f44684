"""Per-request metrics users expect (TTFT, inter-token latency, tokens/s, peak KV blocks,
speculative acceptance), from the timestamps and counters the scheduler keeps on a `Sequence`."""

from __future__ import annotations

from hintkv.engine.sequence import Sequence
from hintkv.engine.types import RequestMetrics


def request_metrics(seq: Sequence, now: float) -> RequestMetrics:
    """A finishing sequence's figures (`now`: the scheduler's clock at its finish)."""
    first, last = seq.first_token_time, seq.last_token_time
    n_after = seq.num_output_tokens - 1
    decode_s = (last - first) if first is not None and last is not None else 0.0
    return RequestMetrics(
        ttft_s=None if first is None else first - seq.arrival,
        e2e_s=now - seq.arrival,
        itl_s=decode_s / n_after if n_after > 0 else None,
        decode_tokens_per_s=n_after / decode_s if n_after > 0 and decode_s > 0 else None,
        peak_kv_blocks=seq.peak_kv_blocks,
        num_draft_tokens=seq.num_draft_tokens,
        num_accepted_tokens=seq.num_accepted_tokens,
        ttft_parts=None if first is None else seq.ttft,
    )
