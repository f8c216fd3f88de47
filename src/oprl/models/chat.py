"""Prompt encoding through the tokenizer's own chat template (never a hand-written format), with tools.

Tools (OpenAI-style function schemas, ``{"type": "function", "function": {...}}``) go to the template's
``tools=`` argument when the template has a tools section (Qwen, Llama 3.1+, Hermes, ...). Templates without
one (SmolLM2, the embedded tiny model) get them in the system message, in this documented format, appended
to the first system message (or as a new one)::

    You can call these tools (JSON schemas, one per line):
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}
    </tools>

How to call them is the task's instruction (e.g. ``<tool_call>{json}</tool_call>``, ``oprl.tasks.bfcl.toolcall``).
"""

from __future__ import annotations

import json

TOOLS_PROMPT = "You can call these tools (JSON schemas, one per line):\n<tools>\n{tools}\n</tools>"


def template_takes_tools(tokenizer) -> bool:
    """Whether the chat template renders a ``tools`` argument (it names the variable)."""
    return "tools" in (tokenizer.chat_template or "")


def tools_in_system(messages, tools) -> list[dict]:
    """``messages`` with ``tools`` listed in the system message (the format of the module docstring)."""
    listing = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
    messages = list(messages)
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{listing}"}, *messages[1:]]
    return [{"role": "system", "content": listing}, *messages]


def render(tokenizer, messages, tools=(), *, generation_prompt: bool = True) -> str:
    """``messages`` (and ``tools``) rendered by the chat template, as text."""
    kwargs = {}
    if tools and template_takes_tools(tokenizer):
        kwargs["tools"] = list(tools)
    elif tools:
        messages = tools_in_system(messages, tools)
    return tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=generation_prompt, tokenize=False, **kwargs
    )


def encode_prompt(tokenizer, messages, tools=()) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template plus the assistant generation prompt.

    The template output already contains the model's special tokens, so the tokenizer must not add more.
    """
    return tokenizer(render(tokenizer, messages, tools), add_special_tokens=False).input_ids


def encode_problem(tokenizer, problem) -> list[int]:
    """The prompt of a ``Problem``: its messages and its tools."""
    return encode_prompt(tokenizer, problem.messages, getattr(problem, "tools", ()))
