"""Load a llama.cpp GGUF file: config from metadata, dequantized weights, byte-level BPE tokenizer.

llama.cpp's converter permutes the rows of Q and K (llama arch only) for its interleaved RoPE;
we use rotate-half RoPE, so the permutation is undone here ("reverse_permute" in transformers).
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from hintkv.models import tokenizer as _tokenizer_module
from hintkv.models.config import ModelConfig
from hintkv.models.tokenizer import Tokenizer

_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4
_PERMUTED_ARCHS = ("llama",)  # archs whose converter permutes Q/K rows

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _reader(path: str | Path) -> Any:
    import gguf  # heavy-ish import, only for GGUF specs

    return gguf.GGUFReader(str(path))


def _parsed(path: str | Path) -> tuple[dict[str, Any], list[Any]]:
    """The file's metadata (`_meta`) and its tensors (read-only memmaps, which every user copies:
    `gguf_state_dict`); both only read. The last file parsed is kept: `GGUFReader` parsing the metadata (the
    vocabulary's ~150K strings, one numpy view each) takes 5-10 s of Python, and a process often loads one file
    twice (a reference and a candidate model; test modules one after another). Only these two are kept, not the
    reader: ~86 MB kept against ~170 MB with the reader's per-string views. A file whose inode, size, mtime or ctime
    changed is parsed again (a file replaced under the same name, size and mtime has another inode or ctime)."""
    p = Path(path).resolve()
    st = p.stat()
    return _parsed_file(str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=1)
def _parsed_file(path: str, ino: int, size: int, mtime_ns: int, ctime_ns: int) -> tuple[dict[str, Any], list[Any]]:
    reader = _reader(path)
    return _meta(reader), list(reader.tensors)


def _meta(reader: Any) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def config_from_gguf(meta: dict[str, Any], has_output: bool, name: str) -> ModelConfig:
    arch = meta["general.architecture"]
    a = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = a("embedding_length"), a("attention.head_count")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=a("vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=a("feed_forward_length"),
        num_hidden_layers=a("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=a("attention.head_count_kv", heads),
        head_dim=a("attention.key_length") or a("rope.dimension_count") or hidden // heads,
        rms_norm_eps=a("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=a("rope.freq_base", 10000.0),
        max_position_embeddings=a("context_length", 8192),
        tie_word_embeddings=not has_output,
        attention_bias=arch == "qwen2",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[] if eos is None else [eos],
        name=name,
    )


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` (rows grouped (head, 2, d/2) -> (head, d/2, 2))."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
        return None  # e.g. rope_freqs.weight: we compute frequencies from the config
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"


def gguf_state_dict(tensors: list[Any], cfg: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Dequantized float32 tensors under Hugging Face names."""
    from gguf.quants import dequantize

    sd: dict[str, torch.Tensor] = {}
    for t in tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        w = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        if arch in _PERMUTED_ARCHS and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            w = _reverse_permute(w, heads)
        sd[name] = torch.from_numpy(np.array(w, dtype=np.float32))  # copy: GGUF F32 data is a read-only memmap
    return sd


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from the `tokenizer.ggml.*` metadata (gpt2 model)."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"only gpt2-style byte-level BPE GGUF vocabularies are supported, got {model!r}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") in ("smollm", "starcoder", "refact", "codeshell"):
        # these vocabularies split every digit on its own before the GPT-2 regex
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    specials = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types) if t in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED)]
    backend.add_special_tokens(specials)
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(backend, meta.get("tokenizer.chat_template"), [] if eos is None else [eos],
                     bos_token=None if bos is None else tokens[bos], eos_token=None if eos is None else tokens[eos])


def default_cache_dir() -> Path:
    return Path(os.environ.get("HINTKV_CACHE_DIR", Path.home() / ".cache" / "hintkv"))


# GGUF metadata value types (gguf spec): fixed-size scalars by byte width, strings, arrays
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I").unpack_from, struct.Struct("<Q").unpack_from


def gguf_metadata_end(buf: Any) -> int:
    """The offset where a GGUF file's metadata (header + key/value pairs, the tokenizer among them)
    ends and its tensor infos begin: a walk over the lengths only (~30 ms for SmolLM2's 49K-token
    vocabulary), not a parse. GGUF v2 and v3 (64-bit counts)."""
    if bytes(buf[:4]) != b"GGUF" or _U32(buf, 4)[0] < 2:
        raise ValueError("not a GGUF v2/v3 file")
    off, n_kv = 24, _U64(buf, 16)[0]

    def skip(off: int, vtype: int) -> int:
        if vtype in _GGUF_SCALAR_BYTES:
            return off + _GGUF_SCALAR_BYTES[vtype]
        if vtype == _GGUF_STRING:
            return off + 8 + _U64(buf, off)[0]
        if vtype == _GGUF_ARRAY:
            etype, count = _U32(buf, off)[0], _U64(buf, off + 4)[0]
            off += 12
            if etype in _GGUF_SCALAR_BYTES:
                return off + count * _GGUF_SCALAR_BYTES[etype]
            for _ in range(count):
                off = skip(off, etype)
            return off
        raise ValueError(f"unknown GGUF value type {vtype}")

    try:
        for _ in range(n_kv):
            off += 8 + _U64(buf, off)[0]  # the key
            off = skip(off + 4, _U32(buf, off)[0])
    except struct.error as e:  # a length that points past the end
        raise ValueError("GGUF metadata runs past the end of the file") from e
    if off > len(buf):
        raise ValueError("GGUF metadata runs past the end of the file")
    return off


def _conversion_digest() -> str:
    """The GGUF -> `tokenizers` conversion code as this process loaded it (this module and the
    `Tokenizer` wrapper, read once at import) and the `tokenizers` version."""
    h = hashlib.sha256(f"tokenizers={tokenizers.__version__}\n".encode())
    for module_file in (__file__, _tokenizer_module.__file__):
        h.update(Path(module_file).read_bytes())
    return h.hexdigest()


_CONVERSION = _conversion_digest()


def tokenizer_cache_path(path: str | Path, cache_dir: Path | None = None) -> Path:
    """Where `load_tokenizer` keeps `path`'s tokenizer: keyed by a SHA-256 of what it converts (the
    file's metadata bytes) and of the conversion code, so another file under the same name, size
    and mtime, or another conversion, is another entry and never the old one's tokenizer."""
    path = Path(path)
    h = hashlib.sha256(_CONVERSION.encode())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        h.update(buf[:gguf_metadata_end(buf)])
    return (cache_dir or default_cache_dir()) / "tokenizers" / f"{path.stem}-{h.hexdigest()[:32]}.json"


def load_tokenizer(path: str | Path, cache_dir: Path | None = None) -> Tokenizer:
    """Just the tokenizer of a GGUF file, cached as JSON: GGUFReader spends ~9 s parsing the vocab."""
    path = Path(path)
    cache = tokenizer_cache_path(path, cache_dir)
    if cache.is_file():
        saved = json.loads(cache.read_text())
        return Tokenizer(tokenizers.Tokenizer.from_str(saved["tokenizer"]), saved["chat_template"],
                         saved["eos_token_ids"], saved["bos_token"], saved["eos_token"])
    tok = tokenizer_from_gguf(_parsed(path)[0])
    saved = {"tokenizer": tok.backend.to_str(), "chat_template": tok.chat_template,
             "eos_token_ids": tok.eos_token_ids, "bos_token": tok.bos_token, "eos_token": tok.eos_token}
    try:  # a cache we cannot write is only slower, never wrong
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(saved))
        tmp.replace(cache)
    except OSError:
        pass
    return tok


def read_gguf(path: str | Path, name: str | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Everything a GGUF file holds: (config, HF-named float32 state dict, tokenizer)."""
    meta, tensors = _parsed(path)
    arch = meta["general.architecture"]
    has_output = any(t.name == "output.weight" for t in tensors)
    cfg = config_from_gguf(meta, has_output, name or Path(path).stem)
    return cfg, gguf_state_dict(tensors, cfg, arch), tokenizer_from_gguf(meta)
