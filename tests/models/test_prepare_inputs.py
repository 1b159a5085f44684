"""`ModelRunner.prepare_inputs` builds its tensors from int64 arrays (#11: per-sequence tensor ops were
0.35 ms of a batch-8 decode step): every field against the per-token definition, over blocks that are not
consecutive, chunks that start and end inside a block, decode rows and drafts."""

from __future__ import annotations

import pytest
import torch

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.model_runner import ModelRunner
from hintkv.engine.outputs import ScheduledSeq
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.models.loader import load_model

BS = 4


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    lm = load_model("dummy:tiny", torch.float32, "cpu")
    return ModelRunner(lm.model, lm.config, 64, BS, torch.float32, torch.device("cpu"))


def _expected(batch: list[ScheduledSeq]) -> dict[str, list]:
    ids, pos, slots, tables, qsl, ctx, rows = [], [], [], [], [0], [], []
    for s in batch:
        seq, c, n, k = s.seq, s.seq.num_computed_tokens, s.num_new_tokens, s.num_spec_tokens
        table = [b.block_id for b in seq.block_table]
        ids += seq.token_ids[c:c + n - k] + s.spec_token_ids
        pos += list(range(c, c + n))
        slots += [table[p // BS] * BS + p % BS for p in range(c, c + n)]
        tables.append(table)
        qsl.append(qsl[-1] + n)
        ctx.append(c + n)
        if s.samples:
            rows.append(qsl[-1] - 1 - k)
    return {"ids": ids, "pos": pos, "slots": slots, "tables": tables, "qsl": qsl, "ctx": ctx, "rows": rows}


def test_prepare_inputs_matches_the_per_token_definition(runner: ModelRunner) -> None:
    kv = KVCacheManager(64, BS, make_policy("lru"))
    root = namespace_root("dummy:tiny", "torch.float32", BS, None)
    seqs = {name: Sequence(name, list(range(100 * i, 100 * i + 30)), 30, SamplingParams(temperature=0), root)
            for i, name in enumerate("abc")}
    for upto in (3, 9, 14, 23, 30):  # blocks taken in turns: no table is one run of block ids
        for seq in seqs.values():
            kv.append(seq, upto - seq.num_computed_tokens)
            seq.num_computed_tokens = upto
    for seq in seqs.values():
        table = [b.block_id for b in seq.block_table]
        assert len(table) == 8 and table != list(range(table[0], table[0] + 8))
    a, b, c = seqs["a"], seqs["b"], seqs["c"]
    a.num_computed_tokens = 2  # a chunk from inside block 0 to inside block 4 that does not sample
    b.num_computed_tokens = 29  # a decode row in the last block
    del c.token_ids[27:]  # a real token and 3 drafts across a block edge (positions 26..29)
    c.num_computed_tokens = 26
    batch = [ScheduledSeq(a, 17), ScheduledSeq(b, 1), ScheduledSeq(c, 4, [7, 8, 9])]
    inputs = runner.prepare_inputs(batch)
    want = _expected(batch)
    assert inputs.input_ids.dtype == inputs.positions.dtype == inputs.meta.slot_mapping.dtype == torch.long
    assert inputs.input_ids.tolist() == want["ids"]
    assert inputs.positions.tolist() == want["pos"]
    assert inputs.meta.slot_mapping.tolist() == want["slots"]
    assert [t.tolist() for t in inputs.meta.block_tables] == want["tables"]
    assert all(t.dtype == torch.long for t in inputs.meta.block_tables)
    assert inputs.meta.query_start_loc == want["qsl"]
    assert inputs.meta.context_lens == want["ctx"]
    assert inputs.sample_rows == want["rows"] == [17, 18]
    assert not inputs.meta.is_decode_only
    inputs.meta.check()


def test_prepare_inputs_decode_batch(runner: ModelRunner) -> None:
    kv = KVCacheManager(64, BS, make_policy("lru"))
    root = namespace_root("dummy:tiny", "torch.float32", BS, None)
    batch = []
    for i in range(8):
        seq = Sequence(str(i), list(range(10 + i)), 10, SamplingParams(temperature=0), root)
        kv.append(seq, 10 + i)
        seq.num_computed_tokens = 9 + i
        batch.append(ScheduledSeq(seq, 1))
    inputs = runner.prepare_inputs(batch)
    want = _expected(batch)
    assert inputs.meta.slot_mapping.tolist() == want["slots"]
    assert inputs.positions.tolist() == want["pos"] == [9 + i for i in range(8)]
    assert inputs.input_ids.tolist() == want["ids"]
    assert inputs.sample_rows == list(range(8))
    assert inputs.meta.is_decode_only
