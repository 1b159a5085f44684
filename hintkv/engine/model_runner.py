"""The model runner: owns the KV tensors, turns a scheduled batch into tensors, runs the model.

This is the only engine file that touches tensors. KV per layer is one tensor
`[2, num_blocks, block_size, num_kv_heads, head_dim]`; attention reads it through block tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hintkv.engine.outputs import ModelRunnerOutput, ScheduledSeq
from hintkv.engine.sampler import sample
from hintkv.models.attention import AttentionMetadata
from hintkv.models.config import ModelConfig


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_batched_tokens]
    positions: torch.Tensor  # [num_batched_tokens]
    meta: AttentionMetadata
    sample_rows: list[int]  # the row of each sampling sequence's last new token, in batch order


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return cfg.num_hidden_layers * 2 * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = block_size
        self.device = device
        shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=device)
                          for _ in range(cfg.num_hidden_layers)]

    def prepare_inputs(self, batch: list[ScheduledSeq]) -> StepInputs:
        """The engine's one way from scheduled sequences to model inputs: each sequence's new
        tokens after its computed ones, their positions and KV slots, its block table."""
        bs = self.block_size
        ids, pos, slots, tables = [], [], [], []
        qsl, ctx, sample_rows = [0], [], []
        for s in batch:
            seq, c, n = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
            ids.extend(seq.token_ids[c:c + n])
            p = torch.arange(c, c + n)
            table = torch.tensor([b.block_id for b in seq.block_table], dtype=torch.long)
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            tables.append(table.to(self.device))
            qsl.append(qsl[-1] + n)
            ctx.append(c + n)
            if s.samples:
                sample_rows.append(qsl[-1] - 1)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slots).to(dev),
            query_start_loc=qsl,
            context_lens=ctx,
            block_tables=tables,
            is_decode_only=all(s.num_new_tokens == 1 for s in batch),
        )
        return StepInputs(torch.tensor(ids, dtype=torch.long, device=dev), torch.cat(pos).to(dev),
                          meta, sample_rows)

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Write the step's K/V into the paged cache; hidden states of every new token."""
        return self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> ModelRunnerOutput:
        """Compute KV for every scheduled token; sample a token for each sequence whose KV this
        completes (the others, prefill chunks, get none)."""
        inputs = self.prepare_inputs(batch)
        hidden = self.forward(inputs)
        tokens: list[int | None] = [None] * len(batch)
        if inputs.sample_rows:
            sampling = [s.seq for s in batch if s.samples]
            rows = torch.tensor(inputs.sample_rows, device=self.device)
            logits = self.model.compute_logits(hidden[rows])
            sampled = iter(sample(logits, [q.sampling for q in sampling], [q.generator for q in sampling]))
            for i, s in enumerate(batch):
                if s.samples:
                    tokens[i] = next(sampled)
        return ModelRunnerOutput.from_tokens(tokens)
