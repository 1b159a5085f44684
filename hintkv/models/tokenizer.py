"""Tokenizer (a `tokenizers.Tokenizer` plus chat template and EOS ids) and streaming detokenizer."""

from __future__ import annotations

from typing import Any

import tokenizers

from hintkv.models.chat_template import render_chat


class Tokenizer:
    def __init__(self, backend: tokenizers.Tokenizer, chat_template: str | None, eos_token_ids: list[int],
                 bos_token: str | None = None, eos_token: str | None = None) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        kwargs.setdefault("bos_token", self.bos_token or "")
        kwargs.setdefault("eos_token", self.eos_token or "")
        return render_chat(self.chat_template, messages, tools, add_generation_prompt, **kwargs)


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas, never emitting half a UTF-8 character.

    Decodes a short window (`prefix_offset:`) so byte-level merges and spacing around the
    boundary come out exactly as a full decode would.
    """

    __slots__ = ("tokenizer", "skip_special_tokens", "ids", "prefix_offset", "read_offset")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # ids before this are already emitted

    def step(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)  # noqa: E731
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream (e.g. an incomplete character)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        full = self.tokenizer.decode(self.ids[self.prefix_offset:], self.skip_special_tokens)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):]
