"""Speculative decoding through the real engine and the real SmolLM2: greedy output is identical
to decoding without drafts, rejected drafts leave no KV behind (no block past the sequence, every
committed hash names the tokens actually kept), and a later request that reuses the KV written
during speculation decodes as a fresh engine would."""

from __future__ import annotations

import functools

import pytest
import torch

from hintkv.cache.hashing import hash_blocks
from hintkv.cache.types import SessionRef
from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.loader import LoadedModel, load_model
from hintkv.models.presets import smollm2_tokenizer

BS = 16
CODE = '''def add_block(self, blocks, h):
    for b in blocks:
        if b.hash is None:
            self.pool.register(b, h)
    return blocks

def add_blocks(self, blocks, hashes):
    for b, h in zip(blocks, hashes):
        if b.hash is None:
            self.pool.register(b, h)
    return blocks
'''


@functools.cache
def _smollm2() -> LoadedModel:
    """SmolLM2 loaded once for this module's dozen engines (a load is ~13 s of CPU here); the
    weights are only read, each engine keeps its own KV cache."""
    return load_model(None, torch.float32, "cpu")


@pytest.fixture(scope="module", autouse=True)
def _let_go_of_the_model():
    yield
    _smollm2.cache_clear()


def engine(spec: str | None, k: int = 4) -> LLMEngine:
    return LLMEngine(EngineConfig(block_size=BS, kv_cache_tokens=4096, max_num_batched_tokens=256,
                                  speculative=spec, num_speculative_tokens=k, enforce_eager=True),
                     loaded=_smollm2())


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = smollm2_tokenizer()
    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    return [tok.encode(chat.format("Repeat this code exactly:\n" + CODE)),
            tok.encode(chat.format("Write the numbers from 1 to 30 separated by commas."))]


def check_kv_truth(e: LLMEngine) -> None:
    """Every running sequence: blocks cover its tokens and no more; committed hashes are those of
    the tokens it kept."""
    e.check_integrity()
    for seq in e.scheduler.running:
        assert len(seq.block_table) <= -(-seq.num_tokens // BS)
        n = seq.num_registered_blocks
        expect = hash_blocks(seq.root_hash, seq.token_ids[:n * BS], BS)
        assert seq.block_hashes[:n] == expect
        # a block's own hash, when it has one, is the hash of the tokens it holds
        assert all(b.hash in (None, h) for b, h in zip(seq.block_table, expect))


def run(e: LLMEngine, prompts: list[list[int]], max_tokens: int, session: SessionRef | None = None,
        sampling: dict | None = None) -> dict[str, list[int]]:
    for i, p in enumerate(prompts):
        params = SamplingParams(**(sampling or {"temperature": 0}), max_tokens=max_tokens, ignore_eos=True)
        e.add_request(GenerateRequest(f"r{i}", p, params, session=session))
    out: dict[str, list[int]] = {}
    while e.has_work():
        for o in e.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        check_kv_truth(e)
    return out


@pytest.fixture(scope="module")
def plain(prompts) -> dict[str, list[int]]:
    return run(engine(None), prompts, 24)


@pytest.mark.parametrize("spec,k", [("ngram", 4), ("suffix", 4), ("ngram", 15)])
def test_greedy_output_is_identical_and_drafts_are_accepted(spec, k, prompts, plain):
    """k=15: the adaptive draft length (the default) grows to 15 drafts in the copied code (16-row verifies)."""
    e = engine(spec, k)
    out = run(e, prompts, 24)
    assert out == plain
    s = e.scheduler
    assert s.num_draft_tokens > 0 and s.num_accepted_tokens > 0
    assert s.num_accepted_tokens <= s.num_draft_tokens
    assert e.kv.pool.num_in_use == 0  # every block went back


def test_kv_written_while_speculating_serves_a_later_request(prompts, plain):
    e = engine("ngram", k=6)
    first = run(e, prompts[:1], 24)["r0"]
    assert first == plain["r0"]
    follow = prompts[0] + first + prompts[1][:20]
    again = run(e, [follow], 8)["r0"]
    assert e.kv.prefix_hit_tokens >= (len(prompts[0]) + len(first)) // BS * BS - BS
    assert again == run(engine(None), [follow], 8)["r0"]


def record_draft_lengths(e) -> list[int]:
    """Wrap `e`'s proposer so the real one still runs; the list fills with each draft's length."""
    lengths: list[int] = []
    propose = e.scheduler.proposer.propose

    def recording(seq, n):
        draft = propose(seq, n)
        lengths.append(len(draft))
        return draft

    e.scheduler.proposer.propose = recording
    return lengths


@pytest.mark.parametrize("k", [4, 15])
def test_sampled_speculation_runs_within_limits(prompts, k):
    """k=15 (the shipped cap): rejection sampling verifies the adaptive lengths' longer drafts (7+)."""
    e = engine("suffix", k)
    lengths = record_draft_lengths(e)
    out = run(e, prompts[:1], 32, session=SessionRef("t", "s", ""),
              sampling={"temperature": 0.7, "top_p": 0.9, "seed": 3})
    assert all(len(v) == 32 for v in out.values())
    assert e.scheduler.num_draft_tokens > 0
    assert max(lengths) == min(k, 7) or max(lengths) > 7
    assert e.kv.pool.num_in_use == 0


def test_adaptive_drafts_of_15_verify_to_the_same_greedy_tokens(prompts):
    """The adaptive draft length reaches 15 drafts (a 16-row verify step) in copied code; the output
    stays that of decoding one token at a time."""
    e = engine("ngram", 15)
    lengths = record_draft_lengths(e)
    out = run(e, prompts[:1], 64)
    assert max(lengths) == 15
    assert out == run(engine(None), prompts[:1], 64)
    assert e.kv.pool.num_in_use == 0


@pytest.mark.parametrize("spec,k", [("ngram", 4), ("ngram", 15)])
def test_sampled_verification_of_a_point_mass_is_greedy(spec, k, prompts, plain):
    """top_p ~ 0 makes each row's distribution its top token: rejection sampling (the sampled path,
    not the greedy one) must then accept exactly the drafts greedy would, at k=15 too (drafts of 7+)."""
    e = engine(spec, k)
    out = run(e, prompts, 24, sampling={"temperature": 0.7, "top_p": 1e-9, "seed": 3})
    assert out == plain
    s = e.scheduler
    assert s.num_accepted_tokens > 0 and s.num_draft_tokens > s.num_accepted_tokens  # some rejected too
