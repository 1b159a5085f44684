"""`load_tokenizer`'s JSON cache is keyed by what it converts (the GGUF's metadata bytes) and the
conversion code, never by the file's name, size and mtime alone: a file replaced under the same
name, size and mtime, or another conversion, is never served the old tokenizer."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from hintkv.models import gguf_loader  # noqa: E402
from hintkv.models.gguf_loader import gguf_metadata_end, load_tokenizer, tokenizer_cache_path  # noqa: E402

# a few letters and their merges: enough of a byte-level BPE vocabulary for "abcd"
BASE = ["a", "b", "c", "d", "ab", "cd", "<|end|>"]
MERGES = ["a b", "c d"]


def write_gguf(path, tokens, weight=0.0):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(MERGES)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_tensor("token_embd.weight", np.full((len(tokens), 4), weight, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.utime(path, (1_700_000_000, 1_700_000_000))  # the same mtime for every version of the file
    return path


def test_a_file_replaced_under_the_same_name_size_and_mtime_gets_its_own_tokenizer(tmp_path):
    model = tmp_path / "model.gguf"
    write_gguf(model, BASE)
    first = load_tokenizer(model, cache_dir=tmp_path / "cache")
    assert first.encode("abcd") == [4, 5]
    size = model.stat().st_size
    # the same tokens with "ab" and "cd" swapped: same size, same mtime, other ids
    write_gguf(model, ["a", "b", "c", "d", "cd", "ab", "<|end|>"])
    assert model.stat().st_size == size and model.stat().st_mtime == 1_700_000_000
    assert load_tokenizer(model, cache_dir=tmp_path / "cache").encode("abcd") == [5, 4]
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.json"))) == 2


def test_the_key_reads_the_metadata_only(tmp_path):
    """Weights are not what the tokenizer is made of: another tensor payload keeps the entry."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_gguf(tmp_path / "a" / "m.gguf", BASE, weight=0.0)
    b = write_gguf(tmp_path / "b" / "m.gguf", BASE, weight=1.0)
    assert a.read_bytes() != b.read_bytes()
    assert tokenizer_cache_path(a, tmp_path).name == tokenizer_cache_path(b, tmp_path).name
    c = write_gguf(tmp_path / "c.gguf", BASE + ["ca"])
    assert tokenizer_cache_path(c, tmp_path).name != tokenizer_cache_path(a, tmp_path).name


def test_another_conversion_is_another_entry(tmp_path, monkeypatch):
    model = write_gguf(tmp_path / "model.gguf", BASE)
    before = tokenizer_cache_path(model, tmp_path)
    monkeypatch.setattr(gguf_loader, "_CONVERSION", "0" * 64)
    assert tokenizer_cache_path(model, tmp_path) != before


def test_the_metadata_ends_where_the_tensor_infos_begin(tmp_path):
    model = write_gguf(tmp_path / "model.gguf", BASE)
    data = model.read_bytes()
    end = gguf_metadata_end(data)
    (n,) = struct.unpack_from("<Q", data, end)
    assert data[end + 8:end + 8 + n] == b"token_embd.weight"  # the first tensor info's name
    with pytest.raises(ValueError):
        gguf_metadata_end(data[:end - 1])
    with pytest.raises(ValueError):
        gguf_metadata_end(b"GGML" + data[4:])
