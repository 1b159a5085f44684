"""CUDA graphs for decode steps: capture the model's decode forward once per shape bucket, replay it.

On a GPU a small decode step is launch-bound: the first H200 run measured 20.9 tok/s at batch 1 on
an 8B model in bf16, ~48 ms per token against ~3.3 ms to read the weights, i.e. per-operator launch
and Python overhead. A CUDA graph replays the whole step's kernels with one launch (5.5 ms a token).

Shapes are static inside a graph, so a decode step is padded to a bucket:

    batch buckets    BATCH_BUCKETS = 1, 2, 4, 8, 16, 32 sequences   (`batch_bucket`)
    context buckets  16, 32, 64, ... blocks up to the model's max      (`ctx_bucket`)
                     (a bucket of B sequences x L tokens is captured only while B * L <= MAX_GRAPH_TOKENS)

Each (batch, context) bucket owns a `StaticDecodeInputs`: input ids, positions, KV slots [B], a
padded block table [B, NB] and context lengths [B]. Attention reads those through
`attention.decode_static` (every shape from the buffers' shapes, none from their values). Pad
rows write their K/V into one scratch block the model runner reserves past the allocator's blocks
(`pad_block`) and attend over it alone, so they never touch a real sequence's KV.
Graphs are captured after two eager warm-up runs per bucket, largest first, sharing one memory
pool. A step that fits no bucket (prefill, verify, a batch or context too large) runs eagerly.
`--enforce-eager` turns graphs off (`EngineConfig.wants_cuda_graphs`).

Status: the bucket choice, padding and buffer layout are tested on CPU (`tests/models/
test_cuda_graphs.py`: the static decode path gives the eager path's hidden states); capture and
replay are tested where CUDA exists: on the lent H200 (twenty-ninth session) graphs gave the eager
path's greedy tokens, and decode on dummy:llama3-8b (bf16) read 183 tok/s at batch 1 and 1,018 at 8,
against 50.8 and 291 without graphs (`scripts/gpu_check.sh`, variant no-graphs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from hintkv.models.attention import AttentionMetadata

log = logging.getLogger("hintkv.cuda_graphs")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
MIN_CTX_BLOCKS = 16
MAX_GRAPH_TOKENS = 65536  # B * padded context of one bucket: attention gathers that much KV per layer


def batch_bucket(n: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int | None:
    """The smallest bucket holding `n` sequences (None: more than the largest)."""
    return next((b for b in buckets if b >= n), None) if n > 0 else None


def ctx_buckets(max_blocks: int) -> tuple[int, ...]:
    """Context buckets in blocks: 16, 32, 64, ... and `max_blocks` itself as the last."""
    out, nb = [], MIN_CTX_BLOCKS
    while nb < max_blocks:
        out.append(nb)
        nb *= 2
    out.append(max_blocks)
    return tuple(out)


def ctx_bucket(blocks: int, max_blocks: int) -> int | None:
    """The smallest context bucket covering `blocks` blocks (None: more than `max_blocks`)."""
    return next((nb for nb in ctx_buckets(max_blocks) if nb >= blocks), None)


@dataclass(slots=True)
class StaticDecodeInputs:
    """The fixed buffers one captured graph reads; `fill` copies a step into them, padded."""

    input_ids: torch.Tensor  # [B] long
    positions: torch.Tensor  # [B] long
    slot_mapping: torch.Tensor  # [B] long
    table: torch.Tensor  # [B, NB] long
    lens: torch.Tensor  # [B] long

    @classmethod
    def alloc(cls, batch: int, blocks: int, device: torch.device | str) -> StaticDecodeInputs:
        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.long, device=device)
        return cls(z(batch), z(batch), z(batch), z(batch, blocks), z(batch))

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
             block_tables: list[torch.Tensor], context_lens: list[int], pad_block: int, block_size: int) -> None:
        """Copy n <= B decode rows in; rows n.. become pads (token 0 at position 0, writing and
        reading only `pad_block`)."""
        n, nb = len(context_lens), self.table.shape[1]
        if n > self.batch or any(-(-c // block_size) > nb for c in context_lens):
            raise ValueError(f"{n} sequences do not fit a ({self.batch}, {nb}) bucket")
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        self.input_ids[n:] = 0
        self.positions[n:] = 0
        self.slot_mapping[n:] = pad_block * block_size
        self.table.fill_(pad_block)
        if n:
            rows = pad_sequence([t[:nb].to(self.table.device) for t in block_tables], batch_first=True,
                                padding_value=pad_block)
            self.table[:n, :rows.shape[1]].copy_(rows)
            self.lens[:n].copy_(torch.tensor(context_lens, dtype=torch.long))
        self.lens[n:] = 1

    def meta(self) -> AttentionMetadata:
        """Metadata whose attention reads only these buffers (`AttentionMetadata.static`)."""
        b = self.batch
        return AttentionMetadata(slot_mapping=self.slot_mapping, query_start_loc=list(range(b + 1)),
                                 context_lens=[1] * b, block_tables=[], is_decode_only=True,
                                 static=(self.table, self.lens))


class DecodeGraphs:
    """One captured decode graph per (batch, context) bucket; `run` replays the right one."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 max_blocks: int, pad_block: int, batch_buckets: tuple[int, ...] = BATCH_BUCKETS) -> None:
        self.model, self.kv_caches = model, kv_caches
        self.block_size, self.max_blocks, self.pad_block = block_size, max_blocks, pad_block
        self.batch_buckets = batch_buckets
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, StaticDecodeInputs, torch.Tensor]] = {}
        self.capture_s = 0.0

    def buckets(self) -> list[tuple[int, int]]:
        """Every (batch, context blocks) bucket captured, largest first."""
        return sorted(((b, nb) for b in self.batch_buckets for nb in ctx_buckets(self.max_blocks)
                       if b * nb * self.block_size <= MAX_GRAPH_TOKENS), reverse=True)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every bucket (CUDA only), sharing one memory pool."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        device = self.kv_caches[0].device
        stream = torch.cuda.Stream(device)
        self.model.rotary.ensure(self.max_blocks * self.block_size)  # graphs cannot grow the RoPE table
        for b, nb in self.buckets():
            inputs = StaticDecodeInputs.alloc(b, nb, device)
            inputs.fill(inputs.input_ids[:0], inputs.positions[:0], inputs.slot_mapping[:0], [], [],
                        self.pad_block, self.block_size)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: lazy inits and allocator state before capture
                    self._forward(inputs)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(inputs)
            self.graphs[(b, nb)] = (graph, inputs, out)
        torch.cuda.synchronize(device)
        self.capture_s = time.perf_counter() - t0
        log.info("captured %d decode CUDA graphs in %.1f s", len(self.graphs), self.capture_s)

    def _forward(self, inputs: StaticDecodeInputs) -> torch.Tensor:
        return self.model(inputs.input_ids, inputs.positions, inputs.meta(), self.kv_caches)

    def pick(self, context_lens: list[int]) -> tuple[int, int] | None:
        """The captured bucket for a decode step of these context lengths (None: run eagerly)."""
        b = batch_bucket(len(context_lens), self.batch_buckets)
        nb = ctx_bucket(-(-max(context_lens) // self.block_size), self.max_blocks) if context_lens else None
        return (b, nb) if b is not None and nb is not None and (b, nb) in self.graphs else None

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """Hidden states [n, hidden] of a decode step by graph replay; None when no bucket fits."""
        if not meta.is_decode_only:
            return None
        key = self.pick(meta.context_lens)
        if key is None:
            return None
        graph, inputs, out = self.graphs[key]
        inputs.fill(input_ids, positions, meta.slot_mapping, meta.block_tables, meta.context_lens,
                    self.pad_block, self.block_size)
        graph.replay()
        return out[: len(meta.context_lens)]
