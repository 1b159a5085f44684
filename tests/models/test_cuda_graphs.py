"""Decode CUDA graphs (models/cuda_graphs.py): what a CPU can check — bucket choice, the padded
buffer layout, and that the static (graph-capturable) decode path gives the eager path's attention
and hidden states — plus capture / replay on CUDA (skipped without it: unverified until a GPU runs it)."""

from __future__ import annotations

import pytest
import torch
from paged_case import PagedCase

from hintkv.config import EngineConfig
from hintkv.models.attention import AttentionMetadata, decode_static
from hintkv.models.cuda_graphs import (
    BATCH_BUCKETS,
    MAX_GRAPH_TOKENS,
    DecodeGraphs,
    StaticDecodeInputs,
    batch_bucket,
    ctx_bucket,
    ctx_buckets,
)
from hintkv.models.loader import load_model


def test_bucket_choice():
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 32)] == [1, 2, 4, 8, 8, 16, 32]
    assert batch_bucket(0) is None and batch_bucket(33) is None
    assert ctx_buckets(100) == (16, 32, 64, 100)
    assert ctx_buckets(16) == (16,) and ctx_buckets(10) == (10,)
    assert [ctx_bucket(b, 100) for b in (1, 16, 17, 64, 65, 100)] == [16, 16, 32, 64, 100, 100]
    assert ctx_bucket(101, 100) is None


def test_buckets_are_bounded_and_largest_first():
    g = DecodeGraphs(torch.nn.Identity(), [torch.zeros(2, 5, 16, 1, 4)], 16, max_blocks=2048, pad_block=4)
    keys = g.buckets()
    assert keys == sorted(keys, reverse=True)
    assert all(b * nb * 16 <= MAX_GRAPH_TOKENS for b, nb in keys)
    assert (1, 2048) in keys and (32, 128) in keys and (32, 256) not in keys
    assert {b for b, _ in keys} == set(BATCH_BUCKETS)
    assert g.pick([5, 40]) is None  # nothing captured: the step runs eagerly


def test_fill_pads_rows_onto_the_scratch_block():
    inp = StaticDecodeInputs.alloc(4, 8, "cpu")
    inp.fill(torch.tensor([11, 12]), torch.tensor([20, 3]), torch.tensor([41, 70]),
             [torch.tensor([2, 1]), torch.tensor([4, 5, 6, 7, 0, 0, 0, 0, 3])], [21, 4], pad_block=9, block_size=16)
    assert inp.input_ids.tolist() == [11, 12, 0, 0] and inp.positions.tolist() == [20, 3, 0, 0]
    assert inp.slot_mapping.tolist() == [41, 70, 9 * 16, 9 * 16]
    assert inp.table.tolist() == [[2, 1] + [9] * 6, [4, 5, 6, 7, 0, 0, 0, 0], [9] * 8, [9] * 8]
    assert inp.lens.tolist() == [21, 4, 1, 1]
    meta = inp.meta()
    assert meta.static is not None and meta.is_decode_only and meta.num_seqs == 4
    with pytest.raises(ValueError, match="bucket"):
        inp.fill(torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                 [torch.tensor([0])] * 5, [1] * 5, pad_block=9, block_size=16)
    with pytest.raises(ValueError, match="bucket"):
        inp.fill(torch.tensor([1]), torch.tensor([1]), torch.tensor([1]), [torch.arange(9)], [16 * 8 + 1], 9, 16)


def test_static_attention_matches_the_eager_decode_path():
    case = PagedCase.build([(1, 9), (1, 30), (1, 17)], seed=3, d=8, nblocks=24)
    cache = torch.zeros(2, 25, 4, 2, 8)  # block 24: the scratch block
    case.fill(cache)
    eager = case.attend(cache.clone())
    inp = StaticDecodeInputs.alloc(4, 16, "cpu")
    inp.fill(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), torch.tensor(case.slots),
             case.tables, [c for _, c in case.steps], pad_block=24, block_size=4)
    from hintkv.models.attention import write_kv

    q = torch.cat(case.qs + [torch.zeros(1, 6, 8)])
    k, v = torch.cat(case.ks + [torch.zeros(1, 2, 8)]), torch.cat(case.vs + [torch.zeros(1, 2, 8)])
    write_kv(k, v, cache, inp.slot_mapping)
    out = decode_static(q, cache, inp.table, inp.lens, 8 ** -0.5)
    torch.testing.assert_close(out[:3], eager, rtol=1e-5, atol=1e-5)


def _decode_meta(tables: list[torch.Tensor], lens: list[int], bs: int) -> AttentionMetadata:
    slots = torch.tensor([int(t[(n - 1) // bs]) * bs + (n - 1) % bs for t, n in zip(tables, lens)])
    return AttentionMetadata(slot_mapping=slots, query_start_loc=list(range(len(lens) + 1)), context_lens=lens,
                             block_tables=tables, is_decode_only=True)


def _prefill(model, kv, ids: list[int], table: torch.Tensor, bs: int) -> None:
    pos = torch.arange(len(ids))
    meta = AttentionMetadata(slot_mapping=table[pos // bs] * bs + pos % bs, query_start_loc=[0, len(ids)],
                             context_lens=[len(ids)], block_tables=[table], is_decode_only=False)
    model(torch.tensor(ids), pos, meta, kv)


def test_static_model_step_matches_the_eager_step():
    """The whole decode forward through the graph buffers (what a CUDA graph captures), on CPU:
    the same hidden states as the eager decode step, pad rows included in the batch."""
    lm = load_model("dummy:tiny", torch.float32, "cpu")
    cfg, bs, nblocks = lm.config, 16, 12
    kv = [torch.zeros(2, nblocks + 1, bs, cfg.num_key_value_heads, cfg.head_dim) for _ in range(cfg.num_hidden_layers)]
    tables = [torch.tensor([3, 7, 1]), torch.tensor([0, 5])]
    prompts = [list(range(100, 140)), list(range(300, 317))]
    for ids, table in zip(prompts, tables):
        _prefill(lm.model, kv, ids, table, bs)
    lens = [len(p) + 1 for p in prompts]
    ids, pos = torch.tensor([55, 66]), torch.tensor([n - 1 for n in lens])
    meta = _decode_meta(tables, lens, bs)
    eager = lm.model(ids, pos, meta, [c.clone() for c in kv])
    inp = StaticDecodeInputs.alloc(4, 4, "cpu")
    inp.fill(ids, pos, meta.slot_mapping, tables, lens, pad_block=nblocks, block_size=bs)
    static = lm.model(inp.input_ids, inp.positions, inp.meta(), kv)
    torch.testing.assert_close(static[:2], eager, rtol=1e-4, atol=1e-4)


def test_enforce_eager_turns_graphs_off():
    assert EngineConfig().wants_cuda_graphs("cuda")
    assert not EngineConfig(enforce_eager=True).wants_cuda_graphs("cuda")
    assert not EngineConfig().wants_cuda_graphs("cpu")
    assert not EngineConfig(cuda_graphs="off").wants_cuda_graphs("cuda")
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(cuda_graphs="sometimes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_decode_gives_the_eager_tokens():
    """Captured decode graphs replay to the same greedy tokens as eager decode (dummy:tiny, 2 sequences)."""
    from hintkv.engine.llm_engine import LLMEngine
    from hintkv.engine.types import GenerateRequest, SamplingParams

    outs = {}
    for eager in (True, False):
        e = LLMEngine(EngineConfig(model="dummy:tiny", device="cuda", dtype="float32", enforce_eager=eager,
                                   kv_cache_tokens=4096, max_model_len=1024))
        assert (e.runner.graphs is None) == eager
        for i, n in enumerate((37, 90)):
            e.add_request(GenerateRequest(f"r{i}", list(range(200 + i, 200 + i + n)),
                                          SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)))
        got: dict[str, list[int]] = {}
        while e.has_work():
            for o in e.step():
                got.setdefault(o.request_id, []).extend(o.new_token_ids)
        outs[eager] = got
        e.close()
    assert outs[True] == outs[False] and all(len(v) == 24 for v in outs[True].values())
