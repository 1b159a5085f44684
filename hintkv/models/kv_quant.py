"""Quantised KV cache formats (`--kv-cache-dtype int8 | fp8`): each row carries its own scale.

A quantised cache keeps, per (token, KV head), the head_dim values in one byte each followed by
their float32 scale in 4 more bytes:

    kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim + 4]    (int8, or uint8 for fp8)
    row:      | v[0] .. v[head_dim - 1]  (1 byte each) | scale (float32, 4 bytes) |
    value  =  v[i] * scale                 (scale = max |x| of the row / 127 for int8, / 448 for fp8)

fp8 values are float8_e4m3fn bytes kept in a uint8 tensor: torch 2.13 on CPU casts to and from
float8_e4m3fn but has no index_copy_ / index_select for it, which the cache and the tiers need.

So a block's scales live inside the block's own bytes and travel with it through every tier
unchanged: the tiers' `BlockLayout` sees a row of head_dim + 4 and the storage dtype, and its
fingerprint differs from the float cache's, so a block written in one format is a miss in another
(the disk and pool headers carry the fingerprint), never wrong KV.

Why a scale per token and head rather than per block: tokens are written one step at a time, so a
block-wide scale would be fixed before the block's later tokens are seen (clipping them) or force
re-quantising the whole block on every append. The scale costs 4 of 68 bytes per row at
head_dim 64: 3.76x the blocks of a float32 cache, 1.88x those of a bfloat16 / float16 one.
Attention dequantises what it reads (`attention.py`); the step's own fresh K/V of a cold prefill
are used unquantised, like vLLM's quantised caches do.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # one float32 per row
# name -> (storage dtype, largest magnitude the values represent)
FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "int8": (torch.int8, 127.0),
    "fp8": (torch.uint8, 448.0),  # float8_e4m3fn bytes
}
CHOICES = ("auto", *FORMATS)  # auto: the model's dtype, unquantised
_QUANTISED = {dt for dt, _ in FORMATS.values()}


def check_name(name: str) -> None:
    if name not in CHOICES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(CHOICES)}, not {name!r}")


def cache_row(head_dim: int, model_dtype: torch.dtype, name: str) -> tuple[int, torch.dtype]:
    """(last dimension, dtype) of the KV cache tensors for format `name`."""
    check_name(name)
    if name == "auto":
        return head_dim, model_dtype
    return head_dim + SCALE_BYTES, FORMATS[name][0]


def is_quantised(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype in _QUANTISED


def _qmax(dtype: torch.dtype) -> float:
    return 127.0 if dtype == torch.int8 else 448.0


def _values(packed: torch.Tensor) -> torch.Tensor:
    """The value bytes of packed rows, as the dtype they were written in."""
    d = packed.shape[-1] - SCALE_BYTES
    vals = packed[..., :d]
    return vals if packed.dtype == torch.int8 else vals.view(torch.float8_e4m3fn)


def quantise(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D] float -> [..., D + 4] packed rows of `dtype` (values, then the row's scale)."""
    d = x.shape[-1]
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True).clamp_min(1e-12) / _qmax(dtype)
    q = xf / scale
    if dtype == torch.int8:
        q = q.round_().clamp_(-127, 127).to(torch.int8)
    else:
        q = q.clamp_(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    out = torch.empty((*x.shape[:-1], d + SCALE_BYTES), dtype=dtype, device=x.device)
    out[..., :d] = q
    out[..., d:].view(torch.float32).copy_(scale)
    return out


def dequantise(packed: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] packed rows -> [..., D] of `out_dtype`."""
    d = packed.shape[-1] - SCALE_BYTES
    if packed.stride(-1) != 1:
        packed = packed.contiguous()
    scale = packed[..., d:].view(torch.float32)
    return (_values(packed).to(torch.float32) * scale).to(out_dtype)


def read_kv(kv: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """What attention reads from (a slice of) a cache: dequantised if quantised, cast otherwise."""
    return dequantise(kv, out_dtype) if is_quantised(kv) else kv.to(out_dtype)
