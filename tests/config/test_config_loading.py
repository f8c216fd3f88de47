"""Loading a run config (``oprl.config.loading``): YAML files read safely, one line naming the culprit (the file
and line, the key), and ``save_config`` / ``load_config`` round trips. (Moved here from tests/test_cli.py: the
first six tests, through ``oprl train``.)"""

import time
from pathlib import Path

import pytest

from oprl.cli import main
from oprl.config import load_config, save_config
from oprl.config.loading import read_yaml
from oprl.errors import OprlError

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"


@pytest.fixture
def bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: [1, 2\nsteps: 3\n")
    return path


def test_malformed_yaml_names_file_and_line(bad_yaml, capsys):
    assert main(["train", str(bad_yaml)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad_yaml) in err and "line" in err and len(err.splitlines()) == 1


def test_yaml_top_level_must_be_mapping(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert main(["train", str(path)]) == 2
    assert "mapping" in capsys.readouterr().err


BILLION_LAUGHS = (
    "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
    + "run_name: *i\n"
)


def test_billion_laughs_yaml_is_refused_fast(tmp_path, capsys):
    """9 lines that expand to 9^9 strings: refused before they are built, in well under a second."""
    path = tmp_path / "laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    started = time.perf_counter()
    assert main(["train", str(path)]) == 2
    assert time.perf_counter() - started < 1.0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "anchors and aliases expand it" in err and str(path) in err


def test_small_aliases_still_work(tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("defaults: &d {group_size: 4, max_new_tokens: 6}\nrollout:\n  <<: *d\n  group_size: 8\n")
    data = read_yaml(path.read_text())
    assert data["rollout"] == {"group_size": 8, "max_new_tokens": 6}  # a merge, then an explicit key


def test_duplicate_section_is_refused_naming_it(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text("steps: 3\nrollout:\n  group_size: 4\nseed: 1\nrollout:\n  max_new_tokens: 8\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'rollout' given twice (lines 2 and 5)" in err


def test_errors_echo_at_most_200_characters_of_a_value(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text("rollout:\n  group_size: " + "x" * 1_000_000 + "\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rollout.group_size" in err and len(err) < 400


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("rollout:\n  gruop_size: 4\n", "config: unknown key 'rollout.gruop_size'; did you mean group_size?"),
        ("steps: many\n", "config: steps: Input should be a valid integer, unable to parse string as an integer"),
        ("rollout:\n  top_p: [1]\n", "config: rollout.top_p: Input should be a valid number (got [1])"),
        ("task:\n  name: gsm8k\n  bogus: 1\n", "config: unknown key 'task.bogus' (not a key of task.name=gsm8k)"),
    ],
)
def test_a_yaml_file_with_an_unknown_key_or_a_wrong_type_is_one_line_naming_the_key(tmp_path, text, line):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(OprlError) as caught:
        load_config(path)
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)


def test_save_config_then_load_config_gives_the_same_config(tmp_path):
    config = load_config(
        None,
        ["algorithm.preset=opmd", "algorithm.eps_high=2.5", "rollout.top_k=20", "task.name=gsm8k", "run_name=rt"],
    )
    save_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == config and again.algorithm.eps_high == 2.5 and again.task.name == "gsm8k"
    assert again.model_dump(mode="json") == config.model_dump(mode="json")
    save_config(again, tmp_path / "again.yaml")  # a fixed point: the saved text is the same
    assert (tmp_path / "again.yaml").read_text() == (tmp_path / "config.yaml").read_text()


def _text_keys():
    """Every text field of the run's config (``str``, ``str | None``, ``list[str]``): dotted key, extra settings
    that select its section (the task union's member)."""
    from pydantic import BaseModel

    from oprl.config import RunConfig
    from oprl.config.loading import _is_text, _section_of

    def walk(model: type[BaseModel], prefix: str, chosen: list[str]):
        for name, field in model.model_fields.items():
            section = _section_of(field)
            if isinstance(section, dict):
                for tag, member in section.items():
                    yield from walk(member, f"{prefix}{name}.", [f"{prefix}{name}.name={tag}"])
            elif section is not None:
                yield from walk(section, f"{prefix}{name}.", chosen)
            elif _is_text(field.annotation) and not (name == "name" and prefix == "task."):  # task.name: the tag
                yield f"{prefix}{name}", chosen

    return list(walk(RunConfig, "", []))


TEXT_KEYS = _text_keys()


@pytest.mark.parametrize("key, chosen", TEXT_KEYS, ids=[" ".join([*c, k]) for k, c in TEXT_KEYS])
def test_yaml_booleans_and_numbers_are_text_in_every_text_field(key, chosen):
    """#53: `judge.yes_text=yes` was the boolean True ("Input should be a valid string"). Now every text field
    takes yes/no/on/off, true and numbers as the text written, on the command line as in a file."""
    assert len(TEXT_KEYS) > 20  # the walk found the fields (judge.*, model.path, run_name, task.*, ...)
    for written in ("yes", "no", "on", "off", "true", "007"):
        try:
            config = load_config(None, [*chosen, f"{key}={written}"])
        except OprlError as exc:  # the field's own rule may refuse the value, never its type
            assert "valid string" not in str(exc) and "got True" not in str(exc), str(exc)
            continue
        node = config
        for part in key.split("."):
            node = getattr(node, part)
        assert node == written or node == [written], (key, written, node)


def test_a_yaml_file_reads_yes_as_text_and_booleans_still_take_it(tmp_path):
    path = tmp_path / "judge.yaml"
    path.write_text("judge:\n  path: tiny\n  yes_text: yes\n  no_text: no\nprogress: off\ntensorboard: no\n")
    config = load_config(path)
    assert (config.judge.yes_text, config.judge.no_text) == ("yes", "no")
    assert config.progress is False and config.tensorboard is False
    assert read_yaml("a: yes\nb: true\nc: 1.5") == {"a": "yes", "b": True, "c": 1.5}


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_an_example_config_runs_again_under_a_fresh_name(example):
    """#71: the examples fixed their run_name, so the docs' own command failed the second time it was run
    ("already holds a run"). Each one names no run (the default name carries the time), or says it overwrites."""
    config = load_config(EXAMPLES / example)
    assert config.run_name is None or config.overwrite, f"{example}: run_name {config.run_name} without overwrite"
