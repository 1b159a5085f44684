"""Rotary position embeddings, Hugging Face "rotate-half" convention, with rope_scaling variants.

The cos/sin table is precomputed in float32 (as transformers does) and cast to the model dtype;
it grows on demand when a position beyond it shows up. `apply_` rotates in place (q and k are
views into the fused qkv buffer), so no rotated copy and no `cat` is made.
"""

from __future__ import annotations

import math

import torch

from hintkv.models.config import ModelConfig

_INITIAL_TABLE_LEN = 8192  # llama3 advertises 131072 positions; build the table lazily past this


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim/2] float32 inverse frequencies after rope_scaling."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = cfg.rope_scaling
    if rs is None:
        return inv_freq
    factor = float(rs["factor"])
    if rs["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the middle interpolated.
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_len = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Owns the cos/sin table; `apply_` rotates q and k rows in place of HF's apply_rotary_pos_emb."""

    __slots__ = ("cos", "dtype", "inv_freq", "sin")

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        self.inv_freq = inv_frequencies(cfg).to(device)
        self.dtype = dtype
        self._build(min(cfg.max_position_embeddings, _INITIAL_TABLE_LEN))

    def _build(self, length: int) -> None:
        # half width: rotate-half uses the same angle for element i and i + D/2
        pos = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(pos, self.inv_freq)
        self.cos = freqs.cos().to(self.dtype)
        self.sin = freqs.sin().to(self.dtype)

    def ensure(self, length: int) -> None:
        """Make the table cover positions 0 .. length-1 (a CUDA graph cannot grow it: `cos_sin(grow=False)`)."""
        if length > self.cos.shape[0]:
            self._build(max(length, 2 * self.cos.shape[0]))

    def cos_sin(self, positions: torch.Tensor, grow: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows [T, 1, D/2] for the given positions (broadcast over heads); `grow` reads
        the largest position back (a device sync) to extend the table first."""
        if grow:
            self.ensure(int(positions.max()) + 1 if positions.numel() else 0)
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    @staticmethod
    def apply_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D], rotated in place to x*cos + rotate_half(x)*sin; returns x.

        With halves (x1, x2): x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin.
        """
        x1, x2 = x.chunk(2, dim=-1)
        x1_sin = x1 * sin
        x1.mul_(cos).addcmul_(x2, sin, value=-1.0)
        x2.mul_(cos).add_(x1_sin)
        return x
