"""From a validated OpenAI request to an engine `GenerateRequest`, or a 4xx saying why not.

Everything that depends on the served model is checked here: the model name, the prompt's
length against what one request may hold (`min(max_model_len, num_kv_tokens)`: a request
whose context cannot fit in the whole KV pool could never finish), token ids against the
vocabulary, and the output budget. Nothing reaches the engine unless it can be served.
"""

from __future__ import annotations

import logging
from typing import Any

from hintkv.engine.client import EngineClient
from hintkv.engine.types import GenerateRequest, SamplingParams, SessionRef
from hintkv.server.api_requests import ChatCompletionRequest, CompletionRequest
from hintkv.server.errors import APIError, bad_request

logger = logging.getLogger(__name__)


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise APIError(
            404,
            f"The model '{requested}' does not exist; this server serves '{served}'.",
            param="model",
            code="model_not_found",
        )


def check_supported(req: ChatCompletionRequest | CompletionRequest) -> None:
    field = req.unsupported_field()
    if field is not None:
        raise bad_request(f"'{field}' is not supported by this server.", param=field)


def chat_prompt_ids(tokenizer: Any, req: ChatCompletionRequest) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(
            req.template_messages(),
            tools=req.tools,
            add_generation_prompt=True,
            **(req.chat_template_kwargs or {}),
        )
    except Exception as exc:  # a template rejecting the conversation is the client's error
        logger.info("chat template failed: %s", exc)
        raise bad_request(f"Could not render the chat template: {exc}", param="messages") from exc
    return tokenizer.encode(text)


def completion_prompt_ids(tokenizer: Any, req: CompletionRequest) -> list[int]:
    if isinstance(req.prompt, str):
        return tokenizer.encode(req.prompt)
    check_in_vocabulary(tokenizer, req.prompt, "Token id {bad} is", param="prompt")
    return list(req.prompt)


def check_in_vocabulary(tokenizer: Any, ids: list[int], what: str, *, param: str) -> None:
    """A 400 naming the first of `ids` outside the tokenizer's vocabulary (`what` formats it)."""
    vocab = tokenizer.vocab_size  # a call into the tokenizer: once, not once per id (709 us at 2048 ids)
    if ids and max(ids) >= vocab:
        bad = next(t for t in ids if t >= vocab)
        raise bad_request(f"{what.format(bad=bad)} outside the vocabulary (size {vocab}).", param=param)


def request_capacity(engine: EngineClient) -> int:
    """The most tokens (prompt + output) one request may hold."""
    return min(engine.max_model_len, engine.num_kv_tokens)


def generate_request(
    engine: EngineClient,
    request_id: str,
    prompt_ids: list[int],
    req: ChatCompletionRequest | CompletionRequest,
    *,
    prompt_param: str,
    output_limit: int | None,
    output_param: str,
    session: SessionRef | None = None,
    tenant: str | None = None,
) -> GenerateRequest:
    """`tenant` (API key identity + cache_salt) becomes the KV namespace: tenants never share
    blocks, so one tenant's evict can never free, and its timing never reveal, another's KV."""
    capacity = request_capacity(engine)
    if not prompt_ids:
        raise bad_request("The prompt is empty.", param=prompt_param)
    if len(prompt_ids) >= capacity:
        raise bad_request(
            f"The prompt is {len(prompt_ids)} tokens; this server holds at most {capacity} "
            f"tokens per request (max_model_len {engine.max_model_len}, KV pool "
            f"{engine.num_kv_tokens} tokens), prompt and output together.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    room = capacity - len(prompt_ids)
    if output_limit is None:
        output_limit = room
    elif output_limit > room:
        raise bad_request(
            f"{output_param}={output_limit} does not fit: the prompt is {len(prompt_ids)} "
            f"tokens and a request holds at most {capacity}, so at most {room} more.",
            param=output_param,
            code="context_length_exceeded",
        )
    bias = req.bias_pairs()
    check_in_vocabulary(engine.tokenizer, [t for t, _ in bias], "logit_bias names token id {bad},", param="logit_bias")
    if req.min_tokens is not None and req.min_tokens > output_limit:
        raise bad_request(f"min_tokens={req.min_tokens} is more than the {output_limit} output tokens this "
                          f"request may generate ({output_param}).", param="min_tokens")
    sampling = SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=output_limit,
        seed=req.seed,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        logit_bias=bias,
        min_tokens=req.min_tokens or 0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
    )
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        cache_salt=tenant if tenant is not None else req.cache_salt,
        session=session,
    )
