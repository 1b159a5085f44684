"""Speculative decoding from the session's own text: draft proposers (no tensors) and the
verification of k drafts in one forward (`verify.py`, tensors; only the model runner imports it).

    scheduler.schedule():  drafts = proposer.propose(seq, k)  -> ScheduledSeq.spec_token_ids
    runner.run():          logits at the last real token and every draft -> verify -> accepted + 1
    scheduler.update():    accepted drafts keep their KV; rejected ones are rolled back

Proposers register by name (`--speculative ngram|suffix`); how many drafts a step asks for is a
policy around them (`draft_length.py`: `--speculative-draft-length adaptive | fixed`).
"""

from __future__ import annotations

from hintkv.engine.spec.draft_length import DRAFT_LENGTHS, AdaptiveDraftLength
from hintkv.engine.spec.ngram import NgramProposer
from hintkv.engine.spec.proposer import Proposer
from hintkv.engine.spec.suffix import SuffixProposer

PROPOSERS: dict[str, type] = {"ngram": NgramProposer, "suffix": SuffixProposer}


def make_proposer(name: str, num_speculative_tokens: int, **kwargs) -> Proposer:
    """A proposer by name; `num_speculative_tokens` is the most drafts it gives per step."""
    try:
        cls = PROPOSERS[name]
    except KeyError:
        raise ValueError(f"speculative must be one of {sorted(PROPOSERS)}, not {name!r}") from None
    return cls(num_speculative_tokens, **kwargs)


def make_speculative(cfg) -> Proposer | None:
    """The proposer an `EngineConfig` asks for (None: no speculation)."""
    if cfg.speculative is None:
        return None
    kwargs = {"scope": cfg.speculative_scope} if cfg.speculative == "suffix" else {}
    proposer = make_proposer(cfg.speculative, cfg.num_speculative_tokens, **kwargs)
    if cfg.speculative_draft_length == "adaptive":
        return AdaptiveDraftLength(proposer, cfg.num_speculative_tokens)
    return proposer


__all__ = ["DRAFT_LENGTHS", "PROPOSERS", "AdaptiveDraftLength", "NgramProposer", "Proposer", "SuffixProposer", "make_proposer", "make_speculative"]
