"""An openai-agents (Agents SDK) agent with a calculator tool, on the chat-completions model.

    oprl train task.name=agent task.agent=examples/agents/openai_agents_agent.py:rollout          # Runner.run_sync
    oprl train task.name=agent task.agent=examples/agents/openai_agents_agent.py:rollout_async    # Runner.run
    oprl train task.name=agent task.agent=examples/agents/openai_agents_agent.py:rollout_stream   # Runner.run_streamed

    oprl train task.name=agent task.agent=examples/agents/openai_agents_agent.py:rollout_responses  # /v1/responses
    oprl train task.name=agent task.agent=examples/agents/openai_agents_agent.py:rollout_responses_stream

The model is the SDK's ``OpenAIChatCompletionsModel`` or its default ``OpenAIResponsesModel`` (``/v1/responses``,
translated to chat by the endpoint), each with an ``AsyncOpenAI`` client on the session's URL.
"""

import re

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # no trace export: nothing leaves the machine


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 37*48+5."""
    return calculate(expression)


def agent(client, responses: bool = False) -> Agent:
    async_client = AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    model = kind(model="policy", openai_client=async_client)
    return Agent(name="calculator", instructions="Answer with a number.", tools=[calculator], model=model)


def rollout(client, problem: dict) -> dict:
    return reward(Runner.run_sync(agent(client), problem["messages"][-1]["content"], max_turns=3).final_output, problem)


async def rollout_async(client, problem: dict) -> dict:
    return reward(
        (await Runner.run(agent(client), problem["messages"][-1]["content"], max_turns=3)).final_output, problem
    )


async def rollout_stream(client, problem: dict, responses: bool = False) -> dict:
    result = Runner.run_streamed(agent(client, responses), problem["messages"][-1]["content"], max_turns=3)
    async for _ in result.stream_events():
        pass
    return reward(result.final_output, problem)


def rollout_responses(client, problem: dict) -> dict:
    result = Runner.run_sync(agent(client, responses=True), problem["messages"][-1]["content"], max_turns=3)
    return reward(result.final_output, problem)


async def rollout_responses_stream(client, problem: dict) -> dict:
    return await rollout_stream(client, problem, responses=True)


def calculate(expression: str) -> str:
    """Digits joined by + - * (``37*48+5``), evaluated; anything else is "error"."""
    expression = expression.replace(" ", "")
    ok = re.fullmatch(r"\d+([+\-*]\d+)*", expression) is not None and len(expression) <= 60
    return str(eval(expression)) if ok else "error"  # only digits and + - *: safe to eval


def reward(answer, problem: dict) -> dict:
    correct = float(str(answer).strip() == problem["answer"])
    return {"reward": correct, "correct": correct}
