"""Training-state checkpoints: exact round trip of weights, optimizer and schedule; latest; clear errors."""

import pytest
import torch

from diffsynth.diffusion.checkpoint import (latest_checkpoint, load_training_state, resolve_checkpoint,
                                            save_training_state)


def trained_optimizer():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    for _ in range(3):
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def test_round_trip_restores_every_state_exactly(tmp_path):
    model, optimizer, scheduler = trained_optimizer()
    progress = {"global_step": 3, "micro_step": 6, "epoch": 1, "batch_in_epoch": 2, "seed": 11}
    folder = save_training_state(tmp_path, dict(model.state_dict()), optimizer.state_dict(), scheduler.state_dict(),
                                 progress)
    assert folder == tmp_path / "checkpoints" / "step-3"
    weights, optimizer_state, scheduler_state, loaded_progress = load_training_state(folder)
    assert loaded_progress == progress
    assert all(torch.equal(weights[name], value) for name, value in model.state_dict().items())
    fresh_model, fresh_optimizer, fresh_scheduler = trained_optimizer()
    fresh_optimizer.load_state_dict(optimizer_state)
    fresh_scheduler.load_state_dict(scheduler_state)
    original = optimizer.state_dict()
    restored = fresh_optimizer.state_dict()
    assert restored["param_groups"] == original["param_groups"]  # betas stay a tuple, lr a float
    for index, state in original["state"].items():
        assert all(torch.equal(restored["state"][index][key], value) for key, value in state.items())
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()


def test_latest_picks_the_highest_complete_step(tmp_path):
    model, optimizer, scheduler = trained_optimizer()
    for step in (2, 10, 9):
        save_training_state(tmp_path, model.state_dict(), optimizer.state_dict(), scheduler.state_dict(),
                            {"global_step": step})
    (tmp_path / "checkpoints" / "step-11").mkdir()  # an incomplete folder (no progress.json) is ignored
    (tmp_path / "checkpoints" / ".step-12.tmp").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-10"
    assert resolve_checkpoint("latest", tmp_path) == tmp_path / "checkpoints" / "step-10"
    assert not list((tmp_path / "checkpoints").glob(".step-*.tmp/*"))


def test_a_missing_checkpoint_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume_from_checkpoint latest: no checkpoint at"):
        resolve_checkpoint("latest", tmp_path)
    with pytest.raises(FileNotFoundError, match="--resume_from_checkpoint .*nope"):
        resolve_checkpoint(str(tmp_path / "nope"), tmp_path)


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    model, optimizer, scheduler = trained_optimizer()
    for step in (1, 2, 3):
        save_training_state(tmp_path, model.state_dict(), optimizer.state_dict(), scheduler.state_dict(),
                            {"global_step": step}, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2", "step-3"]


@pytest.mark.parametrize("poisoned", ["weights", "optimizer"])
def test_a_non_finite_state_is_refused_and_the_latest_checkpoint_stays(tmp_path, poisoned):
    from diffsynth.core.finite import NonFiniteTensorError

    model, optimizer, scheduler = trained_optimizer()
    save_training_state(tmp_path, model.state_dict(), optimizer.state_dict(), scheduler.state_dict(),
                        {"global_step": 1})
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    state = optimizer.state_dict()
    if poisoned == "weights":
        weights["weight"][0, 0] = float("nan")
    else:
        state["state"][0]["exp_avg"][0, 0] = float("inf")
    part = "trainable weights" if poisoned == "weights" else "optimizer state"
    with pytest.raises(NonFiniteTensorError, match=f"not writing checkpoint .*step-2: the {part}"):
        save_training_state(tmp_path, weights, state, scheduler.state_dict(), {"global_step": 2})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-1"
