"""A pydantic-ai agent with a calculator tool.

oprl train task.name=agent task.agent=examples/agents/pydantic_ai_agent.py:rollout          # run_sync
oprl train task.name=agent task.agent=examples/agents/pydantic_ai_agent.py:rollout_async    # await run
oprl train task.name=agent task.agent=examples/agents/pydantic_ai_agent.py:rollout_stream   # run_stream
"""

import re

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


def agent(client) -> Agent:
    async_client = AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    model = OpenAIChatModel("policy", provider=OpenAIProvider(openai_client=async_client))
    calculator = Agent(model, instructions="Answer with a number.")

    @calculator.tool_plain
    def calculate_tool(expression: str) -> str:
        """Evaluate an arithmetic expression such as 37*48+5."""
        return calculate(expression)

    return calculator


def rollout(client, problem: dict) -> dict:
    return reward(agent(client).run_sync(problem["messages"][-1]["content"]).output, problem)


async def rollout_async(client, problem: dict) -> dict:
    return reward((await agent(client).run(problem["messages"][-1]["content"])).output, problem)


async def rollout_stream(client, problem: dict) -> dict:
    async with agent(client).run_stream(problem["messages"][-1]["content"]) as result:
        output = await result.get_output()
    return reward(output, problem)


def calculate(expression: str) -> str:
    """Digits joined by + - * (``37*48+5``), evaluated; anything else is "error"."""
    expression = expression.replace(" ", "")
    ok = re.fullmatch(r"\d+([+\-*]\d+)*", expression) is not None and len(expression) <= 60
    return str(eval(expression)) if ok else "error"  # only digits and + - *: safe to eval


def reward(answer, problem: dict) -> dict:
    correct = float(str(answer).strip() == problem["answer"])
    return {"reward": correct, "correct": correct}
