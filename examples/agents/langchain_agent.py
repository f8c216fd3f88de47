"""A LangChain agent (``create_agent`` with a calculator tool) trained through the endpoint.

    oprl train task.name=agent task.agent=examples/agents/langchain_agent.py:rollout          # .invoke
    oprl train task.name=agent task.agent=examples/agents/langchain_agent.py:rollout_async    # .ainvoke
    oprl train task.name=agent task.agent=examples/agents/langchain_agent.py:rollout_stream   # .stream

``ChatOpenAI`` points at the session's URL with the session's key; everything else is plain LangChain.
"""

import re

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool("calculate")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 37*48+5."""
    return calculate(expression)


def agent(client, stream: bool = False):
    model = ChatOpenAI(
        model="policy", base_url=str(client.base_url), api_key=client.api_key, max_retries=0, streaming=stream
    )
    return create_agent(model, tools=[calculator])


def rollout(client, problem: dict) -> dict:
    state = agent(client).invoke({"messages": [{"role": "user", "content": problem["messages"][-1]["content"]}]})
    return reward(state["messages"][-1].content, problem)


async def rollout_async(client, problem: dict) -> dict:
    state = await agent(client).ainvoke({"messages": [{"role": "user", "content": problem["messages"][-1]["content"]}]})
    return reward(state["messages"][-1].content, problem)


def rollout_stream(client, problem: dict) -> dict:
    last = None
    for state in agent(client, stream=True).stream(
        {"messages": [{"role": "user", "content": problem["messages"][-1]["content"]}]}, stream_mode="values"
    ):
        last = state["messages"][-1]
    return reward(last.content if last is not None else None, problem)


def calculate(expression: str) -> str:
    """Digits joined by + - * (``37*48+5``), evaluated; anything else is "error"."""
    expression = expression.replace(" ", "")
    ok = re.fullmatch(r"\d+([+\-*]\d+)*", expression) is not None and len(expression) <= 60
    return str(eval(expression)) if ok else "error"  # only digits and + - *: safe to eval


def reward(answer, problem: dict) -> dict:
    correct = float(str(answer).strip() == problem["answer"])
    return {"reward": correct, "correct": correct}
