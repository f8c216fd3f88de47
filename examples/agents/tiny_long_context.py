"""A long-context copy of the embedded tiny model, for agent frameworks whose prompts pass its 128 positions.

    python examples/agents/tiny_long_context.py /tmp/tiny-long            # 2,048 positions
    python examples/agents/tiny_long_context.py /tmp/tiny-long --positions 8192
    oprl train task.name=agent task.agent=examples/agents/langchain_agent.py:rollout model.path=/tmp/tiny-long

The same architecture, tokenizer and initialisation (``oprl.models.tiny.build_model``, seed 0) with more
positions, saved as a Hugging Face model directory; ``model.path`` points a run at it (no warm start: it is a
model of its own, as any ``model.path`` is). The tiny tokenizer spells about one character per token: LangChain,
openai-agents and pydantic-ai prompts with a tool or two fit 2,048 positions; smolagents' system prompts
(4,000-9,000 characters) need ``--positions 16384`` (docs/tasks.md, "Agent frameworks").
"""

from __future__ import annotations

import argparse
from pathlib import Path


def save(directory: str, positions: int = 2048) -> Path:
    """The tiny model with ``positions`` positions and its tokenizer, saved in ``directory``."""
    import torch

    from oprl.models.tiny import build_model, build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    path = Path(directory)
    build_model(tokenizer, max_positions=positions).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="where to save the copy (a Hugging Face model directory)")
    parser.add_argument("--positions", type=int, default=2048, help="context length in positions (default 2048)")
    args = parser.parse_args()
    if args.positions < 16:
        parser.error(f"--positions={args.positions}: at least 16")
    print(save(args.directory, args.positions))


if __name__ == "__main__":
    main()
