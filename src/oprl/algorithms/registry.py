"""Name lookup shared by every registry in ``oprl.algorithms``.

Each kind of option (clip mode, weight, baseline, aggregation, ...) lives in a literal dict in the module
that implements it; the dict keys are the config strings. This module only turns a bad key into a
``ValueError`` that lists the valid ones and suggests the closest. It holds no registry itself.
"""

import difflib
from collections.abc import Mapping
from typing import TypeVar

Value = TypeVar("Value")


def unknown_name_message(kind: str, name: object, valid: list[str]) -> str:
    """One line: what was wrong, the closest valid name (if any) and every valid name."""
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; valid values: {', '.join(valid)}"


def lookup(registry: Mapping[str, Value], name: str, kind: str) -> Value:
    """``registry[name]``, or a ``ValueError`` naming ``kind`` and listing the valid keys."""
    if name not in registry:
        raise ValueError(unknown_name_message(kind, name, list(registry)))
    return registry[name]
