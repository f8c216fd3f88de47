"""An openai-client agent for reasoning-gym problems: ask, insist once on a bare answer, score with reasoning-gym.

    oprl train configs/examples/smollm2-rg-agent.yaml

Turn 1 asks the question; when the reply holds no number, turn 2 asks for the final answer only. The reward
is reasoning-gym's own ``score_answer`` for the problem's generator (its name is in the task id), on the last
number of the last reply.
"""

import re

import reasoning_gym

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
ASK = "Reply with the final answer only, as a number."


def rollout(client, problem: dict) -> dict:
    question = problem["messages"][-1]["content"]
    messages = [*problem["messages"][:-1], {"role": "user", "content": f"{question}\n{ASK}"}]
    numbers: list[str] = []
    turns = 0
    while turns < 2:
        turns += 1
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
        messages.append({"role": "assistant", "content": reply})
        numbers = NUMBER.findall(reply)
        if numbers:
            break
        messages.append({"role": "user", "content": ASK})
    generator = problem["task_id"].split("/")[1]  # reasoning-gym/<generator>/<seed>/<split>/<index>
    score = reasoning_gym.get_score_answer_fn(generator)
    value = float(score(numbers[-1], {"answer": problem["answer"]})) if numbers else 0.0
    return {"reward": value, "correct": float(value == 1.0), "turns": float(turns), "answered": float(bool(numbers))}
