"""The model runner: owns the KV tensors, turns a scheduled batch into tensors, runs the model.

This is the only engine file that touches tensors. KV per layer is one tensor
`[2, num_blocks, block_size, num_kv_heads, head_dim]` (with `--kv-cache-dtype int8 | fp8`, rows of
head_dim + 4 bytes that carry their scale: `models/kv_quant.py`); attention reads it through block
tables.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from hintkv.engine.logits_shaping import TokenTally, needs_tally, shape_logits
from hintkv.engine.outputs import ModelRunnerOutput, ScheduledSeq
from hintkv.engine.sampler import sample
from hintkv.engine.spec.verify import verify
from hintkv.models.attention import AttentionMetadata, suffix_rows
from hintkv.models.config import ModelConfig
from hintkv.models.cuda_graphs import DecodeGraphs
from hintkv.models.host_memory import keep_freed_memory
from hintkv.models.kv_quant import cache_row
from hintkv.models.llama import keeps_rows


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_batched_tokens]
    positions: torch.Tensor  # [num_batched_tokens]
    meta: AttentionMetadata
    sample_rows: list[int]  # the row of each sampling sequence's last real token, in batch order
    # With drafts, that row and the rows of its k drafts: [row, row + k] (verified together)


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """Bytes of one block, all layers, K and V; `kv_cache_dtype` int8 / fp8 rows carry their scale."""
    row, storage = cache_row(cfg.head_dim, dtype, kv_cache_dtype)
    return cfg.num_hidden_layers * 2 * block_size * cfg.num_key_value_heads * row * storage.itemsize


def _long_tensor(values: array, device: torch.device) -> torch.Tensor:
    """An int64 array as a long tensor on `device` (on the CPU it shares the array's memory, which
    it keeps alive: 3x faster than torch.tensor of a list)."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(values, dtype=torch.long).to(device)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto",
                 cuda_graphs_max_len: int | None = None) -> None:
        """`cuda_graphs_max_len`: capture decode CUDA graphs for contexts up to that many tokens
        (`models/cuda_graphs.py`; one scratch block past `num_blocks` takes the pad rows' KV)."""
        self.model = model
        # the last layer runs past its K/V only for the rows sampled (LlamaForCausalLM.forward's keep_last);
        # HINTKV_LAST_LAYER_ROWS=all runs every row (A/B, bisecting)
        self.model_keeps_rows = keeps_rows()
        self.cfg = cfg
        self.block_size = block_size
        self.device = device
        self.eos_token_ids: frozenset[int] = frozenset()  # what min_tokens masks (the engine sets it)
        row, storage = cache_row(cfg.head_dim, dtype, kv_cache_dtype)  # int8 / fp8: kv_quant.py
        graphs = cuda_graphs_max_len is not None
        shape = (2, num_blocks + int(graphs), block_size, cfg.num_key_value_heads, row)
        self.kv_caches = [torch.zeros(shape, dtype=storage, device=device)
                          for _ in range(cfg.num_hidden_layers)]
        if torch.device(device).type == "cpu":  # `hintkv serve` set it first thing; for engines built in process
            keep_freed_memory()
        self.graphs: DecodeGraphs | None = None
        if graphs:
            self.graphs = DecodeGraphs(model, self.kv_caches, block_size, -(-cuda_graphs_max_len // block_size),
                                       pad_block=num_blocks)
            self.graphs.capture()

    def prepare_inputs(self, batch: list[ScheduledSeq]) -> StepInputs:
        """The engine's one way from scheduled sequences to model inputs: each sequence's new
        tokens after its computed ones, their positions and KV slots, its block table.

        Built as int64 arrays, one tensor each at the end (`_long_tensor`): per-sequence tensor ops
        cost ~50 us a sequence, 0.35 ms of a batch-8 decode step's CPU on the server's threads (#11)."""
        bs, dev = self.block_size, self.device
        ids, pos, slots = array("q"), array("q"), array("q")
        tables: list[torch.Tensor] = []
        qsl, ctx, sample_rows = [0], [], []
        for s in batch:
            seq, n, drafts = s.seq, s.num_new_tokens, s.spec_token_ids
            c, k = seq.num_computed_tokens, len(drafts)
            end = c + n
            ids.extend(seq.token_ids[c:end - k])
            ids.extend(drafts)
            pos.extend(range(c, end))
            block_ids = array("q", [b.block_id for b in seq.block_table])
            p = c
            while p < end:  # each block's share of the new tokens: a run of consecutive slots
                b, off = divmod(p, bs)
                run = min(bs - off, end - p)
                first = block_ids[b] * bs + off
                slots.extend(range(first, first + run))
                p += run
            tables.append(_long_tensor(block_ids, dev))
            qsl.append(qsl[-1] + n)
            ctx.append(end)
            if s.samples:
                sample_rows.append(qsl[-1] - 1 - k)
        meta = AttentionMetadata(
            slot_mapping=_long_tensor(slots, dev),
            query_start_loc=qsl,
            context_lens=ctx,
            block_tables=tables,
            is_decode_only=all(s.num_new_tokens == 1 for s in batch),
        )
        return StepInputs(_long_tensor(ids, dev), _long_tensor(pos, dev), meta, sample_rows)

    @torch.inference_mode()
    def forward(self, inputs: StepInputs, keep_last: list[int] | None = None) -> torch.Tensor:
        """Write the step's K/V into the paged cache; hidden states of every new token, or of the last
        keep_last[i] tokens of each sequence i (`LlamaForCausalLM.forward`) (a decode step that fits a
        captured bucket replays its CUDA graph)."""
        if self.graphs is not None:
            out = self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
            if out is not None:
                return out if keep_last is None else out.index_select(0, suffix_rows(inputs.meta, keep_last)[0])
        if keep_last is None:
            return self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        return self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches, keep_last=keep_last)

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> ModelRunnerOutput:
        """Compute KV for every scheduled token; sample a token for each sequence whose KV this
        completes (the others, prefill chunks, get none); a sequence with drafts gets its
        accepted drafts and one more token (`spec/verify.py`)."""
        inputs = self.prepare_inputs(batch)
        # the rows whose logits are read: each sampling sequence's last 1 + k (its drafts), its step's last rows
        keep_last = [s.num_spec_tokens + 1 if s.samples else 0 for s in batch]
        hidden_rows = self.forward(inputs, keep_last if self.model_keeps_rows else None)
        out: list[list[int]] = [[] for _ in batch]
        if not inputs.sample_rows:
            return ModelRunnerOutput(out)
        sampling = [(i, s) for i, s in enumerate(batch) if s.samples]
        rows: list[int] = []  # every logit row needed: one per sequence, k + 1 with drafts
        for (_, s), r in zip(sampling, inputs.sample_rows):
            rows.extend(range(r, r + s.num_spec_tokens + 1))
        if not self.model_keeps_rows:
            hidden_rows = hidden_rows[torch.tensor(rows, device=self.device)]
        if len(rows) == len(sampling) and all(s.seq.sampling.greedy and not s.seq.sampling.shapes_logits
                                              for _, s in sampling):
            tokens = self.model.greedy_tokens(hidden_rows)  # no drafts, all greedy: argmax without logits
            if tokens is not None:
                for (i, _), tok in zip(sampling, tokens):
                    out[i] = [tok]
                return ModelRunnerOutput(out)
        logits = self.model.compute_logits(hidden_rows)
        plain = [j for j, (_, s) in enumerate(sampling) if not s.num_spec_tokens]
        first = [0]  # the first logit row of each sampling sequence
        for _, s in sampling:
            first.append(first[-1] + s.num_spec_tokens + 1)
        if plain:
            seqs = [sampling[j][1].seq for j in plain]
            rows_plain = [first[j] for j in plain]  # every row when no sequence has drafts: no copy
            plain_logits = logits if rows_plain == list(range(logits.shape[0])) else logits[rows_plain]
            params = [q.sampling for q in seqs]
            for q in seqs:
                if q.token_tally is None and needs_tally(q.sampling):
                    q.token_tally = TokenTally()
            plain_logits = shape_logits(plain_logits, params,
                                        [(q.token_ids, q.num_prompt_tokens, q.token_tally) for q in seqs],
                                        self.eos_token_ids)
            picked = sample(plain_logits, params, [q.generator for q in seqs])
            for j, tok in zip(plain, picked):
                out[sampling[j][0]] = [tok]
        for j, (i, s) in enumerate(sampling):
            if s.num_spec_tokens:
                out[i] = verify(logits[first[j]:first[j + 1]], s.spec_token_ids, s.seq.sampling,
                                s.seq.generator)
        return ModelRunnerOutput(out)
