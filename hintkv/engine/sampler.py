"""Token sampling: greedy rows batched; temperature / min-p / top-k / top-p rows with per-request seeds.

`probs` is the one definition of a request's sampling distribution; plain sampling and the
speculative verifier (`engine/spec/verify.py`) both draw from it, so speculation keeps it.
"""

from __future__ import annotations

import torch

from hintkv.engine.types import SamplingParams
from hintkv.models import cpu_kernels


def probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor | None:
    """[V] logits -> the distribution `p` samples from; None when it is not one (greedy, or NaN/inf
    logits: the caller keeps the argmax rather than fail the whole batch)."""
    if p.greedy:
        return None
    pr = torch.softmax(logits.float() / p.temperature, dim=-1)
    if p.min_p > 0.0:  # vLLM's order: min-p, then top-k, then top-p
        pr = pr * (pr >= p.min_p * pr.max())
    if 0 < p.top_k < pr.shape[0]:
        kth = torch.topk(pr, p.top_k).values[-1]
        pr = pr * (pr >= kth)  # ties at the k-th probability all stay (as a logit threshold keeps them)
    if p.min_p > 0.0 or 0 < p.top_k < pr.shape[0]:
        pr = pr / pr.sum()  # top-p reads a distribution
    if p.top_p < 1.0:
        sorted_p, idx = pr.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < p.top_p  # always keeps the top token
        pr = torch.zeros_like(pr).scatter_(0, idx, sorted_p * keep)
    total = float(pr.sum())
    if not bool(torch.isfinite(pr).all()) or total <= 0:
        return None
    return pr / total if total != 1.0 else pr


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits: [N, V] float32 -> one token id per row."""
    out = cpu_kernels.argmax(logits)  # C++ on CPU float32 logits, same result as torch's
    if out is None:
        out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        pr = probs(logits[i], p)
        if pr is not None:
            out[i] = int(torch.multinomial(pr, 1, generator=generators[i]).item())
    return out
