"""The shape of a llama-family decoder (Llama, SmolLM2, Qwen2), validated once at the edge.

`ModelConfig.from_hf_dict` reads a Hugging Face `config.json` (llama or qwen2); the GGUF loader
and the dummy presets build the same dataclass, so the model never sees where its shape came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3"|"linear", "factor": ..., ...}
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 puts a bias on q/k/v (never on o_proj)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = "llama"

    def __post_init__(self) -> None:
        for attr in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            if getattr(self, attr) < 1:
                raise ValueError(f"{attr} must be >= 1, got {getattr(self, attr)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be > 0")
        self.rope_scaling = _normalize_rope_scaling(self.rope_scaling)
        self.eos_token_ids = [int(i) for i in self.eos_token_ids]

    @property
    def num_query_groups(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str | None = None) -> "ModelConfig":
        """Build from a Hugging Face llama / qwen2 `config.json` dict."""
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported model_type {model_type!r}; want one of {SUPPORTED_ARCHITECTURES}")
        num_heads = d["num_attention_heads"]
        # transformers >= 5 writes theta and scaling together as `rope_parameters`.
        rope = dict(d.get("rope_parameters") or {})
        rope_theta = rope.pop("rope_theta", None) or d.get("rope_theta", 10000.0)
        rope_scaling = (rope or None) if "rope_parameters" in d else d.get("rope_scaling")
        eos = d.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6 if model_type == "qwen2" else 1e-5),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=d.get("max_position_embeddings", 8192),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v bias; llama configs say so explicitly.
            attention_bias=d.get("attention_bias", model_type == "qwen2"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=name or d.get("_name_or_path") or model_type,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict (llama, or qwen2 when `attention_bias`) for other engines."""
        d: dict[str, Any] = {
            "architectures": ["Qwen2ForCausalLM" if self.attention_bias else "LlamaForCausalLM"],
            "model_type": "qwen2" if self.attention_bias else "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else dict(self.rope_scaling),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids),
            "torch_dtype": "bfloat16",
        }
        return d


def _normalize_rope_scaling(rs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Accept HF's `type`/`rope_type` spellings; return None for plain RoPE."""
    if rs is None:
        return None
    rs = dict(rs)
    rope_type = rs.pop("type", None) or rs.get("rope_type") or "default"
    rs["rope_type"] = rope_type
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; want one of {SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return None
    if float(rs.get("factor", 0)) <= 0:
        raise ValueError("rope_scaling.factor must be > 0")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in rs:
                raise ValueError(f"llama3 rope_scaling needs {key}")
    return rs
