"""What counts as the same message: how the endpoint recognises, in an agent's next request, the history it sent
before and the reply it was given, whatever harmless changes its framework made (``oprl.episodes.endpoint.sessions``
extends a segment only then).

- ``message_key``: a message of the history, compared with the same message in the previous request: role,
  text content (``None`` = ``""``, text parts joined), name, tool_call_id, and its tool calls as a set of
  (name, arguments) pairs (ids may change; frameworks that run parallel calls concurrently echo them in the
  order they finished);
- ``same_reply``: the assistant message echoed, compared with what the endpoint *returned* (content and tool
  calls, never the raw sampled text), the matched stop sequence appended allowed;
- ``thought``: both compare a reasoning model's ``<think>`` block without the whitespace around its tags
  (pydantic-ai's chat model re-renders it as ``<think>\\n...\\n</think>``);
- ``template_message``: a request message as the chat template gets it in a new segment's prompt (a tool-call
  echo as the text the model wrote).

Anything else (a message edited, dropped or inserted) is a different history: a new segment.
"""

from __future__ import annotations

import json
import re
from typing import Any

from oprl.tasks.bfcl.toolcall import CLOSE, OPEN


def template_message(message: dict, returned: dict[tuple, str] | None = None) -> dict:
    """A request message as the chat template gets it: role and text content. An assistant message with tool
    calls is the text the model wrote for it: the sampled text when this session returned it (``returned``),
    else its content followed by one ``<tool_call>{json}</tool_call>`` block per call (the format replies are
    parsed from), never an empty turn. (An echo that extends a segment is rendered from the history instead.)"""
    content = text_of(message)
    if message.get("role") == "assistant" and message.get("tool_calls"):
        written = (returned or {}).get(message_key(message))
        if written is None:
            blocks = "".join(OPEN + json.dumps({"name": n, "arguments": a}) + CLOSE for n, a in calls_of(message))
            written = f"{content}\n{blocks}" if content else blocks
        content = written
    out = {"role": message["role"], "content": content}
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def text_of(message: dict) -> str:
    """A message's text content: a string, its text parts joined, ``""`` for ``None``."""
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: the text ones, joined
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


THINK = re.compile(r"\s*(<think>|</think>)\s*")
"""A reasoning model's think tags with the whitespace around them (``thought``)."""


def thought(text: str) -> str:
    """``text`` as an echo is compared: with ``<think>`` blocks, the whitespace around their tags dropped and the
    ends stripped; without, unchanged. pydantic-ai's chat model splits a reply's ``<think>...</think>`` into a
    thinking part and sends it back re-rendered (``"<think>\\n...\\n</think>"``, text parts joined by
    ``"\\n\\n"``): the same reply, which must extend the segment (at ``9790d4b`` each turn was a new one)."""
    return THINK.sub(r"\1", text).strip() if "<think>" in text else text


def message_key(message: dict) -> tuple:
    """What must stay equal for a message to be "the same" in a later request: role, text content (``None`` =
    ``""``), name, tool_call_id, and the tool calls as a set of (name, arguments) pairs (their ids may change;
    frameworks that run parallel calls concurrently echo them in the order they finished)."""
    return (
        message.get("role"),
        thought(text_of(message)),
        message.get("name"),
        message.get("tool_call_id"),
        json.dumps(call_set(message), default=str),
    )


def call_set(message: dict) -> list[str]:
    """The message's tool calls in an order of their own (sorted JSON): compared as a multiset."""
    return sorted(json.dumps(call, sort_keys=True, default=str) for call in calls_of(message))


def same_reply(returned: dict, sent: dict, stop: str = "") -> bool:
    """Whether the agent's assistant message ``sent`` is the one the endpoint returned (or, for a reply cut at
    ``stop``, that reply with ``stop`` appended)."""
    content, echoed = thought(returned.get("content") or ""), thought(sent.get("content") or "")
    if sent.get("role") != "assistant" or not (echoed == content or (stop and echoed == thought(content + stop))):
        return False
    return call_set(sent) == call_set(returned)


def calls_of(message: dict) -> list[tuple[Any, Any]]:
    """A message's tool calls as (name, arguments) pairs, the arguments decoded from JSON where they parse."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = function.get("arguments")
        out.append((function.get("name"), arguments))
    return out
