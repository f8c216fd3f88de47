"""The OpenAI wire format of the agent endpoint: requests parsed and checked before anything is tokenized,
and replies as JSON or as Server-Sent Events.

Every request is refused with one 4xx line naming the culprit before it can reach the engine: a body that is
not a JSON object, nests deeper than ``MAX_DEPTH`` levels, or holds text that is not valid Unicode (a lone
surrogate: the tokenizer cannot encode it); a message without a known ``role``, with malformed ``tool_calls``,
or with image / audio / file content parts (text only); and every option whose effect the endpoint cannot
give (``UNSERVED``, ``NEUTRAL``: honoured, or refused with the value that is accepted). Text content parts are
joined with ``"\\n"`` (vLLM's rule), so an assistant reply echoed back in parts is the reply the endpoint returned.

Deliberately not here: sessions and tokens (``oprl.episodes.endpoint.sessions``), HTTP and the engine
(``oprl.episodes.endpoint.server``).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from oprl.episodes.endpoint.sessions import Choice, RequestRefused

MAX_DEPTH = 64
"""Deepest nesting of a request body (JSON objects and arrays); a tool schema rarely passes 10."""
MAX_STOP = 4
"""Stop sequences per request, as OpenAI allows."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""Message roles; ``developer`` is rendered as ``system`` (chat templates know no developer)."""
IGNORED = "user, metadata, store, service_tier, seed, parallel_tool_calls, prompt_cache_key, safety_identifier"
"""Options accepted and ignored because they do not change what is sampled (docs/tasks.md)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Strict):
    name: str
    arguments: str = "{}"


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class Function(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: Function


class StreamOptions(_Strict):
    include_usage: bool = False


class _Request(_Strict):
    _raw: dict = PrivateAttr(default_factory=dict)
    """The body as sent (tools are rendered from it, key order kept)."""
    model: str = "policy"
    n: int = Field(1, ge=1, le=64, strict=True)  # strict: true is not 1
    max_tokens: int | None = Field(None, ge=1, strict=True)
    temperature: float | None = Field(None, allow_inf_nan=False)
    top_p: float | None = Field(None, allow_inf_nan=False)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and (len(stops) > MAX_STOP or any(not s for s in stops)):
            raise ValueError(f"up to {MAX_STOP} non-empty strings")
        return value

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def wants_logprobs(self) -> bool:
        """Whether the reply carries the tokens' log-probs (chat: ``logprobs=true``; completions: any int)."""
        return False

    top_field: ClassVar[str] = "top_logprobs"
    """The request's field that asks for top log-probs (named in a refusal)."""

    def top_wanted(self) -> int:
        """N: the most likely tokens the reply lists per token (chat ``top_logprobs``, completions ``logprobs``);
        0 = none."""
        return 0


class ChatRequest(_Request):
    _names: dict[str, str] = PrivateAttr(default_factory=dict)
    """Translated from the Responses API: chat path -> the Responses field it came from, so a refusal names
    the field the agent sent (``responses_api.renamed``); {} for a chat request."""
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20, strict=True)
    response_format: dict[str, Any] | None = None

    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    def top_wanted(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else 0

    def chat_messages(self) -> list[dict]:
        """The messages as the session takes them: text content (parts joined), roles the template knows."""
        out = []
        for i, m in enumerate(self.messages):
            message = m.model_dump(exclude_none=True, exclude={"content"})
            message["role"] = "system" if m.role == "developer" else m.role
            message["content"] = _text(m.content, f"messages.{i}.content")
            if m.tool_calls:
                message["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
            out.append(message)
        return out

    def chat_tools(self) -> list[dict]:
        """The tools to render, under ``tool_choice="none"`` too (OpenAI keeps them visible, and a conversation's
        last turn asked so then extends the same segment); ``calls_parsed`` says whether replies may call them."""
        return list(self._raw.get("tools") or [])

    @property
    def calls_parsed(self) -> bool:
        """Whether the reply's ``<tool_call>`` blocks are returned as ``tool_calls`` (tools sent, not "none")."""
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_Request):
    prompt: str | list[int]
    """Text or token ids, never empty (the engine cannot sample from an empty context)."""
    logprobs: int | None = Field(None, ge=0, le=20, strict=True)
    """N: each token's log-prob and its N most likely alternatives (OpenAI allows 5, vLLM 20: the most any
    engine records)."""
    suffix: str | None = None
    top_field: ClassVar[str] = "logprobs"

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_or_ids(cls, value):
        """Text, or token ids that are JSON integers: ``true`` is no token id (pydantic would take it as 1, a
        float 2.0 as 2), and a list that is not all integers is named by its first other item."""
        if isinstance(value, list):
            bad = next((k for k, t in enumerate(value) if type(t) is not int), None)
            if bad is not None:
                shown = json.dumps(value[bad], default=str)[:40]
                raise ValueError(f"item {bad} is {shown}: a token id is an integer (or send the prompt as text)")
        elif not isinstance(value, str):
            raise ValueError("expected text or a list of token ids")
        if not value:
            raise ValueError("empty: send text or token ids to continue")
        return value

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def top_wanted(self) -> int:
        return self.logprobs or 0


def _text(content, where: str) -> str:
    """Message content as text: a string, or its text parts joined with a newline (vLLM's rule)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file"):
            raise RequestRefused(400, f"{where}.{k}: {kind} parts are not supported: the endpoint serves text only")
        else:
            raise RequestRefused(400, f"{where}.{k}: expected a text part {{'type': 'text', 'text': ...}}")
    return "\n".join(texts)


# -- parsing ----------------------------------------------------------------------------------------------------
def parse(raw: bytes, model: type[_Request], gate: Callable[[dict], None] | None = None) -> _Request:
    """The request in ``raw``, checked (see the module docstring), or ``RequestRefused`` naming the culprit.
    ``gate``: called with the decoded JSON object before anything walks it (the endpoint's bound on messages
    and token ids against the context: a flood of 100,000 messages is refused before it is validated)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise RequestRefused(400, f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        raise RequestRefused(400, "the request body is not JSON") from None
    if not isinstance(data, dict):
        raise RequestRefused(400, "the request body is not a JSON object")
    if gate is not None:
        gate(data)
    check_tree(data)
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise RequestRefused(400, f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
    check_options(body)
    body._raw = data
    return body


def check_tree(data) -> None:
    """Refuse nesting past ``MAX_DEPTH`` and strings the tokenizer cannot encode (iterative: no recursion)."""
    stack: list[tuple[Any, tuple, int]] = [(data, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestRefused(400, f"{_where(path)}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                _encodable(key, path)
                stack.append((item, (*path, key), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, (*path, k), depth + 1) for k, item in enumerate(value))
        elif isinstance(value, str):
            _encodable(value, path)


def _encodable(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused(400, f"{_where(path)}: not valid Unicode text (a lone surrogate)") from None


def _where(path: tuple) -> str:
    return ".".join(str(p) for p in path) or "body"


NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0}
"""Sampling options accepted only at the value that changes nothing (the engine samples plain softmax)."""
UNSERVED: dict[str, tuple[tuple[Any, ...], str]] = {
    "ignore_eos": ((False,), "the engine stops at EOS"),
    "min_tokens": ((0,), "the engine may stop at EOS at any length"),
    "stop_token_ids": (([],), "send stop as text"),
    "include_stop_str_in_output": ((False,), "stop sequences are cut from the reply"),
    "skip_special_tokens": ((True,), "special tokens are left out of the text"),
    "spaces_between_special_tokens": ((True,), "the text is the tokenizer's decoding"),
    "bad_words": (([],), "sampling is not constrained here"),
    "allowed_token_ids": ((), "sampling is not constrained here"),
    "logits_processors": ((), "sampling is not constrained here"),
    "guided_json": ((), "output is not constrained here; ask in the prompt"),
    "guided_regex": ((), "output is not constrained here; ask in the prompt"),
    "guided_choice": ((), "output is not constrained here; ask in the prompt"),
    "guided_grammar": ((), "output is not constrained here; ask in the prompt"),
    "guided_decoding_backend": ((), "output is not constrained here; ask in the prompt"),
    "structured_outputs": ((), "output is not constrained here; ask in the prompt"),
    "reasoning_effort": ((), "the policy is what it is"),
    "verbosity": ((), "the policy is what it is"),
    "chat_template": ((), "the model's own template renders every request"),
    "chat_template_kwargs": (({},), "the model's own template renders every request, with its defaults"),
    "add_generation_prompt": ((True,), "every chat request starts a new assistant turn"),
    "continue_final_message": (
        (False,),
        "a chat request starts a new assistant turn; to continue a reply, send it as a /v1/completions prompt",
    ),
    "documents": ((), "the model's own template renders every request"),
    "echo": ((False,), "the reply is the sampled text only"),
    "best_of": ((1,), "every sampled choice is returned (use n)"),
    "use_beam_search": ((False,), "the engine samples"),
    "length_penalty": ((1.0,), "the engine samples"),
    "truncate_prompt_tokens": ((), "a context past the model's is refused, never cut"),
    "prompt_logprobs": ((0,), "prompt log-probs are not computed"),
    "web_search_options": ((), "the endpoint has no tools of its own"),
}
"""Options of OpenAI's API or vLLM's server that would change what is sampled or returned, and the endpoint does
not honour: each a 400 naming it, unless absent, null or at the value that changes nothing (the first of the
tuple's values; none for options with no such value). Options outside this list and the request's fields are
ignored only when they change nothing sampled (``IGNORED``)."""


def check_options(body: _Request) -> None:
    """Refuse every option whose effect the endpoint cannot give (module docstring); ``stream``, ``stop``,
    ``tool_choice`` auto/none and ``logprobs`` (the recorded behaviour log-probs) are served."""
    extra = body.model_extra or {}
    for name, (neutrals, why) in UNSERVED.items():
        value = getattr(body, name, None) if name in type(body).model_fields else extra.get(name)
        if value is not None and value not in neutrals:
            shown = json.dumps(value)[:80] if not isinstance(value, str) else value[:80]
            raise RequestRefused(400, f"{name}={shown}: not supported ({why}); omit it")
    for name, neutral in NEUTRAL.items():
        value = getattr(body, name, None) if name in type(body).model_fields else extra.get(name)
        if value is not None and value != neutral:
            raise RequestRefused(400, f"{name}={value}: not supported (the engine samples without it); omit it")
    if body.logit_bias:
        raise RequestRefused(400, "logit_bias: not supported (the behaviour log-probs would not be the policy's)")
    for name in ("functions", "function_call", "audio", "prediction"):
        if extra.get(name) is not None:
            raise RequestRefused(400, f"{name}: not supported; use tools / tool_choice (text replies only)")
    if extra.get("modalities") not in (None, ["text"]):
        raise RequestRefused(400, "modalities: only ['text'] is served")
    if isinstance(body, ChatRequest):
        _check_chat(body)
    elif isinstance(body, CompletionRequest) and body.suffix:
        raise RequestRefused(400, "suffix: not supported (the reply continues the prompt, nothing after it)")


def _check_chat(body: ChatRequest) -> None:
    choice = body.tool_choice
    if choice == "required" or isinstance(choice, dict):
        shown = json.dumps(choice) if isinstance(choice, dict) else repr(choice)
        raise RequestRefused(
            400,
            f"tool_choice={shown}: sampling is not constrained to a call here; send tool_choice='auto' "
            "(smolagents: OpenAIModel(..., tool_choice='auto')) and let the reward teach the calls",
        )
    if body.top_logprobs and not body.logprobs:  # OpenAI's rule: alternatives come with the tokens' log-probs
        raise RequestRefused(400, f"top_logprobs={body.top_logprobs}: needs logprobs=true")
    kind = (body.response_format or {}).get("type", "text")
    if kind != "text":
        raise RequestRefused(400, f"response_format={kind}: output is not constrained here; ask in the prompt")


# -- replies ----------------------------------------------------------------------------------------------------
def usage(choices: list[Choice]) -> dict:
    prompt_tokens = choices[0].prompt_tokens if choices else 0
    completion = sum(len(c.ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def finish_reason(choice: Choice, chat: bool) -> Literal["stop", "length", "tool_calls"]:
    if not choice.ended:
        return "length"
    return "tool_calls" if chat and choice.message.get("tool_calls") else "stop"


def logprobs_of(choice: Choice, tokenizer, chat: bool, top: int = 0) -> dict:
    """The behaviour log-probs of the returned tokens (recorded when they were sampled), OpenAI's shape, each with
    its ``top`` most likely alternatives: the sampler's recorded top-K of the distribution the token was drawn
    from (``Choice.top_ids``: temperature, top-k and top-p applied, so under a temperature other than 1 or a
    top-p they are that processed distribution's, not the model's raw one), most likely first; an alternative
    outside top-k/top-p's kept set (log-prob ``-inf``, no mass) is left out, so a position may list fewer.
    Chat: the tokens of the text returned, so special tokens (the EOS that ended the reply, a sampled ``<pad>``)
    are left out, as they are of the content (at ``9790d4b`` the EOS ``</s>`` was the last entry); each
    ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}``. Completions: every
    sampled token, the EOS included, since a prompt that continues the session by token ids must hold it;
    ``top_logprobs`` one ``{token: logprob}`` per token (the N alternatives, plus the sampled token when it is
    not among them, as OpenAI's legacy format has it), null when N is 0."""
    hidden = set(tokenizer.all_special_ids) if chat else set()
    kept = [t for t, token in enumerate(choice.ids) if token not in hidden]
    alternatives = [_alternatives(choice, t, top) for t in kept] if top else [[] for _ in kept]
    if chat:
        return {
            "content": [
                _entry(tokenizer, choice.ids[t], choice.logprobs[t])
                | {"top_logprobs": [_entry(tokenizer, i, v) for i, v in alts]}
                for t, alts in zip(kept, alternatives, strict=True)
            ]
        }
    pieces = [_piece(tokenizer, choice.ids[t]) for t in kept]
    offsets, at = [], 0
    for p in pieces:
        offsets.append(at)
        at += len(p)
    tops = None
    if top:
        tops = []
        for t, piece, alts in zip(kept, pieces, alternatives, strict=True):
            row = {_piece(tokenizer, i): v for i, v in alts}
            row.setdefault(piece, float(choice.logprobs[t]))
            tops.append(row)
    values = [float(choice.logprobs[t]) for t in kept]
    return {"tokens": pieces, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _alternatives(choice: Choice, t: int, top: int) -> list[tuple[int, float]]:
    """Token ``t``'s ``top`` most likely alternatives with mass: ``[(id, log-prob)]``, most likely first."""
    if choice.top_ids is None or choice.top_logprobs is None or len(choice.top_ids[t]) < top:
        raise ValueError(f"top_logprobs={top}: the engine call recorded fewer alternatives")  # a bug of ours: a 500
    pairs = zip(choice.top_ids[t][:top], choice.top_logprobs[t][:top], strict=True)
    return [(int(i), float(v)) for i, v in pairs if v != float("-inf")]


def _piece(tokenizer, token: int) -> str:
    """A token's text as OpenAI shows it: the tokenizer's decoding of it alone (a piece of a multi-byte
    character decodes to U+FFFD; its ``bytes`` are exact)."""
    return tokenizer.decode([token])


def _entry(tokenizer, token: int, logprob: float) -> dict:
    """``{"token", "logprob", "bytes"}`` of one token: ``bytes`` its UTF-8 bytes (``token_bytes``)."""
    return {"token": _piece(tokenizer, token), "logprob": float(logprob), "bytes": token_bytes(tokenizer, token)}


def token_bytes(tokenizer, token: int) -> list[int]:
    """The bytes a token stands for, OpenAI's ``bytes`` field: for a byte-level BPE tokenizer (GPT-2's, SmolLM2's,
    Qwen's) its vocabulary entry mapped back through the byte alphabet, so a token holding part of a
    multi-byte character gives its own bytes, not U+FFFD's; a byte-fallback token ``<0xHH>`` its byte; any
    other the UTF-8 of its decoding."""
    name = tokenizer.convert_ids_to_tokens(token)
    if isinstance(name, str) and len(name) == 6 and name.startswith("<0x") and name.endswith(">"):
        try:
            return [int(name[3:5], 16)]
        except ValueError:
            pass
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if isinstance(name, str) and type(decoder).__name__ == "ByteLevel" and token not in tokenizer.all_special_ids:
        alphabet = _byte_alphabet()
        if all(c in alphabet for c in name):
            return [alphabet[c] for c in name]
    return list(_piece(tokenizer, token).encode("utf-8", "replace"))


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (``transformers``' ``bytes_to_unicode``, inverted)."""
    global _ALPHABET
    if _ALPHABET is None:
        keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        chars, extra = list(keep), 0
        for b in range(256):
            if b not in keep:
                keep.append(b)
                chars.append(256 + extra)
                extra += 1
        _ALPHABET = {chr(c): b for b, c in zip(keep, chars, strict=True)}
    return _ALPHABET


_ALPHABET: dict[str, int] | None = None


def response(body: _Request, choices: list[Choice], tokenizer) -> dict:
    """The whole reply as one JSON object."""
    chat = isinstance(body, ChatRequest)
    rows = []
    for i, c in enumerate(choices):
        row: dict[str, Any] = {"index": i, "finish_reason": finish_reason(c, chat), "logprobs": None}
        row |= {"message": c.message} if chat else {"text": c.text}
        if body.wants_logprobs():
            row["logprobs"] = logprobs_of(c, tokenizer, chat, body.top_wanted())
        rows.append(row)
    kind = "chat.completion" if chat else "text_completion"
    return _common(body, kind) | {"choices": rows, "usage": usage(choices)}


def _common(body: _Request, kind: str) -> dict:
    return {"id": f"oprl-{secrets.token_hex(6)}", "object": kind, "created": int(time.time()), "model": body.model}


def stream_events(body: _Request, choices: list[Choice], tokenizer) -> list[str]:
    """The whole reply as Server-Sent Events in OpenAI's chunk format (sampling is done: each choice is one
    content chunk, its tool calls one chunk, then its finish reason), ``[DONE]`` last."""
    chat = isinstance(body, ChatRequest)
    common = _common(body, "chat.completion.chunk" if chat else "text_completion")
    events = []
    for i, c in enumerate(choices):
        logprobs = logprobs_of(c, tokenizer, chat, body.top_wanted()) if body.wants_logprobs() else None
        if chat:
            deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
            deltas += [{"content": piece} for piece in _pieces(c.message.get("content") or "")]
            if c.message.get("tool_calls"):
                calls = [{"index": k} | call for k, call in enumerate(c.message["tool_calls"])]
                deltas.append({"tool_calls": calls})
            rows: list[dict[str, Any]] = [
                {"index": i, "delta": d, "finish_reason": None, "logprobs": None} for d in deltas
            ]
            rows[-1]["logprobs"] = logprobs
            rows.append({"index": i, "delta": {}, "finish_reason": finish_reason(c, True), "logprobs": None})
        else:
            rows = [
                {"index": i, "text": c.text, "finish_reason": None, "logprobs": logprobs},
                {"index": i, "text": "", "finish_reason": finish_reason(c, False), "logprobs": None},
            ]
        events += [_event(common | {"choices": [row]}) for row in rows]
    if body.stream_options is not None and body.stream_options.include_usage:
        events.append(_event(common | {"choices": [], "usage": usage(choices)}))
    return [*events, "data: [DONE]\n\n"]


def _pieces(content: str) -> list[str]:
    """A reply's text as streamed content deltas: one, except that each ``<think>`` / ``</think>`` tag is a delta
    of its own, as a server streaming token by token sends it (pydantic-ai's stream parser recognises a think
    block only so; sent whole, ``run_stream`` took the think text for the agent's final answer)."""
    return [piece for piece in re.split(r"(</?think>)", content) if piece]


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
