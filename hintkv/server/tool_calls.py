"""Tool calls in generated text: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks
(the Hermes/Qwen convention our chat templates ask the model to follow) become OpenAI
`tool_calls`. Text that only looks like a call (bad JSON, no name) stays ordinary content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

OPEN = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)


@dataclass(slots=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (what OpenAI sends)


def _parse_block(body: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ParsedToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"], arguments=text)


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """(content before the first call, calls); no calls unless every block is well formed."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    calls = [_parse_block(m.group(1)) for m in _BLOCK.finditer(text, start)]
    if not calls or any(c is None for c in calls):
        return text, []
    return text[:start].rstrip(), [c for c in calls if c is not None]


def _partial_open_len(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `<tool_call>`."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


class ToolCallStreamer:
    """Streams content until a `<tool_call>` begins, then holds everything to parse at the end."""

    def __init__(self) -> None:
        self.pending = ""  # content that might be the start of `<tool_call>`
        self.calls_text: str | None = None  # from `<tool_call>` on, once seen

    def feed(self, text: str) -> str:
        """Content that can be sent now."""
        if self.calls_text is not None:
            self.calls_text += text
            return ""
        self.pending += text
        start = self.pending.find(OPEN)
        if start >= 0:
            out, self.calls_text, self.pending = self.pending[:start], self.pending[start:], ""
            return out
        keep = _partial_open_len(self.pending)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return out

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """(content still to send, tool calls) at the end of the generation."""
        if self.calls_text is None:
            out, self.pending = self.pending, ""
            return out, []
        content, calls = parse_tool_calls(self.calls_text)
        self.calls_text = None
        return ("", calls) if calls else (content, [])
