"""``base_model`` names -> local model directories: the table ``oprl serve tinker`` serves (``DEFAULT_MODELS`` plus
``--model NAME=PATH``). Each name maps to what oprl's ``model.path`` takes: ``tiny`` (the embedded model,
warm-started by oprl's recipe and cached), ``smollm2-135m-instruct``, a Hugging Face directory, a run directory
(its ``final/``), a ``.gguf`` file. The tokenizer the SDK asks for is that local directory
(``GetInfoResponse.model_data.tokenizer_id``), so nothing is fetched from the hub.
"""

from __future__ import annotations

from pathlib import Path

from oprl.errors import OprlError
from oprl.models.loading import SMOLLM2_ALIAS, dequantised_gguf, resolve_model_path
from oprl.serve.tinker.errors import UserError

DEFAULT_MODELS = {
    "oprl/tiny": "tiny",
    "tiny": "tiny",
    "smollm2-135m-instruct": "smollm2-135m-instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct",
}
"""``base_model`` name -> ``model.path``, before ``--model NAME=PATH`` adds or replaces entries."""


class ModelTable:
    """``base_model`` names -> local model directories, resolved (and the tiny model built) on first use."""

    def __init__(self, entries: dict[str, str], tiny_overrides: list[str], device: str):
        self.entries = dict(entries)
        self.tiny_overrides = list(tiny_overrides)
        self.device = device
        self.directories: dict[str, str] = {}

    def check(self, name: str) -> None:
        if name not in self.entries:
            raise UserError(f"base_model: unknown model {name!r}; this server serves {', '.join(self.entries)}")

    def servable(self) -> list[str]:
        """The names whose model can load here: every entry but those whose path needs a package (or a local
        file) that is missing (``smollm2-135m-instruct`` without its wheel or ``gguf``). Cheap: nothing is loaded,
        nothing built, no hub asked (a hub id is listed as named; its errors come at create_model)."""
        return [name for name, path in self.entries.items() if _loads_here(path)]

    def directory(self, name: str) -> str:
        self.check(name)
        if name not in self.directories:
            self.directories[name] = self._resolve(self.entries[name])
        return self.directories[name]

    def _resolve(self, path: str) -> str:
        if path == "tiny":
            return tiny_directory(self.tiny_overrides)
        local = Path(path).expanduser()
        if local.is_dir() and not (local / "config.json").is_file() and (local / "final" / "config.json").is_file():
            return str(local / "final")  # a run directory: its final model
        location, extra = resolve_model_path(path)
        if "gguf_file" in extra:
            return str(dequantised_gguf(Path(location) / extra["gguf_file"]))
        return location


def _loads_here(path: str) -> bool:
    if path == "tiny":
        return True
    if path.lower() != SMOLLM2_ALIAS and not Path(path).expanduser().exists():
        return True  # a hub id (or a path that may appear): said at create_model if it does not load
    run_final = Path(path).expanduser() / "final"
    if (run_final / "config.json").is_file():
        path = str(run_final)  # a run directory serves its final model (ModelTable._resolve)
    try:
        resolve_model_path(path)  # the alias: its wheel and gguf; a local path: its files
    except OprlError:
        return False
    return True


def tiny_directory(overrides: list[str]) -> str:
    """The embedded tiny model as ``oprl train`` builds it (warm-started on its task, cached): the default
    ``RunConfig`` with ``overrides`` (e.g. a shorter warm start)."""
    from oprl.api import resolve
    from oprl.tasks import build_task
    from oprl.trainer.warmstart import warm_started_model

    config = resolve(None, ["progress=false", *overrides])
    task = build_task(config.task)
    path = warm_started_model(config.model, config.task, config.warmstart, task, log=lambda *_: None, progress=False)
    return str(path)
