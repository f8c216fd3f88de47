"""``oprl config --help``: the rollout options come in headed groups (sampling / reward shaping / multi-turn /
caches), every rollout field under exactly one of them; every default from its one source; selectors."""

from oprl.cli import main
from oprl.config import RolloutConfig, help_lines
from oprl.config.loading import describe_fields

GROUPS = ["sampling", "reward shaping", "multi-turn", "caches"]


def _grouped(lines: list[str]) -> dict[str, str]:
    """``{field: group}`` from help lines, failing on a field listed twice or before any heading."""
    under: dict[str, str] = {}
    group = None
    for line in lines:
        if line.startswith("# "):
            group = line.split(": ", 1)[1]
            continue
        key = line.split(" = ", 1)[0].removeprefix("rollout.")
        assert group is not None and key not in under, line
        under[key] = group
    return under


def test_every_rollout_field_is_under_exactly_one_of_the_four_groups(capsys):
    assert main(["config", "--help", "rollout"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("# ")] == [f"# rollout: {g}" for g in GROUPS]
    under = _grouped(lines)
    assert list(under) == list(RolloutConfig.model_fields)  # each field once, the class in group order
    assert under["top_p"] == "sampling" and under["overlong_buffer"] == "reward shaping"
    assert under["max_turns"] == "multi-turn" and under["kv_cache_gb"] == "caches"
    assert [name for names in RolloutConfig.GROUPS.values() for name in names] == list(RolloutConfig.model_fields)


def test_a_field_in_no_group_is_listed_under_other():
    class Wider(RolloutConfig):
        new_knob: int = 1
        """A field added without a group."""

    lines = describe_fields(Wider, "rollout.")
    assert lines[-2:] == ["# rollout: other", "rollout.new_knob = 1: A field added without a group."]


def test_whole_help_and_selectors_keep_the_headings_of_what_they_show():
    text = help_lines()
    first = text.index("# rollout: sampling")
    assert text[first + 1].startswith("rollout.group_size = 8:")
    from oprl.config.algorithm import AlgorithmConfig

    groups = len(GROUPS) + len(AlgorithmConfig.GROUPS)  # no other section has groups
    assert sum(line.startswith("# ") for line in text) == groups
    assert help_lines(["rollout.episode_timeout", "optim.lr"]) == [
        "# rollout: multi-turn",
        *[line for line in text if line.startswith(("rollout.episode_timeout =", "optim.lr ="))],
    ]


# Moved from tests/test_cli.py.
def test_config_help_prints_each_default_from_its_one_source(capsys):
    """Algorithm settings show the preset's values (grpo unless a preset is given), not None; factory defaults
    show their value; a selector narrows the help to a section or one task; an unmatched one is exit 2."""
    from oprl.algorithms import resolve_preset

    assert main(["config", "--help"]) == 0
    text = capsys.readouterr().out
    assert "PydanticUndefined" not in text and "tracking.backends = []" in text
    grpo = resolve_preset("grpo")
    for key, value in grpo.items():
        assert f"algorithm.{key} = {value!r}:" in text, key
    assert main(["config", "--help", "algorithm.preset=opmd"]) == 0
    lines = capsys.readouterr().out.splitlines()
    lines = [line for line in lines if not line.startswith("# algorithm: ")]  # the group headings
    assert lines and all(line.startswith("algorithm.") for line in lines)
    assert "algorithm.preset = 'opmd':" in lines[0]
    for key, value in resolve_preset("opmd").items():
        assert any(line.startswith(f"algorithm.{key} = {value!r}:") for line in lines), key
    assert resolve_preset("opmd") != grpo
    assert main(["config", "--help", "task.name=bfcl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("task.") and "[task.name=bfcl]" in line for line in lines)
    assert any(line.startswith("task.subsets = ") and len(line.split(": ", 1)[1]) > 10 for line in lines)
    assert main(["config", "--help", "rollout"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith(("rollout.", "# rollout: ")) for line in lines)  # headed groups
    assert any("group_size = 8" in x for x in lines)
    assert main(["config", "--help", "rollot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rollot" in err


def test_the_algorithm_help_is_grouped_and_gives_each_defaults_reason(capsys):
    """#54: ``oprl config --help algorithm`` was 36 flat fields; now its groups, every field in exactly one, and
    beside each default the reason and source declared with it (``why`` in ``oprl.algorithms.spec``)."""
    from oprl.algorithms import ALGORITHM_DEFAULTS, KNOBS
    from oprl.config.algorithm import AlgorithmConfig

    assert main(["config", "--help", "algorithm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    headings = [line for line in lines if line.startswith("# ")]
    assert headings == [f"# algorithm: {g}" for g in AlgorithmConfig.GROUPS]
    grouped = [name for names in AlgorithmConfig.GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(AlgorithmConfig.model_fields) and len(grouped) == len(set(grouped))
    eps = next(line for line in lines if line.startswith("algorithm.eps_low = "))
    assert "[oprl's default 0.2: PPO's ε (Schulman et al. 2017)]" in eps
    reasons = {name: knob.why for name, knob in KNOBS.items() if knob.why}
    assert set(reasons) <= set(ALGORITHM_DEFAULTS) and len(reasons) >= len(ALGORITHM_DEFAULTS) - 2
    assert reasons["m2_threshold"].startswith("M2PO's τ_M2")
