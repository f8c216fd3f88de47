"""configs/examples/tiny-distill.yaml resolves to the distill preset with a teacher, and its header's commands
name the teacher run its teacher.path points to."""

from pathlib import Path

from oprl.config import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "examples" / "tiny-distill.yaml"


def test_the_tiny_distillation_example_resolves():
    config = load_config(EXAMPLE)
    assert config.algorithm.preset == "distill" and config.algorithm.distill_mix == "replace"
    assert config.algorithm.distill_coef == 1.0 and config.teacher.path == "runs/tiny-teacher"
    assert "run_name=tiny-teacher" in EXAMPLE.read_text()


def test_the_smollm2_distillation_example_is_the_rl_example_with_a_teacher():
    """The SmolLM2 student differs from the RL example (its teacher's own run) only in the signal, the teacher,
    the run name and the evaluation's curve: same model, task, batch, step budget and learning rate."""
    examples = EXAMPLE.parent
    rl = load_config(examples / "smollm2-arithmetic-vllm.yaml").model_dump()
    student = load_config(examples / "smollm2-distill.yaml").model_dump()
    changed = {
        f"{section}.{key}"
        for section, values in student.items()
        if isinstance(values, dict)
        for key, value in values.items()
        if rl[section][key] != value
    } | {key for key, value in student.items() if not isinstance(value, dict) and rl[key] != value}
    assert "algorithm.preset" in changed and "teacher.path" in changed
    assert changed - {"algorithm.preset", "teacher.path", "run_name", "eval.interval", "eval.seed"} <= {
        f"algorithm.{k}"
        for k in student["algorithm"]  # the preset's own resolved values
    }
    # The RL example names no run (a second run of it gets a fresh name, #71): its header's command names the teacher.
    assert student["teacher"]["path"] == f"{rl['output_dir']}/smollm2-arithmetic-vllm"
    assert "run_name=smollm2-arithmetic-vllm" in (examples / "smollm2-distill.yaml").read_text()
    assert student["steps"] == rl["steps"] and student["optim"]["lr"] == rl["optim"]["lr"]
