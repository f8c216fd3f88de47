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
