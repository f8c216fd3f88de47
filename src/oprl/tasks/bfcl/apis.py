"""Simulated APIs for BFCL's multi-turn problems: oprl's own file system and math API.

Written from BFCL's function documents (``bfcl_eval/data/multi_turn_func_doc/{gorilla_file_system,
math_api}.json``: names, parameters, result keys); not bfcl-eval's code. Each API is a class whose public
methods are the documented functions; a call returns a JSON-able dict (``{"error": ...}`` on misuse).
``execute`` runs one call by name with keyword arguments and turns any exception into an error result, so
a model's call can never crash the explorer. Every operation is bounded: numbers are floats (overflow is an
error), lists and strings are capped.

The file system's state is the tree it was loaded with (``{name: {"type": "directory", "contents": {...}}``
or ``{"type": "file", "content": str}``); two simulators are in the same state when their trees are equal
(the working directory is not state, as in BFCL's checker). The math API has no state.
"""

from __future__ import annotations

import copy
import inspect
import math
import statistics
from typing import Any

MAX_ITEMS = 10_000
"""Longest list of numbers a math call accepts."""
MAX_TEXT = 100_000
"""Longest file content (characters) the file system holds."""


class FileSystem:
    """GorillaFileSystem: a shell-like file system over a tree of directories and text files."""

    name = "GorillaFileSystem"

    def __init__(self, config: dict):
        ((root_name, root),) = copy.deepcopy(config["root"]).items()
        self.root_name, self.tree = root_name, root
        self._path: list[str] = []  # names from the root to the working directory

    def state(self) -> Any:
        return {self.root_name: self.tree}

    # -- helpers
    def _dir(self, path: list[str]) -> dict:
        node = self.tree
        for part in path:
            node = node["contents"][part]
        return node

    @property
    def _cwd(self) -> dict:
        return self._dir(self._path)["contents"]

    def _resolve(self, path: str) -> list[str] | None:
        """The directory path ``path`` (relative, ``..`` allowed, ``/`` absolute) leads to, or None."""
        parts = list(self._path) if not path.startswith("/") else []
        for part in path.strip("/").split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    return None
                parts.pop()
                continue
            node = self._dir(parts)["contents"].get(part)
            if node is None or node["type"] != "directory":
                return None
            parts.append(part)
        return parts

    def _file(self, name: str) -> dict | None:
        node = self._cwd.get(name)
        return node if node is not None and node["type"] == "file" else None

    @staticmethod
    def _valid(name: str) -> bool:
        return bool(name) and "/" not in name and name not in (".", "..") and len(name) <= 255

    # -- the documented functions
    def pwd(self) -> dict:
        return {"current_working_directory": "/" + "/".join([self.root_name, *self._path])}

    def ls(self, a: bool = False) -> dict:
        return {"current_directory_content": [n for n in self._cwd if a or not n.startswith(".")]}

    def cd(self, folder: str) -> dict:
        path = self._resolve(folder)
        if path is None:
            return {"error": f"cd: {folder}: No such directory"}
        self._path = path
        return {"current_working_directory": path[-1] if path else self.root_name}

    def mkdir(self, dir_name: str) -> dict:
        if not self._valid(dir_name):
            return {"error": f"mkdir: cannot create directory '{dir_name}': Invalid name"}
        if dir_name in self._cwd:
            return {"error": f"mkdir: cannot create directory '{dir_name}': File exists"}
        self._cwd[dir_name] = {"type": "directory", "contents": {}}
        return {}

    def touch(self, file_name: str) -> dict:
        if not self._valid(file_name):
            return {"error": f"touch: cannot touch '{file_name}': Invalid name"}
        if file_name in self._cwd:
            return {"error": f"touch: cannot touch '{file_name}': File exists"}
        self._cwd[file_name] = {"type": "file", "content": ""}
        return {}

    def echo(self, content: str, file_name: str | None = None) -> dict:
        if file_name is None:
            return {"terminal_output": content}
        if not self._valid(file_name) or len(content) > MAX_TEXT:
            return {"error": f"echo: cannot write to '{file_name}'"}
        node = self._cwd.get(file_name)
        if node is not None and node["type"] != "file":
            return {"error": f"echo: cannot write to '{file_name}': Is a directory"}
        self._cwd[file_name] = {"type": "file", "content": content}
        return {}

    def cat(self, file_name: str) -> dict:
        node = self._file(file_name)
        return {"file_content": node["content"]} if node else {"error": f"cat: {file_name}: No such file"}

    def find(self, path: str = ".", name: str | None = None) -> dict:
        start = self._resolve(path)
        if start is None:
            return {"error": f"find: {path}: No such directory"}
        matches: list[str] = []

        def walk(node: dict, prefix: str) -> None:
            for child, item in node["contents"].items():
                where = f"{prefix}/{child}"
                if name is None or name in child:
                    matches.append(where)
                if item["type"] == "directory":
                    walk(item, where)

        walk(self._dir(start), path.rstrip("/") or ".")
        return {"matches": matches}

    def wc(self, file_name: str, mode: str = "l") -> dict:
        node = self._file(file_name)
        if node is None:
            return {"error": f"wc: {file_name}: No such file"}
        text = node["content"]
        counts = {
            "l": (len(text.splitlines()), "lines"),
            "w": (len(text.split()), "words"),
            "c": (len(text), "characters"),
        }
        if mode not in counts:
            return {"error": f"wc: invalid mode '{mode}'"}
        return {"count": counts[mode][0], "type": counts[mode][1]}

    def sort(self, file_name: str) -> dict:
        node = self._file(file_name)
        if node is None:
            return {"error": f"sort: {file_name}: No such file"}
        return {"sorted_content": "\n".join(sorted(node["content"].splitlines()))}

    def grep(self, file_name: str, pattern: str) -> dict:
        node = self._file(file_name)
        if node is None:
            return {"error": f"grep: {file_name}: No such file"}
        return {"matching_lines": [line for line in node["content"].splitlines() if pattern in line]}

    def du(self, human_readable: bool = False) -> dict:
        def size(node: dict) -> int:
            if node["type"] == "file":
                return len(node["content"].encode())
            return sum(size(child) for child in node["contents"].values())

        total = sum(size(node) for node in self._cwd.values())
        if not human_readable:
            return {"disk_usage": f"{total} bytes"}
        unit = next((u for u, k in (("GB", 3), ("MB", 2), ("KB", 1)) if total >= 1024**k), "B")
        scale = {"GB": 1024**3, "MB": 1024**2, "KB": 1024, "B": 1}[unit]
        return {"disk_usage": f"{total / scale:.2f} {unit}"}

    def tail(self, file_name: str, lines: int = 10) -> dict:
        node = self._file(file_name)
        if node is None:
            return {"error": f"tail: {file_name}: No such file"}
        rows = node["content"].splitlines()
        return {"last_lines": "\n".join(rows[-int(lines) :] if int(lines) > 0 else [])}

    def diff(self, file_name1: str, file_name2: str) -> dict:
        first, second = self._file(file_name1), self._file(file_name2)
        if first is None or second is None:
            return {"error": f"diff: {file_name1} or {file_name2}: No such file"}
        a, b = first["content"].splitlines(), second["content"].splitlines()
        changed = [f"- {x}\n+ {y}" for x, y in zip(a, b, strict=False) if x != y]  # the rest below
        changed += [f"- {x}" for x in a[len(b) :]] + [f"+ {y}" for y in b[len(a) :]]
        return {"diff_lines": "\n".join(changed)}

    def _transfer(self, source: str, destination: str, *, keep: bool, verb: str) -> dict:
        node = self._cwd.get(source)
        if node is None:
            return {"error": f"{verb}: cannot {verb} '{source}': No such file or directory"}
        target = self._resolve(destination)
        if target is not None and destination not in ("", "."):
            contents = self._dir(target)["contents"]
            if source in contents:
                return {"error": f"{verb}: cannot {verb} '{source}': '{destination}/{source}' exists"}
            contents[source] = copy.deepcopy(node) if keep else node
            result = f"'{source}' {'copied' if keep else 'moved'} to '{destination}/{source}'"
        else:
            if not self._valid(destination) or destination in self._cwd:
                return {"error": f"{verb}: cannot {verb} '{source}' to '{destination}'"}
            self._cwd[destination] = copy.deepcopy(node) if keep else node
            result = f"'{source}' {'copied' if keep else 'moved'} to '{destination}'"
        if not keep:
            del self._cwd[source]
        return {"result": result}

    def mv(self, source: str, destination: str) -> dict:
        return self._transfer(source, destination, keep=False, verb="mv")

    def cp(self, source: str, destination: str) -> dict:
        return self._transfer(source, destination, keep=True, verb="cp")

    def rm(self, file_name: str) -> dict:
        if file_name not in self._cwd:
            return {"error": f"rm: cannot remove '{file_name}': No such file or directory"}
        del self._cwd[file_name]
        return {"result": f"'{file_name}' removed"}

    def rmdir(self, dir_name: str) -> dict:
        node = self._cwd.get(dir_name)
        if node is None or node["type"] != "directory":
            return {"error": f"rmdir: cannot remove '{dir_name}': Not a directory"}
        if node["contents"]:
            return {"error": f"rmdir: cannot remove '{dir_name}': Directory not empty"}
        del self._cwd[dir_name]
        return {"result": f"'{dir_name}' removed"}


_SI = {"": 1.0, "k": 1e3, "c": 1e-2, "m": 1e-3, "u": 1e-6, "n": 1e-9, "M": 1e6, "G": 1e9}
_IMPERIAL = {  # (from, to): factor
    ("inch", "cm"): 2.54,
    ("foot", "m"): 0.3048,
    ("yard", "m"): 0.9144,
    ("mile", "km"): 1.609344,
    ("ounce", "g"): 28.349523125,
    ("pound", "kg"): 0.45359237,
    ("gallon", "liter"): 3.785411784,
}


def _numbers(values) -> list[float]:
    if not isinstance(values, list) or not values or len(values) > MAX_ITEMS:
        raise ValueError(f"numbers must be a non-empty list of at most {MAX_ITEMS} numbers")
    return [float(v) for v in values]


class MathAPI:
    """MathAPI: stateless arithmetic and statistics; every result is ``{"result": number}``."""

    name = "MathAPI"

    def __init__(self, config: dict | None = None):
        pass

    def state(self) -> Any:
        return None

    def absolute_value(self, number: float) -> dict:
        return {"result": abs(float(number))}

    def add(self, a: float, b: float) -> dict:
        return {"result": float(a) + float(b)}

    def subtract(self, a: float, b: float) -> dict:
        return {"result": float(a) - float(b)}

    def multiply(self, a: float, b: float) -> dict:
        return {"result": float(a) * float(b)}

    def divide(self, a: float, b: float) -> dict:
        return {"error": "Cannot divide by zero"} if float(b) == 0 else {"result": float(a) / float(b)}

    def power(self, base: float, exponent: float) -> dict:
        return {"result": math.pow(float(base), float(exponent))}

    def square_root(self, number: float, precision: int) -> dict:
        if float(number) < 0:
            return {"error": "Cannot take the square root of a negative number"}
        return {"result": round(math.sqrt(float(number)), min(int(precision), 15))}

    def logarithm(self, value: float, base: float, precision: int) -> dict:
        return {"result": round(math.log(float(value), float(base)), min(int(precision), 15))}

    def round_number(self, number: float, decimal_places: int = 0) -> dict:
        return {"result": round(float(number), min(int(decimal_places), 15))}

    def percentage(self, part: float, whole: float) -> dict:
        return {"error": "Whole cannot be zero"} if float(whole) == 0 else {"result": float(part) / float(whole) * 100}

    def mean(self, numbers: list) -> dict:
        return {"result": statistics.fmean(_numbers(numbers))}

    def standard_deviation(self, numbers: list) -> dict:
        return {"result": statistics.pstdev(_numbers(numbers))}

    def max_value(self, numbers: list) -> dict:
        return {"result": max(_numbers(numbers))}

    def min_value(self, numbers: list) -> dict:
        return {"result": min(_numbers(numbers))}

    def sum_values(self, numbers: list) -> dict:
        return {"result": math.fsum(_numbers(numbers))}

    def si_unit_conversion(self, value: float, unit_in: str, unit_out: str) -> dict:
        """Between SI prefixes of one unit (``km`` -> ``m``, ``mg`` -> ``g``)."""
        if len(unit_in) < 1 or len(unit_out) < 1 or unit_in[-1] != unit_out[-1]:
            return {"error": f"cannot convert {unit_in} to {unit_out}"}
        prefix_in, prefix_out = unit_in[:-1], unit_out[:-1]
        if prefix_in not in _SI or prefix_out not in _SI:
            return {"error": f"unknown prefix in {unit_in} or {unit_out}"}
        return {"result": float(value) * _SI[prefix_in] / _SI[prefix_out]}

    def imperial_si_conversion(self, value: float, unit_in: str, unit_out: str) -> dict:
        if (unit_in, unit_out) in _IMPERIAL:
            return {"result": float(value) * _IMPERIAL[unit_in, unit_out]}
        if (unit_out, unit_in) in _IMPERIAL:
            return {"result": float(value) / _IMPERIAL[unit_out, unit_in]}
        if (unit_in, unit_out) == ("celsius", "fahrenheit"):
            return {"result": float(value) * 9 / 5 + 32}
        if (unit_in, unit_out) == ("fahrenheit", "celsius"):
            return {"result": (float(value) - 32) * 5 / 9}
        return {"error": f"cannot convert {unit_in} to {unit_out}"}


APIS = {api.name: api for api in (FileSystem, MathAPI)}
"""The simulated BFCL API classes by their BFCL class name."""


def functions_of(api) -> dict[str, Any]:
    """The documented functions of an API instance: its public methods except ``state``."""
    return {n: m for n, m in inspect.getmembers(api, inspect.ismethod) if not n.startswith("_") and n != "state"}


def execute(functions: dict[str, Any], name: str, arguments: dict) -> dict:
    """Run one call; unknown functions, bad arguments and any failure are ``{"error": ...}`` results."""
    function = functions.get(name)
    if function is None:
        return {"error": f"unknown function {name!r}"}
    try:
        inspect.signature(function).bind(**arguments)
        return function(**arguments)
    except (TypeError, ValueError, AttributeError, ArithmeticError, KeyError, statistics.StatisticsError) as exc:
        return {"error": f"{name}: {type(exc).__name__}: {str(exc)[:200]}"}
