"""Token sampling: greedy rows batched; temperature / top-p rows with per-request seeds."""

from __future__ import annotations

import torch

from hintkv.engine.types import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits: [N, V] float32 -> one token id per row."""
    out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.greedy:
            continue
        probs = torch.softmax(logits[i] / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < p.top_p  # always keeps the top token
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
            continue  # NaN/inf logits: keep the argmax rather than fail the whole batch
        out[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return out
