"""Recipes several test files share: the tiny model's multi-turn episode settings and a counting engine.

Imported by name (``from recipes import ...``; pytest puts tests/ on the path, as for trainer_helpers), or
named by file path as a plug-in (``rollout.engine=tests/recipes.py:counting_engine``).
"""

from oprl.rollout import LeanEngine

EPISODES = [
    "warmstart.max_steps=60",
    "warmstart.batch_size=64",
    "warmstart.check_interval=30",
    "warmstart.val_problems=32",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
    "rollout.max_turns=3",
    "rollout.max_episode_tokens=48",
    "eval.num_problems=32",
    "eval.interval=2",
    "progress=false",
    "tensorboard=false",
    "runtime.torch_threads=1",
]
"""Multi-turn episodes on the tiny model (warm-started on the tool-arithmetic demonstrations): a task's
``task.*`` settings go next to these."""

CALLS: list[int] = []
"""One entry per ``generate`` call of every engine ``counting_engine`` built in this module's copy."""


def counting_engine(model, tokenizer, **settings):
    """An engine: any callable ``(model, tokenizer, temperature=, top_p=, max_new_tokens=) -> Engine``; this
    one is a ``LeanEngine`` that counts its ``generate`` calls in ``CALLS``."""
    engine = LeanEngine(model, tokenizer, **settings)
    generate = engine.generate

    def counted(*args, **kwargs):
        CALLS.append(1)
        return generate(*args, **kwargs)

    engine.generate = counted
    return engine
