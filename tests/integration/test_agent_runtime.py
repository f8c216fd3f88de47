"""``task.name=agent`` end to end: a calculator agent written with the openai client trains the tiny model
(warm-started on the tool-arithmetic demonstrations), the stored rows are schema-2 episodes with environment
tokens masked, and the on-policy trainer recomputes the sampler's log-probs of the model tokens."""

import pyarrow.parquet as pq

from oprl.cli import main
from oprl.metrics import read_metrics
from recipes import EPISODES  # tests/integration/test_episodes_runtime.py's recipe, the task's problems below


def test_an_openai_client_agent_trains_the_tiny_model(tmp_path):
    args = [
        *EPISODES,
        "task.name=agent",
        "task.agent=examples/calculator_agent.py:rollout",
        "task.problems.train_size=600",
        "task.problems.test_size=64",
        f"output_dir={tmp_path / 'runs'}",
        "run_name=agent",
        "steps=3",
    ]
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "runs" / "agent" / "metrics.jsonl")
    for row in rows[1:]:
        assert 0 < row["response/model_tokens"] < row["response/tokens"]
        assert row["episode/segments_mean"] == 1.0 and row["episode/agent_failed_mean"] == 0.0
        assert "reward/tool_calls" in row
        if row["lag/max"] == 0:
            assert abs(row["rho/behavior_max"] - 1) < 1e-4 and abs(row["rho/behavior_min"] - 1) < 1e-4
    assert "eval/accuracy" in rows[2]
    table = pq.read_table(tmp_path / "runs" / "agent" / "experiences" / "batch-000003.parquet")
    assert table.schema.metadata[b"oprl_schema"] == b"4" and table.num_rows == 16
    assert any(0 in mask for mask in table.column("loss_mask").to_pylist())
