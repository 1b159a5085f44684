"""`same-step` load timing under every admission policy the server offers (review_policy F5): a
small pool (preemptions, swaps), agents whose growing prompts come back from the host tier, and
prefixes stored there beforehand. Each step: no request scheduled twice, the scheduler's
invariants hold, and every running request's device KV is what its tokens give. The KV is a
stand-in for the model: each position's value is a hash of the tokens up to it, written by the
"forward" into the real device cache, so a block loaded to the wrong place, or computed twice
over a landed one, shows."""

from __future__ import annotations

import random

import pytest
import torch

from hintkv.cache.hashing import hash_blocks
from hintkv.engine.admission import live_admission_names
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.types import SamplingParams

from test_load_timing import BS, ROOT, _setup

LAYERS = 2  # _setup's device cache: 2 layers of [2, blocks, BS, 1, 2]


def _values(tokens: list[int]) -> list[float]:
    """The KV value at each position: a hash of the tokens up to it (exact in float32)."""
    out, h = [], 0
    for t in tokens:
        h = (h * 31 + t + 1) % 100_003
        out.append(float(h))
    return out


def _forward(io, scheduled) -> None:
    """Write each scheduled sequence's new positions into the device cache, as a forward would."""
    for s in scheduled:
        seq, start = s.seq, s.seq.num_computed_tokens
        vals = _values(seq.token_ids[:start + s.num_new_tokens])
        for p in range(start, start + s.num_new_tokens):
            block = seq.block_table[p // BS].block_id
            for kv in io.kv_caches:
                kv[:, block, p % BS] = vals[p]


def _check_kv(io, seqs) -> None:
    for seq in seqs:
        vals = _values(seq.token_ids[:seq.num_computed_tokens])
        for p, v in enumerate(vals):
            block = seq.block_table[p // BS].block_id
            got = {float(x) for kv in io.kv_caches for x in kv[:, block, p % BS].flatten()}
            assert got == {v}, f"{seq.request_id}: position {p} in block {block} holds {got}, not {v}"


def _store_prefix(stack, io, tokens: list[int]) -> None:
    vals = _values(tokens)
    hashes = hash_blocks(ROOT, tokens, BS)
    payloads = []
    for b in range(len(hashes)):
        p = torch.empty(io.layout.shape)
        for off in range(BS):
            p[:, :, off] = vals[b * BS + off]  # [layers, K/V, position, heads, dim]
        payloads.append(p)
    assert all(f.result() for f in stack.store(list(zip(hashes, payloads))))
    stack.flush()


def _run(admission: str, seed: int, agents: int = 6, turns_max: int = 30, new_max: int = 12,
         num_blocks: int = 16) -> int:
    """Drive the scheduler over agents' turns; returns how many loads computed in their step."""
    rng = random.Random(seed)
    sched, kv, io, stack = _setup("same-step", num_blocks=num_blocks, budget=12, admission=admission)
    shared = [[rng.randrange(1000, 2000) for _ in range(2 * BS)] for _ in range(2)]
    for prefix in shared:
        _store_prefix(stack, io, prefix)
    history = {f"g{j}": list(rng.choice(shared)) for j in range(agents)}  # each agent's context so far
    busy: dict[str, Sequence] = {}  # agent -> its request in flight
    turns, landed_in_step, step = 0, 0, 0
    while step < 400 and (turns < turns_max or busy):
        step += 1
        for agent, ctx in history.items():
            if agent not in busy and turns < turns_max and rng.random() < 0.3:
                ctx += [rng.randrange(2000, 3000) for _ in range(rng.randrange(1, new_max))]
                seq = Sequence(f"{agent}-{turns}", list(ctx), len(ctx),
                               SamplingParams(temperature=0, max_tokens=rng.randrange(1, 4)), ROOT)
                sched.add_request(seq)
                busy[agent], turns = seq, turns + 1
        waiting = {id(s) for s in sched.waiting}
        out = sched.schedule()
        ids = [s.seq.request_id for s in out.scheduled]
        assert len(ids) == len(set(ids)), f"{admission} seed {seed} step {step}: scheduled twice {ids}"
        landed_in_step += sum(id(s.seq) in waiting and s.seq.ttft.load_s > 0 for s in out.scheduled)
        kv.flush_write_downs()  # as LLMEngine.step: victims this pass reuses are written down first
        _forward(io, out.scheduled)
        toks = [(sum(s.seq.token_ids) % 97) + 3000 if s.samples else None for s in out.scheduled]
        sched.update_from_output(out, ModelRunnerOutput.from_tokens(toks))
        sched.check_integrity()
        _check_kv(io, [s for s in sched.running if s.status is SeqStatus.RUNNING])
        for agent, seq in list(busy.items()):
            if seq.status is SeqStatus.FINISHED:
                history[agent] = list(seq.token_ids)
                del busy[agent]
        if not out.scheduled and sched.loading:
            stack.flush()  # nothing to compute: let the copies land
    assert not busy, f"{admission} seed {seed}: {sorted(busy)} never finished"
    stack.close()
    return landed_in_step


@pytest.mark.parametrize("admission", live_admission_names())  # cache-aware-serial: offline only
def test_same_step_schedules_each_request_once_with_the_right_kv(admission):
    landed = sum(_run(admission, seed) for seed in (0, 1, 2))
    assert landed > 0  # the same-step path was taken
    # (with batching.land_new_loads appending a landed sequence after the prefills that yielded,
    # the pre-0a3f909 bug, prefill-first, prefill-fair and prefill-judged fail here: scheduled twice)
