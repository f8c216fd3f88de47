"""Algorithm settings whose value names a function: built in, or a plug-in found without editing oprl.

``algorithm.clip_mode``, ``weight``, ``ratio_level``, ``regularizer``, ``loss_agg``, ``objective``, ``baseline``
and ``drop`` name an entry of their registry in ``oprl.algorithms`` (``REGISTRIES``). A name resolves through
``oprl.plugins``, the one loader of every plug-in kind: (1) the registry as it is now (an entry added at run
time counts), (2) an installed package's entry point in the kind's group (``oprl.clip_modes``,
``oprl.weights``, ... : ``oprl.plugins.GROUPS``), (3) an import path ``package.module:function`` or
``path/to/file.py:function``. A plug-in found by (2) or (3) is added to the registry under the name as given,
in the process that resolves it, so ``policy_loss``'s own lookup finds it there; the name itself is what the
config keeps (``config.yaml`` records it and a resume resolves it again). Each process that computes a loss
resolves the names again (``register_choices``, called by ``algorithm_of``): worker processes and Ray
actors receive the config, not the parent's registries.

Deliberately not here: what the functions compute (``oprl.algorithms``), their signatures (docs/algorithms.md).
"""

from __future__ import annotations

from typing import Any

from oprl import plugins
from oprl.algorithms import REGISTRIES, DropRule
from oprl.errors import OprlError

CHOICE_SETTINGS = ("drop", "baseline", "clip_mode", "weight", "ratio_level", "regularizer", "loss_agg", "objective")


def resolve_choice(key: str, name: str) -> str:
    """``name`` once ``REGISTRIES[key]`` holds it (a plug-in is loaded and added); one ``OprlError`` line
    naming ``algorithm.<key>`` when it names nothing, does not import, or is not what the registry holds."""
    registry = REGISTRIES[key]
    if name in registry:
        return name
    found = plugins.resolve(key, name, registry, key=f"algorithm.{key}", what="function")
    if key == "drop":  # a drop rule is DropRule(function, recenter)
        if not isinstance(found, DropRule):
            raise OprlError(f"algorithm.drop: {name!r} is not an oprl.algorithms.DropRule")
    elif not callable(found):
        raise OprlError(f"algorithm.{key}: {name!r} is not a function")
    registry[name] = found
    return name


def register_choices(settings: dict[str, Any]) -> None:
    """Resolve every choice setting of ``settings`` in this process (``resolve_choice``)."""
    for key in CHOICE_SETTINGS:
        if settings.get(key) is not None:
            resolve_choice(key, settings[key])
