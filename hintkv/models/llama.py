"""Llama-family decoder (Llama 2/3, SmolLM2, Qwen2) over a paged KV cache.

Row layout: a step's tokens are flattened to T rows (no batch dim); `paged_attention` splits them
back into sequences through `AttentionMetadata`. Fused where it saves CPU time: one q/k/v GEMM
and one gate/up GEMM per layer, the residual add inside the next RMSNorm (vLLM's
`norm(x, residual) -> (normed, residual)`), RoPE rotating q and k in place in the qkv buffer; on a
float32 CPU model those three regions and attention run as C++ kernels (`cpu_kernels.py`).
Every GEMM runs through `linear.py` (`prepare(quantization)` picks the kernels after loading).
`load_state_dict_hf` takes Hugging Face parameter names and fills the fused tensors.
"""

from __future__ import annotations

import os
import re

import torch
import torch.nn.functional as F
from torch import nn

from hintkv.models import cpu_kernels, gemv_cpu
from hintkv.models.attention import AttentionMetadata, paged_attention, suffix_rows, write_kv
from hintkv.models.calibration import calibrate
from hintkv.models.compile import Regions, compile_regions
from hintkv.models.config import ModelConfig
from hintkv.models.decode_layers import DecodeLayers
from hintkv.models.greedy_head import GreedyHead
from hintkv.models.linear import (
    KERNELS,
    Linear,
    LinearKernel,
    OneDnnKernel,
    choose_kernel,
    prepare_linears,
)
from hintkv.models.rope import RotaryEmbedding
from hintkv.models.team_choice import ContentionGate


# the kept rows of a step and the metadata of their queries alone (`attention.suffix_rows`)
Suffix = tuple[torch.Tensor, AttentionMetadata]


def keeps_rows() -> bool:
    """Whether steps run the last layer past its K/V for the sampled rows only (the default) or for every row
    (HINTKV_LAST_LAYER_ROWS=all: A/B, bisecting). `ModelRunner` passes keep_last by it, and `prepare` splits the last
    layer's qkv (`Attention.split_qkv`) only when it holds."""
    return os.environ.get("HINTKV_LAST_LAYER_ROWS", "sampled") != "all"


def _param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    # Uninitialised on purpose: weights come from a checkpoint or presets.init_random_.
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    """Normalises in float32 and scales in the input dtype, like transformers' LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.weight = _param(dim, dtype=dtype, device=device)
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias, dtype, device)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, False, dtype, device)
        # the last layer's q and k/v row slices of qkv_proj's weight, each its own kernel (`split_qkv`), or None
        self.q_kv_kernels: tuple[LinearKernel, LinearKernel] | None = None

    def split_qkv(self) -> bool:
        """Give the q and the k/v rows of qkv_proj's weight a kernel each, so that a step keeping few rows past
        this layer's K/V (the last layer: `LlamaForCausalLM.forward`'s keep_last) projects k/v for every row but q
        only for the kept ones: a 512-token prefill's last layer then skips 511 of its 512 q rows, q being two thirds of
        that GEMM's columns (Hq of Hq + 2 Hkv heads). Only where qkv runs on oneDNN (`linear.OneDnnKernel`), whose q
        and k/v columns come out the same bits from the slices as from the whole weight (checked 1-2048 rows, 1 and 2
        threads):
        the K/V written stays that of the unsplit layer (HINTKV_LAST_LAYER_ROWS=all), bit for bit. Both slices are
        packed now (a copy of one layer's qkv weight; q runs gemv up to 12 kept rows, the packed slice past them),
        not in a request's step. Whether the split is on."""
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        if self.qkv_proj.kernel.name != OneDnnKernel.name:
            self.q_kv_kernels = None
            return False
        q_rows, kv_rows = slice(0, self.q_size), slice(self.q_size, None)
        self.q_kv_kernels = (OneDnnKernel(w[q_rows], None if b is None else b[q_rows]),
                             OneDnnKernel(w[kv_rows], None if b is None else b[kv_rows]))
        for kernel in self.q_kv_kernels:
            kernel.warm()
        return True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, regions: Regions, suffix: Suffix | None = None) -> torch.Tensor:
        """Attention output after o_proj of every row, or of `suffix`'s rows only (every row's K/V written)."""
        # the split while qkv_proj still runs oneDNN (a later `set_kernel` takes it off), not compiled (one rope graph)
        # and only when some row is dropped (a step keeping every row runs the one fused GEMM)
        split = (suffix is not None and self.q_kv_kernels is not None and self.qkv_proj.kernel.name == OneDnnKernel.name
                 and not regions.compiled and suffix[0].numel() < x.shape[0])
        if split:  # k/v of every row from the k/v slice; q of the kept rows only, below
            kv_kernel = self.q_kv_kernels[1]
            kv_kernel.refresh()
            q, k, v = regions.rope(kv_kernel(x), cos, sin, 0, self.num_kv_heads, self.head_dim)
        else:  # q and k rotate together: one RoPE pass over the Hq + Hkv heads of the fused qkv rows
            q, k, v = regions.rope(self.qkv_proj(x), cos, sin, self.num_heads, self.num_kv_heads, self.head_dim)
        if suffix is None:
            o = paged_attention(q, k, v, kv_cache, meta, self.scale)
            return self.o_proj(o.reshape(x.shape[0], self.q_size))
        rows, sub = suffix
        write_kv(k, v, kv_cache, meta.slot_mapping)
        if rows.numel() == 0:  # a step that samples nothing (a prefill chunk): its K/V is all it leaves
            return x.new_empty(0, x.shape[1])
        q = self._kept_q(x, cos, sin, rows, regions) if split else q.index_select(0, rows)
        o = paged_attention(q, k.index_select(0, rows), v.index_select(0, rows), kv_cache,
                            sub, self.scale)  # writes the kept rows' K/V again: the same values
        return self.o_proj(o.reshape(rows.numel(), self.q_size))

    def _kept_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor,
                regions: Regions) -> torch.Tensor:
        """q of the kept `rows` only, on the split's q kernel (`split_qkv`), rotated."""
        q_kernel = self.q_kv_kernels[0]
        q_kernel.refresh()
        q, _, _ = regions.rope(q_kernel(x.index_select(0, rows)), cos.index_select(0, rows),
                               sin.index_select(0, rows), self.num_heads, 0, self.head_dim)
        return q


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, False, dtype, device)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, False, dtype, device)

    def forward(self, x: torch.Tensor, regions: Regions) -> torch.Tensor:
        return self.down_proj(regions.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = Attention(cfg, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MLP(cfg, dtype, device)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata, regions: Regions,
                suffix: Suffix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(mlp output, residual stream): the next norm adds them (fused add + RMSNorm); with `suffix`, of its
        rows only (the last layer: its K/V is all that other rows leave behind)."""
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        x, residual = regions.add_rmsnorm(h, residual, norm1.weight, norm1.eps)
        x = self.self_attn(x, cos, sin, kv_cache, meta, regions, suffix)
        if suffix is not None:
            residual = residual.index_select(0, suffix[0])
            if suffix[0].numel() == 0:
                return x, residual
        x, residual = regions.add_rmsnorm(x, residual, norm2.weight, norm2.eps)
        return self.mlp(x, regions), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype, device) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.lm_head = (self.embed_tokens if cfg.tie_word_embeddings
                        else _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device))
        self.rotary = RotaryEmbedding(cfg, dtype, device)
        self.quantization: str | None = None
        self.calibration: list[list[int]] | None = None  # w8a8's calibration token lists
        # the C++ element-wise kernels on a float32 CPU model (cpu_kernels.py), else eager; `compile()` replaces them
        use_cpp = torch.device(device).type == "cpu" and dtype == torch.float32 and cpu_kernels.enabled()
        self.regions = cpu_kernels.regions() if use_cpp else Regions()
        self._lm_head_kernel: LinearKernel = LinearKernel(self.lm_head, None)
        self._greedy_head = GreedyHead(self.lm_head, self._lm_head_kernel)
        self._cpp_regions = self.regions  # the fused layers run only while these are the regions in use
        self._decode_layers: DecodeLayers | None = None  # every layer in one C++ call (few-row steps), set by prepare
        # the engine's gate (engine/llm_engine.py ticks it on its thread): the decode team's chooser reads it
        self.contention_gate: ContentionGate | None = None

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[torch.Tensor], keep_last: list[int] | None = None) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] of the step's T new tokens; with `keep_last` (one count per
        sequence), of the last keep_last[i] rows of each sequence i only, in order (`attention.suffix_rows`).

        With `keep_last` the last layer computes past its K/V only for those rows, as llama.cpp's last layer
        skips the tokens whose logits nobody reads: of a prefill only the sampled row goes through the last
        layer's attention, o_proj and MLP (an eighth of dummy:tiny's GEMMs and attention; nothing at all when a
        chunk samples nothing). Those rows' GEMMs and attention then run at another row count, so their values
        agree with the whole step's to float32 rounding, not bit for bit (tests/models/test_last_layer_rows.py)."""
        cos, sin = self.rotary.cos_sin(positions, grow=meta.static is None)  # static: a CUDA graph
        h = F.embedding(input_ids, self.embed_tokens)
        regions = self.regions.for_rows(h.shape[0])  # compiled, or eager where compiled steps measured slower
        fused = self._decode_layers if self.regions is self._cpp_regions else None
        out = None if fused is None else fused(h, cos, sin, kv_caches, meta)
        suffix = None if keep_last is None else suffix_rows(meta, keep_last)
        if out is not None:
            h, residual = out
            if suffix is not None:  # a few-row step: every row ran, the kept ones are picked
                h, residual = h.index_select(0, suffix[0]), residual.index_select(0, suffix[0])
        else:
            residual = None
            last = len(self.layers) - 1
            for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
                h, residual = layer(h, residual, cos, sin, kv_cache, meta, regions, suffix if i == last else None)
        if h.shape[0] == 0:
            return h
        return regions.add_rmsnorm(h, residual, self.norm.weight, self.norm.eps)[0]

    def prepare(self, quantization: str | None = None,
                calibration: list[list[int]] | None = None) -> dict[str, int]:
        """Pick every GEMM's kernel (`linear.py`) once the weights are in; {kernel name: count}.

        w8a8 with `calibration` token lists (kept for later re-prepares): the texts run in float
        first and their activation maxima smooth the int8 kernels (`calibration.py`)."""
        if calibration is not None:
            self.calibration = calibration
        self._decode_layers = None  # calibration's hooks need the per-op layers; rebuilt below
        act_absmax = None
        if quantization == "w8a8" and self.calibration:
            prepare_linears(self, None)
            act_absmax = calibrate(self, self.calibration)
        counts = prepare_linears(self, quantization, act_absmax)
        for i, layer in enumerate(self.layers):  # only the last layer runs a step's kept rows alone (`forward`),
            layer.self_attn.q_kv_kernels = None  # and only when steps keep rows: else its packs are memory for nothing
            if i == len(self.layers) - 1 and keeps_rows():
                layer.self_attn.split_qkv()
        head = choose_kernel(self.lm_head, quantization, is_lm_head=True)
        self._lm_head_kernel = KERNELS[head](self.lm_head, None)
        counts[head] = counts.get(head, 0) + 1
        self.quantization = quantization
        self._decode_layers = DecodeLayers.build(self) if self.regions is self._cpp_regions else None
        # a new screen: the loader's `.data.copy_` leaves the head's (data_ptr, _version) key unchanged; under
        # w8a8 it takes the head kernel's int8 copy
        self._greedy_head = GreedyHead(self.lm_head, self._lm_head_kernel)
        self._greedy_head.prepare(quantization is not None)  # its int8 copy now, not in the first request's step
        return counts

    def warm_head(self, max_rows: int) -> None:
        """Build the LM head's many-row copy now (at engine start) when a step can give it more than the
        few-row kernels' 12 rows (`gemv_cpu.ROWS`): a decode batch of 13+ sequences or a longer verify. For
        the `onednn` head that is a second float32 head (SmolLM2: 113 MB) reordered in ~0.4 s, not in a
        request's step; a process whose steps never exceed 12 rows never pays it."""
        if max_rows > gemv_cpu.ROWS:
            self._lm_head_kernel.refresh()
            self._lm_head_kernel.warm()

    def compile(self) -> Regions:
        """Compile the step's element-wise regions (compile.py); stays eager, with a warning, on failure."""
        cfg = self.config
        self.regions = compile_regions(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                                       cfg.num_key_value_heads, cfg.head_dim, self.dtype, self.device)
        return self.regions

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 logits [N, vocab].

        The LM head is the largest GEMM of a decode step (few rows); on a CPU in float32 it runs
        on an MKL-packed weight like the other projections.
        """
        self._lm_head_kernel.refresh()
        return self._lm_head_kernel(hidden).float()

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int] | None:
        """[N, hidden] -> each row's argmax token without computing the logits (`greedy_head.py`), or None where
        the screen does not serve the step (`GreedyHead.serves` decides: CPU float32; under w8a8 only 2-12 rows
        on a build with a screen): the caller then takes its head's logits. Under w8a8 the screen's token is the float
        head's argmax, which the int8 head's logits give almost always, not always (greedy_head.py says when)."""
        return self._greedy_head(hidden, self.quantization is not None)

    @torch.inference_mode()
    def load_state_dict_hf(self, sd: dict[str, torch.Tensor], *, prepare: bool = True) -> None:
        """Copy Hugging Face-named weights in (fusing q/k/v and gate/up); raise if any is missing.
        `prepare=False`: the caller prepares next (`load_model`), so the kernels' copies are built once."""
        cfg = self.config
        loaded: set[str] = set()
        own = dict(self.named_parameters(remove_duplicate=False))
        for hf_name, tensor in sd.items():
            target = _hf_to_own(hf_name, cfg)
            if target is None:
                continue
            if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # some tied checkpoints still ship the copy
            own_name, row_slice = target
            if own_name not in own:
                raise KeyError(f"checkpoint tensor {hf_name!r} has no place in this model ({own_name})")
            dst = own[own_name].data if row_slice is None else own[own_name].data[row_slice]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)} != expected {tuple(dst.shape)}")
            dst.copy_(tensor)
            loaded.add(f"{own_name}[{row_slice}]")
        expected = {f"{n}[{s}]" for hf in _expected_hf_names(cfg) for n, s in [_hf_to_own(hf, cfg)]}
        missing = expected - loaded
        if missing:
            raise KeyError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
        if prepare:
            self.prepare(self.quantization)  # packed / quantized copies follow the new weights


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _hf_to_own(name: str, cfg: ModelConfig) -> tuple[str, slice | None] | None:
    """HF parameter name -> (own parameter name, row slice inside a fused tensor); None = ignore."""
    if name == "model.embed_tokens.weight":
        return "embed_tokens", None
    if name == "model.norm.weight":
        return "norm.weight", None
    if name == "lm_head.weight":
        return "lm_head", None
    m = _LAYER.fullmatch(name)
    if m is None or "rotary_emb" in name:
        return None
    i, rest = m.group(1), m.group(2)
    q, kv, inter = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    fused = {
        "self_attn.q_proj": ("self_attn.qkv_proj", slice(0, q)),
        "self_attn.k_proj": ("self_attn.qkv_proj", slice(q, q + kv)),
        "self_attn.v_proj": ("self_attn.qkv_proj", slice(q + kv, q + 2 * kv)),
        "mlp.gate_proj": ("mlp.gate_up_proj", slice(0, inter)),
        "mlp.up_proj": ("mlp.gate_up_proj", slice(inter, 2 * inter)),
    }
    module, _, kind = rest.rpartition(".")
    if module in fused:
        own_module, rows = fused[module]
        return f"layers.{i}.{own_module}.{kind}", rows
    return f"layers.{i}.{rest}", None


def _expected_hf_names(cfg: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    for p in ("q_proj", "k_proj", "v_proj"):
        per_layer.append(f"self_attn.{p}.weight")
        if cfg.attention_bias:
            per_layer.append(f"self_attn.{p}.bias")
    for i in range(cfg.num_hidden_layers):
        names.extend(f"model.layers.{i}.{n}" for n in per_layer)
    return names
