"""SmolLM2's GGUF tokenizer, chat template rendering (incl. our tools block), streaming detokenizer."""

from __future__ import annotations

import json

import jinja2
import pytest

from hintkv.models.chat_template import render_chat
from hintkv.models.gguf_loader import load_tokenizer
from hintkv.models.presets import smollm2_gguf_path, smollm2_tokenizer
from hintkv.models.tokenizer import IncrementalDetokenizer

TEXTS = ["What is the capital of France?", "def f(x):\n    return x**2  # 3.14159",
         "naïve café — ok 日本語 🙂🙂", "  I'm sure THEY'RE here\n\n\t"]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def test_special_tokens_and_ids(tok):
    # ids as in SmolLM2's tokenizer.json (checked against transformers' GGUF tokenizer by hand)
    assert tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n") == \
        [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198]
    assert tok.encode("12345") == [33, 34, 35, 36, 37]  # digits split one by one
    assert tok.eos_token_ids == [2] and tok.vocab_size == 49152


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_decode_skips_special_tokens_by_default(tok):
    ids = tok.encode("<|im_start|>assistant\nhi<|im_end|>")
    assert tok.decode(ids) == "assistant\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>assistant\nhi<|im_end|>"


def test_disk_cache_gives_the_same_tokenizer(tmp_path, tok):
    fresh = load_tokenizer(smollm2_gguf_path(), cache_dir=tmp_path)
    assert list(tmp_path.rglob("*.json"))
    cached = load_tokenizer(smollm2_gguf_path(), cache_dir=tmp_path)
    for text in TEXTS:
        assert fresh.encode(text) == cached.encode(text) == tok.encode(text)
    assert cached.chat_template == fresh.chat_template and cached.eos_token_ids == fresh.eos_token_ids


def test_smollm2_chat_template_adds_default_system_and_generation_prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                       add_generation_prompt=False).endswith("assistant\n")


def test_tools_render_into_the_system_message(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    text = tok.apply_chat_template(msgs, tools=[WEATHER_TOOL])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(WEATHER_TOOL, sort_keys=True) in system and "<tool_call>" in system
    reordered = dict(reversed(list(WEATHER_TOOL.items())))  # same tool, other key order
    assert tok.apply_chat_template(msgs, tools=[reordered]) == text
    no_system = tok.apply_chat_template(msgs[1:], tools=[WEATHER_TOOL])
    assert no_system.startswith("<|im_start|>system\n# Tools")


def test_tool_calls_results_and_content_parts(tok):
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "no rain"},
    ]
    text = tok.apply_chat_template(msgs, tools=[WEATHER_TOOL])
    assert "<|im_start|>user\nWeather\nin Paris?<|im_end|>" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert ("<|im_start|>user\n<tool_response>\n18C sunny\n</tool_response>\n"
            "<tool_response>\nno rain\n</tool_response><|im_end|>") in text


def test_tool_aware_template_gets_tools_and_raise_exception():
    template = ("{% if tools %}{% for t in tools %}{{ t.function.name }}|{{ t | tojson }}{% endfor %}{% endif %}"
                "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('bad role') }}{% endif %}"
                "[{{ m.role }}:{{ m.content }}]{% endfor %}")
    out = render_chat(template, [{"role": "user", "content": [{"type": "text", "text": "x"}]}], tools=[WEATHER_TOOL])
    assert out.startswith("get_weather|{") and out.endswith("[user:x]")
    with pytest.raises(jinja2.TemplateError, match="bad role"):
        render_chat(template, [{"role": "bad", "content": "x"}])


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_streams_exact_text(tok, text):
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.step([i]) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


def test_incremental_detokenizer_holds_back_half_characters(tok):
    ids = tok.encode("🙂")
    assert len(ids) > 1  # one emoji spans several byte-level tokens
    detok = IncrementalDetokenizer(tok)
    assert [detok.step([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.step(ids[-1:]) == "🙂"
