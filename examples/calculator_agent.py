"""A calculator agent written with the openai client: the tool-arithmetic episode as your own loop.

    oprl train task.name=agent task.agent=examples/calculator_agent.py:rollout rollout.max_turns=3

The model calls the calculator as ``[37*48]``; any other reply is its answer (docs/tasks.md#bring-your-own-agent).
"""

import re

CALL = re.compile(r"\[(\d+(?:[+\-*]\d+)*)\]")


def rollout(client, problem: dict) -> dict:
    messages = list(problem["messages"])
    calls = 0
    for _ in range(3):
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
        messages.append({"role": "assistant", "content": reply})
        text = reply.strip()
        if not text.startswith("["):  # the final answer
            correct = float(re.fullmatch(r"-?\d+", text) is not None and int(text) == int(problem["answer"]))
            return {"reward": correct, "correct": correct, "tool_calls": float(calls)}
        calls += 1
        call = CALL.fullmatch(text) if len(text) <= 42 else None
        messages.append({"role": "tool", "content": calculate(call.group(1)) if call else "error"})
    return {"reward": 0.0, "correct": 0.0, "tool_calls": float(calls)}


def calculate(expression: str) -> str:
    """``37*48+5`` exactly: a sum of signed products of integers."""
    total, sign = 0, 1
    for term in re.split(r"([+-])", expression):
        if term in "+-":
            sign = 1 if term == "+" else -1
            continue
        product = 1
        for factor in term.split("*"):
            product *= int(factor)
        total += sign * product
    return str(total)
