"""smolagents agents (``ToolCallingAgent`` and ``CodeAgent``) with a calculator tool.

    oprl train task.name=agent task.agent=examples/agents/smolagents_agent.py:rollout          # ToolCallingAgent
    oprl train task.name=agent task.agent=examples/agents/smolagents_agent.py:rollout_stream   # stream_outputs
    oprl train task.name=agent task.agent=examples/agents/smolagents_agent.py:rollout_code     # CodeAgent

smolagents asks for ``tool_choice="required"``, which the endpoint cannot constrain (a 400): the model is
built with ``tool_choice="auto"``. Its ``stop`` sequences are honoured.
"""

import re

from smolagents import CodeAgent, OpenAIModel, ToolCallingAgent, tool


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, such as 37*48+5.
    """
    return calculate(expression)


def model(client) -> OpenAIModel:
    return OpenAIModel(
        model_id="policy",
        api_base=str(client.base_url),
        api_key=client.api_key,
        client_kwargs={"max_retries": 0},
        tool_choice="auto",
    )


def _answer(agent, problem: dict) -> dict:
    try:
        output = agent.run(problem["messages"][-1]["content"])
    except Exception:
        output = None
    return reward(None if output is None else str(output), problem)


def rollout(client, problem: dict) -> dict:
    return _answer(ToolCallingAgent(tools=[calculator], model=model(client), verbosity_level=0), problem)


def rollout_stream(client, problem: dict) -> dict:
    agent = ToolCallingAgent(tools=[calculator], model=model(client), verbosity_level=0)
    agent.stream_outputs = True
    return _answer(agent, problem)


def rollout_code(client, problem: dict) -> dict:
    return _answer(CodeAgent(tools=[calculator], model=model(client), verbosity_level=0), problem)


def calculate(expression: str) -> str:
    """Digits joined by + - * (``37*48+5``), evaluated; anything else is "error"."""
    expression = expression.replace(" ", "")
    ok = re.fullmatch(r"\d+([+\-*]\d+)*", expression) is not None and len(expression) <= 60
    return str(eval(expression)) if ok else "error"  # only digits and + - *: safe to eval


def reward(answer, problem: dict) -> dict:
    correct = float(str(answer).strip() == problem["answer"])
    return {"reward": correct, "correct": correct}
