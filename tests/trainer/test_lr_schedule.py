"""optim.lr_schedule: transformers' formulas (what TRL's lr_scheduler_type means), one rate per update slot, and a
run resumed from a checkpoint taken mid-warmup meets the uninterrupted run's rates and weights exactly."""

import math

import pytest
import torch

from oprl.algorithms.lr_schedule import LrSchedule, warmup_slots
from oprl.checkpoint.files import load_trainer_state, save_schedule, save_trainer_state
from oprl.config import OptimConfig
from oprl.errors import OprlError
from oprl.trainer.role import restore_schedule
from trainer_helpers import make_batch, make_trainer

TRANSFORMERS_NAME = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 7])
def test_the_factors_are_transformers_get_scheduler(kind, warmup):
    transformers = pytest.importorskip("transformers")
    total = 23
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    scheduler = transformers.get_scheduler(TRANSFORMERS_NAME[kind], optimizer, num_warmup_steps=warmup,
                                           num_training_steps=total)  # fmt: skip
    ours = LrSchedule(kind, warmup, total)
    for t in range(total + 3):  # past the end too: linear and cosine stay at 0
        assert 2.0 * ours.factor(t) == pytest.approx(optimizer.param_groups[0]["lr"], abs=1e-12), t
        optimizer.step()
        scheduler.step()


def test_warmup_in_steps_or_as_a_ratio_with_transformers_rounding():
    optim = OptimConfig(lr_schedule="cosine", warmup_ratio=0.1, epochs=2, mini_batches=3)
    schedule = LrSchedule.of(optim, steps=7)  # 42 slots
    assert (schedule.total, schedule.warmup) == (42, math.ceil(4.2))
    assert LrSchedule.of(OptimConfig(warmup_steps=2, mini_batches=2), steps=5).warmup == 4  # trainer steps
    assert warmup_slots(None, None, 10) == 0
    with pytest.raises(OprlError, match=r"optim.warmup_steps=2 and optim.warmup_ratio=0.1: give one"):
        OptimConfig(warmup_steps=2, warmup_ratio=0.1)


def test_every_update_slot_moves_the_rate_and_optim_lr_logs_it():
    trainer, tokenizer = make_trainer(lr=1e-3, lr_schedule="linear", warmup_steps=1, mini_batches=2)
    trainer.schedule = LrSchedule.of(trainer.optim, steps=3)  # 6 slots, 2 of warmup
    batch = make_batch(tokenizer)
    logged = [trainer.step(batch)["optim/lr"] for _ in range(3)]
    # Step means over the step's two updates: (0 + 1/2), (1 + 3/4), (2/4 + 1/4) of lr.
    assert logged == pytest.approx([1e-3 * f for f in (0.25, 0.875, 0.375)])
    assert trainer.lr_slot == 6


def test_a_run_resumed_mid_warmup_equals_the_uninterrupted_one(tmp_path):
    optim = {"lr": 1e-3, "lr_schedule": "cosine", "warmup_steps": 3}

    def trainer():
        made, tokenizer = make_trainer(**optim)
        made.schedule = LrSchedule.of(made.optim, steps=6)
        return made, tokenizer

    straight, tokenizer = trainer()
    batches = [make_batch(tokenizer, seed=s) for s in range(6)]
    straight_lr = [straight.step(b)["optim/lr"] for b in batches]

    first, _ = trainer()
    resumed_lr = [first.step(b)["optim/lr"] for b in batches[:2]]  # stopped at step 2 of a 3-step warmup
    save_trainer_state(tmp_path, first.model, first.optimizer, first.version)
    save_schedule(tmp_path, first.lr_slot, first.schedule)
    second, _ = trainer()
    second.version = load_trainer_state(tmp_path, second.model, second.optimizer)
    second.lr_slot = restore_schedule(tmp_path, second)
    resumed_lr += [second.step(b)["optim/lr"] for b in batches[2:]]

    assert resumed_lr == straight_lr
    assert straight_lr[:3] == pytest.approx([0.0, 1e-3 / 3, 2e-3 / 3]) and straight_lr[3] == pytest.approx(1e-3)
    for (name, a), b in zip(straight.model.state_dict().items(), second.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_resume_that_adds_steps_stretches_the_rest_and_says_so(tmp_path, caplog):
    made, _ = make_trainer(lr_schedule="linear")
    made.schedule = LrSchedule.of(made.optim, steps=4)
    save_schedule(tmp_path, 2, made.schedule)
    made.schedule = LrSchedule.of(made.optim, steps=8)
    with caplog.at_level("WARNING", logger="oprl.trainer"):
        assert restore_schedule(tmp_path, made) == 2
    assert "the run now has 8 updates (was 4): from update 2 the rate follows linear" in caplog.text
    assert restore_schedule(tmp_path / "none", made) == 0  # a checkpoint from before schedules: version * slots
