"""The model runner: owns the KV tensors, turns a scheduled batch into tensors, runs the model.

This is the only engine file that touches tensors. KV per layer is one tensor
`[2, num_blocks, block_size, num_kv_heads, head_dim]`; attention reads it through block tables.
"""

from __future__ import annotations

import torch

from hintkv.engine.outputs import ModelRunnerOutput, ScheduledSeq
from hintkv.engine.sampler import sample
from hintkv.models.attention import AttentionMetadata
from hintkv.models.config import ModelConfig


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

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> ModelRunnerOutput:
        """Compute KV for every scheduled token; sample a token for each sequence whose KV this
        completes (the others, prefill chunks, get none)."""
        bs = self.block_size
        ids, pos, slots, tables = [], [], [], []
        qsl, ctx = [0], []
        sample_rows, params, gens = [], [], []
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
                params.append(seq.sampling)
                gens.append(seq.generator)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slots).to(dev),
            query_start_loc=qsl,
            context_lens=ctx,
            block_tables=tables,
            is_decode_only=all(s.num_new_tokens == 1 for s in batch),
        )
        hidden = self.model(torch.tensor(ids, dtype=torch.long, device=dev), torch.cat(pos).to(dev),
                            meta, self.kv_caches)
        tokens: list[int | None] = [None] * len(batch)
        if sample_rows:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows, device=dev)])
            sampled = iter(sample(logits, params, gens))
            for i, s in enumerate(batch):
                if s.samples:
                    tokens[i] = next(sampled)
        return ModelRunnerOutput.from_tokens(tokens)
