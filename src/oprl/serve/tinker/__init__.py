"""A Tinker-compatible server: the Tinker SDK and tinker-cookbook recipes train oprl's models through it
(docs/tinker.md). ``oprl serve tinker`` runs it; ``build_server`` / ``create_app`` embed it."""

from oprl.serve.tinker.app import TinkerServer, create_app
from oprl.serve.tinker.cli import build_server, main

__all__ = ["TinkerServer", "build_server", "create_app", "main"]
