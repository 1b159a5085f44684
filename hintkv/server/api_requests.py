"""The OpenAI request bodies we accept, as pydantic models validated at the edge.

Unknown fields are kept (`extra="allow"`): agent frameworks send extensions such as
`agent_hint`, `cache_salt`, `cache_sharing`, `return_token_ids` or `chat_template_kwargs`,
and OpenAI adds fields over time; refusing them would break clients for nothing. Types are
strict (a string is not a number, `true` is not a token id) so that a wrong type is a 400
rather than a silent coercion. Range checks live here too, so every handler sees valid input.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from hintkv.engine.types import SEED_RANGE

T = TypeVar("T")

# OpenAI's range; non-finite numbers never get here (the body parser refuses them).
Temperature = Annotated[StrictFloat, Field(ge=0, le=2)]
TopP = Annotated[StrictFloat, Field(gt=0, le=1)]
Seed = Annotated[StrictInt, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])]
PositiveInt = Annotated[StrictInt, Field(ge=1)]
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]  # OpenAI's presence / frequency range
Bias = Annotated[StrictFloat, Field(ge=-100, le=100)]  # OpenAI's logit_bias range
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]
MAX_STOP_STRINGS = 64  # vLLM takes any number, OpenAI 4; agent frameworks send a handful
MAX_STOP_STRING_CHARS = 1024  # each piece's search and the streamed text held back grow with the longest stop
MAX_STOP_TOKEN_IDS = 64  # vLLM's extension, uncapped there; each is checked for every token on the engine thread

# chat_template_kwargs the renderer sets itself, and where they come from instead
RENDERER_ARGUMENTS = {"messages": "send the top-level 'messages'", "tools": "send the top-level 'tools'",
                      "add_generation_prompt": "the server always adds the assistant's turn (it generates it)",
                      "template": "the chat template is the model's own",
                      "self": "a name the renderer's own call takes"}
LEGACY_COMPLETION_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
# Known OpenAI fields we do not implement, with the values that leave them off: any other
# value is refused (400) rather than silently ignored.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),  # structured output (json_object / json_schema)
    "guided_json": (None,),  # vLLM's structured-output extensions
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),  # vLLM >= 0.10.2's replacement for guided_*
    "allowed_token_ids": (None,),  # vLLM's token filters
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
    "include_stop_str_in_output": (None, False),  # vLLM's text options, at their defaults only
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: StrictBool = False


class ChatMessage(_Open):
    """One chat message; tool calls, names and content parts pass through to the template."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[dict[str, Any]] | None = None


class _SamplingRequest(_Open):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: StrictStr | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None  # the newer name: it wins when both are set
    stop: StrictStr | list[StrictStr] | None = None
    seed: Seed | None = None
    n: StrictInt | None = None  # OpenAI's "integer or null": null is the default, 1
    stream: StrictBool | None = False  # "boolean or null": null is read as false
    stream_options: StreamOptions | None = None
    # Extensions (vLLM-compatible names).
    cache_salt: StrictStr | None = None
    return_token_ids: StrictBool | None = False  # vLLM's Optional[bool]: null is read as false
    ignore_eos: StrictBool = False
    stop_token_ids: TokenIds | None = None
    # Logit shaping and filtering (OpenAI's, then vLLM's extensions; engine/logits_shaping.py, engine/sampler.py)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[StrictStr, Bias] | None = None  # token id (a JSON key: a string) -> added to its logit
    repetition_penalty: Annotated[StrictFloat, Field(gt=0)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None  # -1 or 0: off
    min_p: Annotated[StrictFloat, Field(ge=0, le=1)] | None = None
    # Kept raw: the protocol layer parses and validates it (hintkv.protocol).
    agent_hint: dict[str, Any] | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stream", "return_token_ids")
    @classmethod
    def _null_is_false(cls, flag: bool | None) -> bool:
        return bool(flag)  # (review rev26 A5, rev27 A6: a client that sends unset fields as null)

    @field_validator("stream_options")
    @classmethod
    def _only_with_stream(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):  # OpenAI's and vLLM's 400 (review rev26 A6)
            raise ValueError("stream_options can only be set when stream is true")
        return options

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > MAX_STOP_STRINGS:  # each output piece is searched for every one on the event loop (rev26 A2)
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(stops)}")
        longest = max(stops, key=len, default="")
        if len(longest) > MAX_STOP_STRING_CHARS:  # vLLM has none: a 1 MB stop held back a whole stream
            raise ValueError(f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, got {len(longest)}")
        return stop

    @field_validator("stop_token_ids")
    @classmethod
    def _few_stop_token_ids(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and len(ids) > MAX_STOP_TOKEN_IDS:  # as the stop strings (review rev26 A2)
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids are supported, got {len(ids)}")
        return ids

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        seen: dict[int, str] = {}
        for key in bias or {}:
            if not key.isascii() or not key.isdigit() or len(key) > 18:  # int() refuses > 4300 digits
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
            if (first := seen.setdefault(int(key), key)) != key:  # "5" and "05": one bias would be lost
                raise ValueError(f"logit_bias names token {int(key)} twice: {first!r}, {key!r}")
        return bias

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """`logit_bias` as (token id, bias) pairs in token order."""
        return tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items()))

    def unsupported_field(self) -> str | None:
        """The first field of UNSUPPORTED_FIELDS set to a value that would turn it on."""
        extra = self.model_extra or {}
        return next((f for f, off in UNSUPPORTED_FIELDS.items() if extra.get(f) not in off), None)

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def output_param(self) -> str:
        """The field that sets the output limit, for the errors that name it."""
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    @property
    def output_limit(self) -> int | None:
        """The request's output limit (None: what room the prompt leaves)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class ChatCompletionRequest(_SamplingRequest):
    # May be empty only in a management request (agent_hint with manage_request: true), which
    # generates nothing; the route refuses it for every other request.
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None  # false: at most one call a turn
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_the_renderers_own(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        """The renderer sets these from the request itself: one here was a 400 in Python's words ("got multiple
        values for keyword argument 'tools'"); now it says which field to use (review rev27 A6)."""
        for key, field in RENDERER_ARGUMENTS.items():
            if key in (kwargs or {}):
                raise ValueError(f"chat_template_kwargs must not set {key!r}: {field}")
        return kwargs

    @field_validator("tool_choice")
    @classmethod
    def _supported_tool_choice(cls, choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        """'auto' (the default) and 'none' only: a forced call ('required', a named function) would change the
        output and is not implemented, so it is refused, not ignored (review rev26 A3)."""
        if choice is None or choice in ("auto", "none"):
            return choice
        if choice == "required" or isinstance(choice, dict):
            raise ValueError("only tool_choice 'auto' and 'none' are supported (a forced tool call is not)")
        raise ValueError(f"tool_choice must be 'auto' or 'none', got {choice!r}")

    @property
    def uses_tools(self) -> bool:
        """Whether generated `<tool_call>` blocks are returned as tool_calls."""
        return bool(self.tools) and self.tool_choice != "none"

    def returned_calls(self, calls: list[T]) -> list[T]:
        """The tool calls a reply carries: with `parallel_tool_calls: false`, the first only, as vLLM does (the
        model may still write several; review rev26 A3: the field was ignored and every call came back)."""
        return calls[:1] if self.parallel_tool_calls is False else calls

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


class CompletionRequest(_SamplingRequest):
    # One prompt: text, token ids, or a one-element batch of either. Absent or empty only in a
    # management request (agent_hint with manage_request: true); the route refuses it otherwise.
    prompt: StrictStr | TokenIds | list[StrictStr] | list[TokenIds] | None = None

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            prompt = prompt[0]
        return prompt

    @property
    def output_limit(self) -> int:
        """OpenAI's legacy endpoint has no `max_completion_tokens`; it is read as chat reads it, not
        ignored (review rev26 A9: it generated the 16-token default)."""
        limit = super().output_limit
        return limit if limit is not None else LEGACY_COMPLETION_MAX_TOKENS
