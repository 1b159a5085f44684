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

The penalties read a sequence's whole history; a `TokenTally` (carried by the sequence) folds in
only each step's new tokens, so a step's cost does not grow with the context (vLLM keeps its
prompt mask and output counts the same way).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence as Seq
from dataclasses import dataclass

import torch

from hintkv.engine.types import SamplingParams


@dataclass(slots=True)
class TokenTally:
    """A sequence's tokens for the penalties, as of `token_ids[:folded]`: which token ids occur in the
    prompt and output (`seen`), and how often each occurs in the output (`counts`)."""

    seen: torch.Tensor | None = None  # [V] bool
    counts: torch.Tensor | None = None  # [V], the logits' dtype
    folded: int = 0

    def update(self, token_ids: Seq[int], num_prompt: int, row: torch.Tensor) -> None:
        vocab = row.shape[0]
        if (self.seen is None or self.folded > len(token_ids) or self.seen.shape[0] != vocab
                or self.counts.dtype != row.dtype or self.seen.device != row.device):
            self.seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
            self.counts = torch.zeros(vocab, dtype=row.dtype, device=row.device)
            self.folded = 0
        if self.folded < len(token_ids):
            ids = torch.as_tensor(token_ids[self.folded:], dtype=torch.long, device=row.device)
            out = ids[max(0, num_prompt - self.folded):]
            self.seen[ids[ids < vocab]] = True
            self.counts += torch.bincount(out[out < vocab], minlength=vocab).to(row.dtype)
            self.folded = len(token_ids)


def needs_tally(p: SamplingParams) -> bool:
    """Whether `p`'s shaping reads the history (the penalties)."""
    return p.repetition_penalty != 1.0 or bool(p.frequency_penalty or p.presence_penalty)


def shape_row(row: torch.Tensor, p: SamplingParams, token_ids: Seq[int], num_prompt: int,
              eos: Collection[int], tally: TokenTally | None = None) -> None:
    """Shape one [V] row in place; `token_ids` is the prompt followed by the outputs so far; `tally`
    (kept across the sequence's steps) saves re-reading them."""
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
    if not needs_tally(p):
        return
    tally = tally if tally is not None else TokenTally()
    tally.update(token_ids, num_prompt, row)
    if p.repetition_penalty != 1.0:
        row.copy_(torch.where(tally.seen, torch.where(row > 0, row / p.repetition_penalty,
                                                      row * p.repetition_penalty), row))
    if p.frequency_penalty or p.presence_penalty:
        counts = tally.counts
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def shape_logits(logits: torch.Tensor, params: Seq[SamplingParams],
                 histories: Seq[tuple[Seq[int], int] | tuple[Seq[int], int, TokenTally | None]],
                 eos: Collection[int]) -> torch.Tensor:
    """[N, V] logits -> the same tensor, or a shaped copy when any row's request shapes its logits.
    `histories[i]` is row i's (prompt + outputs so far, number of prompt tokens[, its TokenTally])."""
    rows = [i for i, p in enumerate(params) if p.shapes_logits]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        ids, num_prompt, *tally = histories[i]
        shape_row(logits[i], params[i], ids, num_prompt, eos, tally[0] if tally else None)
    return logits
