"""Writes examples/arithmetic_train.jsonl and examples/arithmetic_test.jsonl: your own data, as oprl reads it.

Rows are ``{"prompt": "7+3-5=", "reference": "5"}``: three one-digit operands joined by ``+`` or ``-``. The test
problems are none of the training ones (4,000 expressions exist; 2,500 train, 300 test, disjoint), so the test
accuracy measures what the model learnt, not what it remembers: with fewer training rows (1,000) the tiny model's
warm start memorised its references and GRPO then moved the test accuracy down while the training reward rose.

    python examples/make_arithmetic_data.py        # the committed files (seed 7)
"""

import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN, TEST, SEED = 2500, 300, 7


def main() -> None:
    sign = {"+": 1, "-": -1}
    problems = [
        (f"{a}{x}{b}{y}{c}=", a + sign[x] * b + sign[y] * c)
        for a, b, c in itertools.product(range(10), repeat=3)
        for x, y in itertools.product("+-", repeat=2)
    ]
    random.Random(SEED).shuffle(problems)
    for name, rows in (("train", problems[:TRAIN]), ("test", problems[TRAIN : TRAIN + TEST])):
        lines = [json.dumps({"prompt": prompt, "reference": str(value)}) for prompt, value in rows]
        (HERE / f"arithmetic_{name}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
