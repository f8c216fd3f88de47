"""Loading a run config: YAML plus dotted ``key=value`` overrides, one-line validation errors, saving, help text.

Validation errors come out as one line naming the key and, for unknown keys, the closest valid ones, echoing
at most ``ECHO_CHARS`` of the offending value. The fully resolved tree (preset expanded) is written to
``<run_dir>/config.yaml``.

YAML is read by ``read_yaml`` (the file and every override value): safe tags only, a key given twice in one
mapping is an error naming it and both lines (PyYAML keeps the last one silently, so a second ``rollout:``
section would drop the first one's keys), and anchors/aliases are allowed while the document they expand to
stays under ``MAX_YAML_NODES`` nodes (a "billion laughs" document, 10^9 nodes from a few lines, is refused
before it is built).

No YAML boolean trap in text fields, two rules: booleans are YAML 1.2's, ``true`` and ``false`` only (YAML 1.1,
PyYAML's default, also reads ``yes``, ``no``, ``on``, ``off``, ``y`` and ``n`` as booleans, so
``judge.yes_text=yes`` was True; a boolean field still takes ``yes``, pydantic reads the text); and a boolean
or a number given to a field whose type is text (``str``, ``str | None``, ``list[str]``) is the text as written
(``judge.yes_text=true`` is "true", ``judge.no_text=0`` is "0"; ``_as_text``), for every section.
"""

from __future__ import annotations

import difflib
import functools
import re
import reprlib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Tag, ValidationError

from oprl.algorithms.algorithm import Algorithm
from oprl.algorithms.presets import PRESETS
from oprl.algorithms.registry import unknown_name_message
from oprl.algorithms.spec import KNOBS, default
from oprl.config.algorithm import AlgorithmConfig
from oprl.config.run import RunConfig, _refuse_renamed, resolve_algorithm
from oprl.errors import OprlError
from oprl.tasks.arithmetic import ArithmeticTaskConfig  # noqa: F401  (re-exported: oprl.config is the one entry point)
from oprl.tasks.gsm8k import GSM8kTaskConfig  # noqa: F401
from oprl.tasks.math_problems import MathTaskConfig  # noqa: F401


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """YAML file (optional) + ``a.b=value`` overrides -> validated ``RunConfig`` with the preset resolved."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    written: dict[str, str] = {}
    for item in overrides:
        _apply_override(data, item, written)
    _refuse_renamed(data)
    _as_text(data, RunConfig, written)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise OprlError(_describe(exc)) from None
    return resolve_algorithm(config)


def save_config(config: RunConfig, path: Path) -> None:
    from oprl.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def read_saved(saved: dict[str, Any]) -> dict[str, Any]:
    """A run's saved ``config.yaml`` as today's loader reads it: every key added since the run was saved gets its
    default (an algorithm key its preset's value), so a run of an older tree and one of today's with the same
    settings compare equal (the SmolLM2 stale arena spans trees from before ``rollout.engine_process``,
    ``algorithm.ess_lr`` and ``dual_clip``). A saved config that no longer validates (a key since renamed or
    removed) is returned as saved: still read, only not completed."""
    try:
        return resolve_algorithm(RunConfig.model_validate(saved)).model_dump(mode="json")
    except (ValidationError, OprlError):
        return saved


ECHO_CHARS = 200
"""At most this much of a value is quoted in an error message."""
MAX_YAML_NODES = 100_000
"""Largest document a config may expand to, counting every alias use as a copy (real configs: ~300 nodes)."""


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and reads booleans as YAML 1.2 does (module docstring)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` then explicit keys: overriding merged keys is what merges are for
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {echo(key)} given twice (lines {seen[key]} and {line})", key_node.start_mark
                )
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.yaml_implicit_resolvers = {  # SafeLoader's, less its YAML 1.1 booleans
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def read_yaml(text: str) -> Any:
    """``text`` parsed as YAML under the rules of the module docstring; ``yaml.YAMLError`` otherwise."""
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_YAML_NODES:
            raise yaml.YAMLError(f"anchors and aliases expand it to over {MAX_YAML_NODES:,} values; write it out")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes of the document under ``node`` with every alias expanded, capped just above ``MAX_YAML_NODES``.
    ``sizes`` memoises by node identity (an alias is the same node object), so this is linear in the text.
    A node whose size is still being computed counts 1: a recursive alias, which the constructor handles."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = 1
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children: list[yaml.Node] = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [item for pair in node.value for item in pair]
    else:
        children = []
    for child in children:
        total = min(total + _expanded_size(child, sizes), MAX_YAML_NODES + 1)
    sizes[id(node)] = total
    return total


def echo(value: Any) -> str:
    """``repr(value)`` cut to ``ECHO_CHARS``, without building the whole repr of a huge value."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = ECHO_CHARS
    short.maxlist = short.maxdict = short.maxtuple = short.maxset = 20
    short.maxlevel = 3
    text = short.repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise OprlError(f"config file {path}: not found")
    try:
        data = read_yaml(path.read_text())
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer over Python's 4,300 digits
        mark = getattr(exc, "problem_mark", None)
        where = f": line {mark.line + 1}" if mark else ""
        problem = str(getattr(exc, "problem", None) or exc)[:ECHO_CHARS]
        raise OprlError(f"config file {path}{where}: malformed YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OprlError(f"config file {path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def _apply_override(data: dict[str, Any], item: str, written: dict[str, str] | None = None) -> None:
    """``key=value`` into ``data``, the value read as YAML; ``written[key]`` keeps the text as given (what a text
    field receives, ``_as_text``)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise OprlError(f"override {echo(item)}: expected key=value (for example algorithm.preset=grpo)")
    try:
        value = read_yaml(raw) if raw else ""
    except (yaml.YAMLError, ValueError):
        value = raw
    if written is not None:
        written[key] = raw
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise OprlError(f"override {echo(item)}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def _as_text(data: dict[str, Any], model: type[BaseModel], written: dict[str, str], prefix: str = "") -> None:
    """In place: each boolean or number that ``data`` gives a text field of ``model`` (recursively, through
    sections and the task union's chosen member) becomes its text: as written on the command line when it
    came from there (``written``), else ``true``/``false`` or the number's ``str``."""
    for name, value in data.items():
        field = model.model_fields.get(name) if isinstance(name, str) else None
        if field is None:
            continue  # an unknown key: validation names it
        key = f"{prefix}{name}"
        section = _section_of(field)
        if isinstance(section, dict) and isinstance(value, dict):  # a tagged union: the member value names
            default = field.get_default(call_default_factory=True)
            member = section.get(value.get("name", getattr(default, "name", None)))
            if member is not None:
                _as_text(value, member, written, f"{key}.")
        elif isinstance(section, type) and isinstance(value, dict):
            _as_text(value, section, written, f"{key}.")
        elif section is None and _is_text(field.annotation):
            if isinstance(value, list) and list[str] in typing.get_args(field.annotation):
                data[name] = [_text(item, None) for item in value]
            else:
                data[name] = _text(value, written.get(key))


def _is_text(annotation: Any) -> bool:
    """A field typed ``str``, ``str | None`` or ``str | list[str]``: no boolean or number belongs in it."""
    accepted = {annotation, *typing.get_args(annotation)}
    return str in accepted and not accepted & {bool, int, float}


def _text(value: Any, written: str | None) -> Any:
    if isinstance(value, bool):
        return written if written is not None else str(value).lower()
    if isinstance(value, (int, float)):
        return written if written is not None else str(value)
    return value


def _describe(exc: ValidationError) -> str:
    """First validation error as one line: the dotted key, what is wrong, and suggestions."""
    error = exc.errors()[0]
    parts, _, _ = _walk(error["loc"])
    key = ".".join(parts)
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if error["type"] == "extra_forbidden":
        _, section, chosen = _walk(error["loc"][:-1])
        valid = list(section.model_fields) if isinstance(section, type) and issubclass(section, BaseModel) else []
        member = f" (not a key of {', '.join(chosen)})" if chosen else ""
        return f"config: unknown key {key!r}{member}{_closest(str(error['loc'][-1]), valid)}{more}"
    if error["type"] == "union_tag_invalid":
        _, members, _ = _walk(error["loc"])
        tag = str(error.get("ctx", {}).get("tag", error.get("input")))
        return f"config: {key}.name: unknown {key} {tag!r}{_closest(tag, members or [])}{more}"
    return f"config: {key}: {error['msg']} (got {echo(error.get('input'))}){more}"


def _walk(loc) -> tuple[list[str], Any, list[str]]:
    """For an error location: its dotted-key parts (union tags dropped); what it points at (a section class,
    a ``{tag: section class}`` dict for a tagged union such as ``task``, or None for a leaf); and the union
    members it passed through, as ``task.name=gsm8k``."""
    node: Any = RunConfig
    parts: list[str] = []
    chosen: list[str] = []
    for part in loc:
        if isinstance(node, dict):  # inside a tagged union, pydantic puts the tag in the location
            node = node.get(str(part))
            chosen.append(f"{'.'.join(parts)}.name={part}")
            continue
        parts.append(str(part))
        field = node.model_fields.get(str(part)) if isinstance(node, type) and issubclass(node, BaseModel) else None
        node = _section_of(field) if field is not None else None
    return parts, node, chosen


def _section_of(field) -> Any:
    """The section class of a field, ``{tag: class}`` for a tagged union of sections, else None."""
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    members = {
        meta.tag: typing.get_args(arg)[0]
        for arg in typing.get_args(annotation)
        for meta in getattr(arg, "__metadata__", ())
        if isinstance(meta, Tag)
    }
    return members or None


def _closest(name: str, valid) -> str:
    valid = list(valid)
    near = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    if near:
        return f"; did you mean {', '.join(near)}?"
    return f"; valid: {', '.join(valid)}"


def describe_fields(
    model: type[BaseModel] = RunConfig, prefix: str = "", note: str = "", preset: str = "grpo"
) -> list[str]:
    """``key = default: meaning`` lines for every leaf option, for ``oprl config --help``; the members of a tagged
    union (the task section) are listed one after another, each line saying which member it belongs to. A section
    that groups its fields (``RolloutConfig.GROUPS``) has a ``# rollout: <group>`` heading over each group.

    One source for every default: an algorithm setting left ``None`` shows ``preset``'s value
    (``oprl.algorithms.Algorithm.of``, the resolver a run uses), a ``default_factory`` field its built value."""
    lines = []
    for heading, names in _groups(model):
        if heading:
            lines.append(f"# {prefix.rstrip('.')}: {heading}")
        lines.extend(_field_lines(model, names, prefix, note, preset))
    return lines


def _groups(model: type[BaseModel]) -> list[tuple[str, list[str]]]:
    """A section's fields as ``(heading, names)``: one group without a heading, or the groups its ``GROUPS``
    names (``RolloutConfig``), in that order, with the fields in none of them last under ``other``."""
    declared: dict[str, tuple[str, ...]] = getattr(model, "GROUPS", {})
    if not declared:
        return [("", list(model.model_fields))]
    groups = [(heading, [n for n in model.model_fields if n in names]) for heading, names in declared.items()]
    grouped = {n for _, names in groups for n in names}
    other = [n for n in model.model_fields if n not in grouped]
    return groups + ([("other", other)] if other else [])


def _field_lines(model: type[BaseModel], names: list[str], prefix: str, note: str, preset: str) -> list[str]:
    lines = []
    for name in names:
        field = model.model_fields[name]
        section = _section_of(field)
        if isinstance(section, dict):
            for tag, member in section.items():
                lines.extend(describe_fields(member, f"{prefix}{name}.", f" [{name}.name={tag}]", preset))
        elif section is not None:
            lines.extend(describe_fields(section, f"{prefix}{name}.", note, preset))
        else:
            value = field.get_default(call_default_factory=True)
            doc = " ".join((field.description or "").split())
            if model is AlgorithmConfig and name != "preset":  # the preset's value and the knob's reason
                value = _preset_settings(preset)[name]
                reason = KNOBS[name].why
                if reason:
                    doc += f" [oprl's default {default(name)!r}: {reason}]"
            elif model is AlgorithmConfig:
                value = preset
            lines.append(f"{prefix}{name} = {value!r}{note}: {doc}")
    return lines


@functools.cache
def _preset_settings(preset: str) -> dict[str, Any]:
    """Every knob's value under ``preset`` (``Algorithm.of``), once per preset for the help's many lines."""
    return Algorithm.of(preset).settings()


def help_lines(selectors: Sequence[str] = ()) -> list[str]:
    """``oprl config --help [SELECTOR ...]``: ``describe_fields`` narrowed to what the selectors name.

    ``algorithm.preset=NAME`` shows that preset's values (the algorithm section); ``task.name=NAME`` that task's
    fields; a bare key (``rollout``, ``algorithm.eps_low``) the options under it. Several selectors add up;
    a selector that matches nothing raises ``OprlError`` naming it and the valid sections."""
    preset, filters = "grpo", list[tuple[str, str]]()
    for item in selectors:
        key, _, value = item.partition("=")
        if key == "algorithm.preset" and value:
            if value not in PRESETS:
                raise OprlError(f"config --help: {unknown_name_message('preset', value, list(PRESETS))}")
            preset = value
            filters.append(("key", "algorithm"))
        elif key.endswith(".name") and value:
            filters.append(("member", f" [{key}={value}]"))
        else:
            filters.append(("key", key))
        if not any(_selected(line, *filters[-1]) for line in describe_fields(preset=preset)):
            sections = ", ".join(RunConfig.model_fields)
            raise OprlError(f"config --help: nothing matches {item!r}; sections: {sections}")
    lines = describe_fields(preset=preset)
    if not filters:
        return lines
    kept: list[str] = []
    heading = None  # a group heading is shown when a line under it is
    for line in lines:
        if line.startswith("# "):
            heading = line
        elif any(_selected(line, *chosen) for chosen in filters):
            if heading is not None and line.startswith(heading[2:].split(":")[0] + "."):
                kept.append(heading)
            heading = None
            kept.append(line)
    return kept


def _selected(line: str, kind: str, arg: str) -> bool:
    """Whether a help line is under key ``arg`` (kind ``key``) or belongs to union member ``arg`` (``member``)."""
    if kind == "member":
        return arg in line.split(":", 1)[0]
    return line.startswith((f"{arg}.", f"{arg} ="))
