"""Per-request logit shaping before sampling, with vLLM's semantics and in its order.

For each row whose `SamplingParams.shapes_logits`:
1. `logit_bias`: added to the named tokens' logits (OpenAI's field: -100 bans, +100 forces);
2. `min_tokens`: EOS and `stop_token_ids` get -inf until the request has that many outputs;
3. `repetition_penalty` r (prompt and output tokens): a positive logit is divided by r, a negative
   one multiplied by it (CTRL's rule, as vLLM and Hugging Face apply it);
4. `frequency_penalty` f and `presence_penalty` p (output tokens only, OpenAI's rule):
   logit -= f x count + p x (count > 0).
Temperature, min-p, top-k and top-p come after, in `sampler.probs`; greedy takes the argmax of the
shaped row. Rows of other requests are left as they are (and cost nothing).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence as Seq

import torch

from hintkv.engine.types import SamplingParams


def shape_row(row: torch.Tensor, p: SamplingParams, token_ids: Seq[int], num_prompt: int,
              eos: Collection[int]) -> None:
    """Shape one [V] row in place; `token_ids` is the prompt followed by the outputs so far."""
    vocab = row.shape[0]
    if p.logit_bias:
        ids = [t for t, _ in p.logit_bias if t < vocab]
        bias = [b for t, b in p.logit_bias if t < vocab]
        row[torch.tensor(ids, dtype=torch.long, device=row.device)] += torch.tensor(bias, dtype=row.dtype,
                                                                                    device=row.device)
    if len(token_ids) - num_prompt < p.min_tokens:
        banned = [t for t in set(eos) | set(p.stop_token_ids) if t < vocab]
        if banned:
            row[torch.tensor(banned, dtype=torch.long, device=row.device)] = float("-inf")
    if p.repetition_penalty != 1.0 and token_ids:
        seen = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=row.device)
        seen = seen[seen < vocab]
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and len(token_ids) > num_prompt:
        out = torch.tensor(token_ids[num_prompt:], dtype=torch.long, device=row.device)
        counts = torch.bincount(out[out < vocab], minlength=vocab).to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def shape_logits(logits: torch.Tensor, params: Seq[SamplingParams], histories: Seq[tuple[Seq[int], int]],
                 eos: Collection[int]) -> torch.Tensor:
    """[N, V] logits -> the same tensor, or a shaped copy when any row's request shapes its logits.
    `histories[i]` is row i's (prompt + outputs so far, number of prompt tokens)."""
    rows = [i for i, p in enumerate(params) if p.shapes_logits]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        ids, num_prompt = histories[i]
        shape_row(logits[i], params[i], ids, num_prompt, eos)
    return logits
