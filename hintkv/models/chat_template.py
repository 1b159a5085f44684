"""Render OpenAI-style messages through a model's Jinja chat template, the way transformers does.

Sandboxed Jinja with `raise_exception`, `tojson` and `strftime_now`. Templates that know nothing
of tools (SmolLM2's ChatML has no tools section) get a deterministic Hermes/Qwen-style rendering
of our own: tool schemas as a `<tools>` JSON block in the system message, assistant tool calls as
`<tool_call>` JSON, tool results as `<tool_response>` blocks in a user turn.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def flatten_content(content: Any) -> str:
    """OpenAI content (None, str, or a list of parts) -> plain text; text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif part.get("type") == "text":
            texts.append(part.get("text", ""))
        else:
            raise ValueError(f"unsupported content part type {part.get('type')!r}")
    return "\n".join(texts)


def render_tool_call(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def _tools_block(tools: list[dict[str, Any]]) -> str:
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)
    return TOOLS_PREAMBLE + lines + TOOLS_POSTAMBLE


def _normalize_without_tool_support(messages: list[dict[str, Any]],
                                    tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages a tool-unaware template can render: tools, calls and results become plain text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, text = m["role"], flatten_content(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(render_tool_call(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (text + "\n" if text else "") + calls})
        elif role == "tool":
            block = "<tool_response>\n" + text + "\n</tool_response>"
            if out and out[-1].get("_tool_results"):  # consecutive results share one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": role, "content": text})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        block = _tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = out[0]["content"] + "\n\n" + block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def render_chat(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """The prompt text for `messages` (kwargs such as bos_token reach the template as variables)."""
    if "tool" in template:  # the template renders tools and tool turns itself; only flatten content parts
        msgs = [dict(m, content=flatten_content(m["content"])) if isinstance(m.get("content"), list) else m
                for m in messages]
        return compile_template(template).render(messages=msgs, tools=tools,
                                                 add_generation_prompt=add_generation_prompt, **kwargs)
    msgs = _normalize_without_tool_support(messages, tools)
    return compile_template(template).render(messages=msgs, add_generation_prompt=add_generation_prompt, **kwargs)
