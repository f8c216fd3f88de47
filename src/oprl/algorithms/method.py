"""Deprecated names of ``spec.py``'s types, for code written against the earlier ``Method``: ``Method`` is
``Algorithm`` (``Method.of(settings, ...)`` is ``Algorithm.of``, which takes a preset's name or complete
settings), ``AdvantageParams`` is ``Advantages``. New code imports them from ``oprl.algorithms.spec``
(the stages) and ``oprl.algorithms.algorithm`` (``Algorithm``, ``Needs``)."""

from oprl.algorithms.algorithm import Algorithm as Method
from oprl.algorithms.algorithm import Needs
from oprl.algorithms.spec import Advantages as AdvantageParams

__all__ = ["AdvantageParams", "Method", "Needs"]
