"""The tables of the algorithm knobs by name, generated from their one declaration (``spec.py``): kept for the
code that reads settings as dicts (the presets, the integrations with TRL, verl and the Tinker server).

A default is changed in ``spec.py``, nowhere else; this module declares nothing.
"""

from typing import Any

from oprl.algorithms.spec import Advantages, Distill, Gate, StepSize, knob_names, preset_defaults

ALGORITHM_DEFAULTS: dict[str, Any] = preset_defaults()
"""Every knob a preset sets -> its default (``spec.preset_defaults``): the presets start from it."""
ADVANTAGE_KEYS: tuple[str, ...] = knob_names(Advantages)
"""Settings of ``group_advantages`` (``advantage_settings``); the loss's are ``losses.SETTING_FIELDS``."""
DISTILL_KEYS: tuple[str, ...] = knob_names(Distill)
"""Settings of ``distill_advantages``: the trainer calls it when ``distill_coef`` > 0 (rows need teacher log-probs)."""
TRAINER_KEYS: tuple[str, ...] = knob_names(StepSize) + knob_names(Gate)
"""Settings of the stages around the loss that only oprl's trainer runs: the step-size rule (``ess_lr``) and the
Kondo gate (``kondo_*``)."""


__all__ = ["ADVANTAGE_KEYS", "ALGORITHM_DEFAULTS", "DISTILL_KEYS", "TRAINER_KEYS"]
