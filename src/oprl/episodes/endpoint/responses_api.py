"""The Responses API (``POST /v1/responses``, the openai-agents SDK's default model) on the agent endpoint, as a
translation to and from chat completions: the same sessions, the same token-in-token-out rule.

A request's ``instructions`` become a system message and its ``input`` items chat messages: a message (text or
``input_text`` / ``output_text`` parts), ``function_call`` items as the assistant's ``tool_calls`` (joined
with the assistant message before them, as the endpoint returned them), ``function_call_output`` items as
``tool`` messages; function tools (``{"type": "function", "name", "parameters"}``) as chat tools. The reply is
a ``response`` object whose ``output`` is the assistant message (``output_text``) and one ``function_call``
item per tool call; ``stream=true`` sends ``response.created``, the text as one ``response.output_text.delta``,
each output item's ``response.output_item.done`` and ``response.completed`` with the whole response.

Refused with a 400 naming the field: other item types (reasoning, built-in tools' calls, images), tools that are
not functions, ``previous_response_id`` / ``conversation`` (the endpoint stores nothing: send the whole input),
``text.format`` other than text, ``reasoning.effort`` (the model is what it is), ``top_logprobs`` outside
0..20. ``include: ["message.output_text.logprobs"]`` asks for the output text's log-probs, with ``top_logprobs``
alternatives each: translated to chat's ``logprobs=true, top_logprobs=N``, so both formats answer the same
values (without the include, as OpenAI, none are sent and ``top_logprobs`` asks nothing of the engine). The
chat checks then apply (``oprl.episodes.endpoint.openai_api``). Deliberately not here: sessions, HTTP.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from oprl.episodes.endpoint.openai_api import ChatRequest, _Request, finish_reason, parse, usage
from oprl.episodes.endpoint.sessions import Choice, RequestRefused

LOGPROBS = "message.output_text.logprobs"
"""The ``include`` entry that asks for the output text's log-probs (with ``top_logprobs`` alternatives each)."""


def chat_request(raw: bytes, gate: Callable[[dict], None] | None = None) -> tuple[ChatRequest, dict]:
    """The chat request a Responses body asks for, and the body (for the reply), or ``RequestRefused`` naming
    the Responses field (``gate``: as ``openai_api.parse``'s)."""
    body = parse(raw, _Body, gate)  # JSON, nesting and Unicode checks; a dict with ``input``
    data = body._raw
    for name in ("previous_response_id", "conversation", "prompt"):
        if data.get(name):
            raise RequestRefused(400, f"{name}: the endpoint keeps no state; send the whole conversation in input")
    text, reasoning = _object(data, "text"), _object(data, "reasoning")
    if _object(text, "format", "text.").get("type", "text") != "text":
        raise RequestRefused(400, "text.format: output is not constrained here; ask in the prompt")
    if reasoning.get("effort"):
        raise RequestRefused(400, "reasoning.effort: not supported (the policy is what it is); omit it")
    include = data.get("include") or []
    if not isinstance(include, list):
        raise RequestRefused(400, "include: expected a list")
    top = data.get("top_logprobs")
    if top is not None and (type(top) is not int or not 0 <= top <= 20):
        raise RequestRefused(400, f"top_logprobs={json.dumps(top)[:40]}: expected an integer from 0 to 20")
    if data.get("tools") is not None and not isinstance(data["tools"], list):
        raise RequestRefused(400, "tools: expected a list of function tools")
    if data.get("instructions") is not None and not isinstance(data["instructions"], str):
        raise RequestRefused(400, "instructions: expected text")
    messages, names = _messages(data)
    chat: dict[str, Any] = {"messages": messages, "stream": False}
    for name in ("model", "temperature", "top_p", "tool_choice"):
        if data.get(name) is not None:
            chat[name] = data[name]
    if data.get("max_output_tokens") is not None:
        chat["max_tokens"] = data["max_output_tokens"]
    if LOGPROBS in include:  # as OpenAI: log-probs (and top_logprobs' alternatives) only when included
        chat |= {"logprobs": True, "top_logprobs": top or 0}
    if data.get("tools"):
        chat["tools"] = [_tool(t, k) for k, t in enumerate(data["tools"])]
        names |= {f"tools.{k}.function": f"tools.{k}" for k in range(len(data["tools"]))}
    if isinstance(chat.get("tool_choice"), dict):  # {"type": "function", "name": ...}: refused as the chat one is
        chat["tool_choice"] = {"type": "function", "function": {"name": chat["tool_choice"].get("name")}}
    try:
        request = parse(json.dumps(chat).encode(), ChatRequest)
    except RequestRefused as exc:
        raise renamed(exc, names) from None
    assert isinstance(request, ChatRequest)
    request._names = names  # for the refusals that come later (server.submit: max_tokens past the engine's)
    return request, data


def renamed(exc: RequestRefused, names: dict[str, str]) -> RequestRefused:
    """``exc`` with the chat field its message starts with (``messages.3.content: ...``, ``max_tokens=...``)
    named as the Responses field it was translated from (``input.2.content``, ``max_output_tokens``): the
    agent sent no chat request. ``names``: chat path -> Responses path (``_messages``); the longest known
    head of the path is renamed, the rest kept. Unchanged when the message names no translated field."""
    match = re.match(r"[\w.]+", exc.message)
    parts = match.group(0).split(".") if match and names else []
    for k in range(len(parts), 0, -1):
        head = ".".join(parts[:k])
        if head in names:
            path = ".".join([names[head], *parts[k:]])
            return RequestRefused(exc.status, path + exc.message[len(match.group(0)) :])  # type: ignore[union-attr]
    return exc


def _object(data: dict, name: str, where: str = "") -> dict:
    """``data[name]`` when it is an object ({} when absent), else a 400 naming the field."""
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestRefused(400, f"{where}{name}: expected an object, got {type(value).__name__}")
    return value


class _Body(_Request):
    """The checks ``parse`` makes on any request (JSON, nesting, Unicode, options); the rest is read raw."""

    input: str | list[Any]


def _messages(data: dict) -> tuple[list[dict], dict[str, str]]:
    """The chat messages of ``instructions`` and ``input``, and the names of their fields (``renamed``): chat
    path -> the Responses path it came from."""
    messages: list[dict] = []
    names = {"max_tokens": "max_output_tokens"}

    def add(message: dict, origin: str, content: str = ".content") -> None:  # content "": the origin is the text
        names.update({f"messages.{len(messages)}": origin, f"messages.{len(messages)}.content": origin + content})
        messages.append(message)

    if data.get("instructions"):
        add({"role": "system", "content": str(data["instructions"])}, "instructions", "")
    items = data.get("input")
    if isinstance(items, str):
        add({"role": "user", "content": items}, "input", "")
        return messages, names
    if not isinstance(items, list) or not items:
        raise RequestRefused(400, "input: expected text or a non-empty list of items")
    for k, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            add({"role": item.get("role"), "content": _text(item.get("content"), f"input.{k}.content")}, f"input.{k}")
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
            if not (messages and messages[-1]["role"] == "assistant"):  # else: the calls of that reply
                add({"role": "assistant", "content": ""}, f"input.{k}")
            at = f"messages.{len(messages) - 1}.tool_calls.{len(messages[-1].get('tool_calls', []))}"
            names.update({at: f"input.{k}", f"{at}.function": f"input.{k}", f"{at}.id": f"input.{k}.call_id"})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"input.{k}.output")
            add({"role": "tool", "tool_call_id": item.get("call_id"), "content": text}, f"input.{k}", ".output")
            names[f"messages.{len(messages) - 1}.tool_call_id"] = f"input.{k}.call_id"
        else:
            raise RequestRefused(400, f"input.{k}: {kind!r} items are not supported (messages and function calls)")
    return messages, names


def _text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestRefused(400, f"{where}: expected text or a list of text parts")
    texts = []
    for k, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RequestRefused(400, f"{where}.{k}: {kind} parts are not supported: the endpoint serves text only")
    return "\n".join(texts)


def _tool(tool, k: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise RequestRefused(400, f"tools.{k}: {kind!r} tools are not supported: function tools only")
    function = {"name": tool.get("name")}
    for key in ("description", "parameters"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


# -- replies ----------------------------------------------------------------------------------------------------
def response(data: dict, choice: Choice, logprobs: list[dict] | None = None, status: str = "completed") -> dict:
    """The ``response`` object of one sampled reply (``n`` is 1 in the Responses API). ``logprobs``: the output
    text's, chat's entries (``openai_api.logprobs_of``: the same values and alternatives as a chat request's),
    when ``include`` asked for them; ``[]`` otherwise, as OpenAI sends."""
    message = choice.message
    output: list[dict] = []
    if message.get("content") or not message.get("tool_calls"):
        text: dict[str, Any] = {
            "type": "output_text",
            "text": message.get("content") or "",
            "annotations": [],
            "logprobs": logprobs or [],
        }
        item = {"id": f"msg_{secrets.token_hex(6)}", "type": "message", "role": "assistant", "status": "completed"}
        output.append(item | {"content": [text]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        output.append(
            {
                "id": f"fc_{secrets.token_hex(6)}",
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    counts = usage([choice])
    cut = finish_reason(choice, True) == "length"
    return {
        "id": f"resp_{secrets.token_hex(8)}",
        "object": "response",
        "created_at": int(time.time()),
        "model": data.get("model", "policy"),
        "status": "incomplete" if cut and status == "completed" else status,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "instructions": data.get("instructions"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": data.get("tool_choice", "auto"),
        "tools": data.get("tools") or [],
        "temperature": data.get("temperature"),
        "top_p": data.get("top_p"),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {},
        "usage": {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        },
    }


def stream_events(data: dict, choice: Choice, logprobs: list[dict] | None = None) -> list[str]:
    """The reply as Responses Server-Sent Events (sampling is done: the text is one delta, carrying every
    token's ``logprobs`` when included)."""
    whole = response(data, choice, logprobs)
    events: list[dict] = [{"type": "response.created", "response": whole | {"status": "in_progress", "output": []}}]
    for index, item in enumerate(whole["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        if item["type"] == "message" and item["content"][0]["text"]:
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": item["content"][0]["text"],
                    "logprobs": item["content"][0]["logprobs"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": whole})
    return [f"event: {e['type']}\ndata: {json.dumps(e | {'sequence_number': k})}\n\n" for k, e in enumerate(events)]
