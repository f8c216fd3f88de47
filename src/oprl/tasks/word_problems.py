"""A seeded generator of GSM8k-format word problems: multi-step stories with a worked answer and ``#### N``.

Each problem follows one person's count of some item through ``steps`` changes (buying more, giving some
away, ending with k times as many, splitting into equal piles), then asks for the final count. The answer
field is written the way GSM8k writes it: one line per step with a calculator annotation
``<<48/2=24>>24``, then ``#### 24``. Every intermediate value is a non-negative integer.

It exists so that the real GSM8k code path (row parsing, the ``####`` reference, the R1 reward) runs
offline in tests and CPU demos, and so that a small model has a task it can partly solve
(``synthetic_max_steps=1``, small numbers). It is not a substitute for GSM8k's language or difficulty.
Rows come out as ``{"question": ..., "answer": ...}`` dicts, exactly like a GSM8k JSONL file.
"""

from __future__ import annotations

import random

from oprl.errors import OprlError

PEOPLE = (
    ("Ava", "she"),
    ("Ben", "he"),
    ("Chloe", "she"),
    ("Dan", "he"),
    ("Emma", "she"),
    ("Farid", "he"),
    ("Grace", "she"),
    ("Hugo", "he"),
    ("Iris", "she"),
    ("Jonas", "he"),
    ("Kira", "she"),
    ("Leo", "he"),
    ("Maya", "she"),
    ("Noah", "he"),
    ("Olga", "she"),
    ("Pablo", "he"),
    ("Quinn", "she"),
    ("Ravi", "he"),
    ("Sofia", "she"),
    ("Tom", "he"),
)
ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "books",
    "pencils",
    "cookies",
    "cards",
    "shells",
    "coins",
    "flowers",
    "stamps",
    "candles",
)
FRIENDS = ("a friend", "a cousin", "a neighbour", "the teacher", "a classmate")
TIMES = {2: "twice", 3: "three times", 4: "four times"}


OPERATIONS = "+-*/"
"""The kinds of change: ``+`` buy more, ``-`` give some away, ``*`` k times as many (and the "packs of"
opening), ``/`` split into equal piles."""


def generate_rows(
    count: int,
    *,
    seed: int,
    min_steps: int = 2,
    max_steps: int = 3,
    max_value: int = 20,
    operations: str = OPERATIONS,
    exclude: set[str] | None = None,
) -> list[dict[str, str]]:
    """``count`` distinct problems (none whose question is in ``exclude``; generated ones are added to it)."""
    if not operations or set(operations) - set(OPERATIONS) or not set(operations) & set("+*"):
        raise OprlError(
            f"task.synthetic_operations: {operations!r} must be drawn from {OPERATIONS!r} and contain + or *"
        )
    if not 1 <= min_steps <= max_steps:
        raise OprlError(f"task: need 1 <= synthetic_min_steps ({min_steps}) <= synthetic_max_steps ({max_steps})")
    if max_value < 2:
        raise OprlError(f"task.synthetic_max_value: {max_value} must be >= 2")
    rng = random.Random(seed)
    seen = exclude if exclude is not None else set()
    rows: list[dict[str, str]] = []
    misses = 0  # consecutive duplicates: many in a row means the space of problems is exhausted
    while len(rows) < count:
        row = word_problem(rng, rng.randint(min_steps, max_steps), max_value, operations)
        if row["question"] in seen:
            misses += 1
            if misses > 5000:
                raise OprlError(
                    f"task: only {len(rows)} distinct word problems of the {count} requested were found for "
                    f"synthetic_max_value={max_value}, synthetic_max_steps={max_steps}; raise either or ask for fewer"
                )
            continue
        misses = 0
        seen.add(row["question"])
        rows.append(row)
    return rows


def word_problem(rng: random.Random, steps: int, max_value: int, operations: str = OPERATIONS) -> dict[str, str]:
    """One problem with ``steps`` changes (drawn from ``operations``) after the opening sentence."""
    name, pronoun = rng.choice(PEOPLE)
    item = rng.choice(ITEMS)
    subject = pronoun.capitalize()
    if "*" not in operations or rng.random() < 0.5:
        value = rng.randint(2, max_value)
        sentences = [f"{name} has {value} {item}."]
        lines = [f"{name} starts with {value} {item}."]
    else:
        packs, per_pack = rng.randint(2, max(2, max_value // 4)), rng.randint(2, max(2, max_value // 2))
        value = packs * per_pack
        sentences = [f"{name} buys {packs} packs of {item} with {per_pack} {item} in each pack."]
        lines = [f"{name} buys {packs}*{per_pack} = <<{packs}*{per_pack}={value}>>{value} {item}."]
    for _ in range(steps):
        sentence, line, value = _change(rng, subject, pronoun, item, value, max_value, operations)
        sentences.append(sentence)
        lines.append(line)
    sentences.append(f"How many {item} does {name} have now?")
    lines.append(f"#### {value}")
    return {"question": " ".join(sentences), "answer": "\n".join(lines)}


def _change(rng: random.Random, subject: str, pronoun: str, item: str, value: int, max_value: int, operations: str):
    """One random applicable change to ``value``: ``(question sentence, answer line, new value)``."""
    options = []
    if "+" in operations:
        options.append("add")
    if "-" in operations and value >= 2:
        options.append("give")
    if "*" in operations and value <= 4 * max_value:
        options.append("times")
    divisors = [k for k in (2, 3, 4) if value % k == 0 and value >= 2 * k]
    if "/" in operations and divisors:
        options.append("split")
    if not options:  # e.g. only "-" allowed but nothing left to give: add instead
        options.append("add" if "+" in operations else "times")
    kind = rng.choice(options)
    if kind == "add":
        more = rng.randint(1, max_value)
        verb = rng.choice(("buys", "finds", "is given"))
        new = value + more
        return (
            f"Then {pronoun} {verb} {more} more {item}.",
            f"After that {pronoun} has {value}+{more} = <<{value}+{more}={new}>>{new} {item}.",
            new,
        )
    if kind == "give":
        less = rng.randint(1, min(value - 1, max_value))
        new = value - less
        return (
            f"{subject} gives {less} {item} to {rng.choice(FRIENDS)}.",
            f"{subject} keeps {value}-{less} = <<{value}-{less}={new}>>{new} {item}.",
            new,
        )
    if kind == "times":
        factor = rng.choice(sorted(TIMES))
        new = value * factor
        return (
            f"After a week {pronoun} has {TIMES[factor]} as many {item} as before.",
            f"{subject} now has {value}*{factor} = <<{value}*{factor}={new}>>{new} {item}.",
            new,
        )
    parts = rng.choice(divisors)
    new = value // parts
    return (
        f"{subject} splits the {item} into {parts} equal piles and keeps one pile.",
        f"One pile holds {value}/{parts} = <<{value}/{parts}={new}>>{new} {item}.",
        new,
    )
