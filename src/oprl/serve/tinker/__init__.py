"""A Tinker-compatible server: the Tinker SDK and tinker-cookbook recipes train oprl's models through it
(docs/tinker.md). ``oprl serve tinker`` runs it; ``build_server`` / ``create_app`` embed it.

The names below load on first use (PEP 562): importing a submodule (``backend``, ``sampling``, ``losses``, the
compute a GPU worker runs) does not import the HTTP side (``app``, ``cli``: fastapi, uvicorn, the SDK)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oprl.serve.tinker.app import TinkerServer, create_app
    from oprl.serve.tinker.cli import build_server, main

__all__ = ["TinkerServer", "build_server", "create_app", "main"]
_HOMES = {"TinkerServer": "app", "create_app": "app", "build_server": "cli", "main": "cli"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:  # also how ``from oprl.serve.tinker import wire`` finds the submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
