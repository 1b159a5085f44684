"""Verification of k drafts from one forward: the tokens the target model would have produced.

Rows: logits at the last real token and at each of the k drafts ([k+1, V]); row j is the model's
distribution for the token after draft j (row 0: after the last real token).

- greedy: accept drafts while each equals the argmax before it; then append the argmax at the
  first mismatch (or after the last draft). Identical tokens to decoding one at a time.
- sampled: speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023) with a
  deterministic draft (q = a point mass on draft j): accept draft j with probability p_j(d_j);
  on rejection draw from the residual max(p_j - q, 0) / Z, i.e. p_j without d_j, renormalized;
  after k accepted drafts draw the bonus token from p_k. Each emitted token is distributed
  exactly as plain sampling from p would be.
"""

from __future__ import annotations

import torch

from hintkv.engine.sampler import probs
from hintkv.engine.types import SamplingParams


def verify(logits: torch.Tensor, drafts: list[int], params: SamplingParams,
           generator: torch.Generator | None = None) -> list[int]:
    """logits [len(drafts) + 1, V] -> accepted drafts followed by one more token (1 .. k+1 ids)."""
    k = len(drafts)
    if logits.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} logit rows for {k} drafts, got {logits.shape[0]}")
    if params.greedy:
        target = logits.argmax(dim=-1).tolist()
        out = []
        for j, d in enumerate(drafts):
            if d != target[j]:
                break
            out.append(d)
        out.append(target[len(out)])
        return out
    out = []
    for j in range(k + 1):
        pr = probs(logits[j], params)
        if pr is None:  # not a distribution (NaN/inf): greedy on this row
            tok = int(logits[j].argmax())
            if j < k and tok == drafts[j]:
                out.append(tok)
                continue
            out.append(tok)
            return out
        if j == k:
            out.append(int(torch.multinomial(pr, 1, generator=generator).item()))
            return out
        d = drafts[j]
        u = float(torch.rand((), generator=generator, device=logits.device))
        if u < float(pr[d]):
            out.append(d)
            continue
        residual = pr.clone()
        residual[d] = 0.0
        if float(residual.sum()) <= 0:  # p_j(d) == 1 yet u >= 1 cannot happen; be safe
            out.append(d)
            continue
        out.append(int(torch.multinomial(residual, 1, generator=generator).item()))
        return out
    return out
