"""``torch = lazy_import("torch", globals())``: a module bound on first use, so that light commands stay light.

``oprl config``, ``oprl --help`` and every subcommand's ``--help`` read the config tree, whose option lists
come from the registries in ``oprl.algorithms`` and ``oprl.rollout``; those modules compute with torch
(1.3-1.6 s to import on the 2-core machine), but only inside their functions. They bind ``torch`` to a
stand-in: the first attribute read (``torch.zeros``) imports the module the ordinary way (the one entry
in ``sys.modules``, shared with every plain ``import torch``) and rebinds the module's global to it, so
every later lookup is the plain module. The stand-in is not a module and sits in no ``sys.modules``: tools
that walk the loaded modules (``inspect.getmodule``, pydantic's docstring reader) never trigger the import.
"""

from __future__ import annotations

import importlib
from typing import Any


class _Deferred:
    """Stands for module ``name`` in ``namespace`` (a module's globals) until an attribute is read."""

    def __init__(self, name: str, namespace: dict[str, Any]):
        self._name, self._namespace = name, namespace

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self._name)
        self._namespace[self._name.rsplit(".", 1)[-1]] = module
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_import(name: str, namespace: dict[str, Any]) -> Any:
    """The module ``name`` if it is imported already, else a stand-in that imports it on first use and then
    replaces itself in ``namespace`` under the module's last name component (``torch``)."""
    import sys

    return sys.modules.get(name) or _Deferred(name, namespace)
