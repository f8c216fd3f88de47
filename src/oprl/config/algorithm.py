"""The ``algorithm`` section of the run config: a named preset plus per-knob overrides, generated from the knobs'
one declaration (``oprl.algorithms.spec``). The ``Algorithm`` of a whole run's config is
``oprl.config.run.algorithm_of`` (it reads the rollout and teacher sections too, so it lives beside ``RunConfig``:
no import back to ``run``, not even a type-only one).

Every field but ``preset`` is a knob of ``spec.py``: its default, help text (``oprl config --help``), range and help
group are read from there, so this module declares none of them. A knob a preset sets is ``<type> | None`` here
(None = the preset's value, filled by ``oprl.config.run.resolve_algorithm``); a run knob (``kl_coef``, ...) has its
default and its range as pydantic constraints. The valid strings of a choice knob are the live registries of
``oprl.algorithms`` (plug-ins join them through ``oprl.config.choices``), so this module holds no list of names.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, create_model

from oprl.algorithms import KNOBS, REGISTRIES
from oprl.algorithms.spec import FIELDS, default
from oprl.config.choices import CHOICE_SETTINGS, resolve_choice
from oprl.tasks.section import Section as _Section

_TYPES: dict[str, Any] = {"bool": bool, "int": int, "float": float, "str": str, "float | None": float | None}
"""The config type of each type a knob is declared with (the annotations of ``spec.py`` are strings)."""


class _AlgorithmSection(_Section):
    """A named preset (docs/paper.md#presets, docs/algorithms.md) plus optional per-setting overrides; ``None`` =
    the preset's value.

    The valid strings come from the registries in ``oprl.algorithms`` and every value is checked by
    ``oprl.algorithms.validate_settings`` (ranges included) when the preset is resolved. ``oprl config --help``
    lists the fields in the groups below, each with the preset's value and, where oprl's own default has a
    reason or a source, that reason (the ``why`` of its declaration in ``oprl.algorithms.spec``)."""

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {"preset": ("preset",)} | {
        group: tuple(name for name, knob in KNOBS.items() if knob.group == group)
        for group in dict.fromkeys(knob.group for knob in KNOBS.values())
    }
    """The help's groups of this section's fields (``RolloutConfig.GROUPS`` does the same for ``rollout``), in the
    order of the knobs' declarations."""

    preset: str = "grpo"
    """Algorithm preset: reinforce, grpo, rec-oneside-is, rec-oneside-nois, rec-twoside-*, rec-ring-*, the
    ``-wide`` variants, opmd, asymre, red-drop, red-weight, ... (``oprl.algorithms.PRESETS``, docs/algorithms.md)."""

    if TYPE_CHECKING:  # the knobs' fields are generated below; the type checker sees each as Any

        def __getattr__(self, name: str) -> Any: ...


def _annotation(name: str) -> Any:
    """The config type of knob ``name``: its declared type, a choice as the live registry's names."""
    knob = KNOBS[name]
    if knob.choices and name in CHOICE_SETTINGS:  # a plug-in may name a function: resolved when validated
        return Annotated[str, AfterValidator(functools.partial(resolve_choice, name))]
    if knob.choices:
        return Literal[tuple(REGISTRIES[name])]
    return _TYPES[str(FIELDS[name].type)]


def _field(name: str) -> tuple[Any, Any]:
    knob, kind = KNOBS[name], _annotation(name)
    meaning = " ".join(knob.meaning.split())
    if knob.in_preset:
        return kind | None, Field(None, description=meaning)
    bounds: dict[str, Any] = dict(knob.range.bounds) if knob.range else {}
    return kind, Field(default(name), description=meaning, **bounds)


AlgorithmConfig = create_model(  # type: ignore[call-overload]
    "AlgorithmConfig",
    __base__=_AlgorithmSection,
    __module__=__name__,
    __doc__=_AlgorithmSection.__doc__,
    **{name: _field(name) for name in KNOBS},
)
"""The ``algorithm`` section: ``preset`` and one field per knob of ``oprl.algorithms.spec``, in their declaration
order (``config.yaml``'s; the help prints them by ``GROUPS``)."""
