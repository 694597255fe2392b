"""Training-state checkpoints: exact round trip, latest and its fallback, pruning by run, recorded flags."""

import json
import logging

import pytest
import torch

from diffsynth.training.config import RunConfig
from diffsynth.training.outputs.checkpoint import (
    CheckpointError,
    flag_mismatches,
    load_training_state,
    resolve_checkpoint,
    save_training_state,
    training_flags,
)


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


def progress(step, run_id="run-a"):
    return {"global_step": step, "micro_step": step, "epoch": 0, "batch_in_epoch": step, "seed": 1, "run_id": run_id}


def save(folder, step, run_id="run-a", keep_last=None):
    model, optimizer, scheduler = trained_optimizer()
    return save_training_state(folder, model.state_dict(), optimizer.state_dict(), scheduler.state_dict(),
                               progress(step, run_id), keep_last=keep_last)


def test_round_trip_restores_every_state_exactly(tmp_path):
    model, optimizer, scheduler = trained_optimizer()
    state = {**progress(3), "micro_step": 6, "epoch": 1, "batch_in_epoch": 2, "seed": 11}
    folder = save_training_state(tmp_path, dict(model.state_dict()), optimizer.state_dict(), scheduler.state_dict(),
                                 state)
    assert folder == tmp_path / "checkpoints" / "step-3"
    weights, optimizer_state, scheduler_state, loaded_progress = load_training_state(folder)
    assert loaded_progress == state
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
    for step in (2, 10, 9):
        save(tmp_path, step)
    (tmp_path / "checkpoints" / "step-11").mkdir()  # an incomplete folder (no progress.json) is ignored
    (tmp_path / "checkpoints" / ".step-12.tmp").mkdir()
    assert resolve_checkpoint("latest", tmp_path) == tmp_path / "checkpoints" / "step-10"
    assert not list((tmp_path / "checkpoints").glob(".step-*.tmp/*"))


def test_a_missing_checkpoint_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume_from_checkpoint latest: no checkpoint at"):
        resolve_checkpoint("latest", tmp_path)
    with pytest.raises(FileNotFoundError, match="--resume_from_checkpoint .*nope"):
        resolve_checkpoint(str(tmp_path / "nope"), tmp_path)


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_latest_falls_back_past_unreadable_checkpoints_and_says_which(tmp_path, caplog):
    for step in (2, 9, 10):
        save(tmp_path, step)
    truncate(tmp_path / "checkpoints" / "step-10" / "trainable.safetensors")
    (tmp_path / "checkpoints" / "step-9" / "progress.json").write_text('{"global_step": 9,')
    with caplog.at_level(logging.WARNING):
        chosen = resolve_checkpoint("latest", tmp_path)
    assert chosen == tmp_path / "checkpoints" / "step-2"
    warning = caplog.text
    assert "step-10 (trainable.safetensors" in warning and "step-9 (progress.json" in warning
    assert f"resuming from {chosen}" in warning


def test_an_unreadable_checkpoint_is_named_not_a_raw_header_error(tmp_path):
    folder = save(tmp_path, 4)
    truncate(folder / "state.safetensors")
    with pytest.raises(CheckpointError, match=f"--resume_from_checkpoint {folder}: the checkpoint is unreadable "
                                              r"\(.*state.safetensors"):
        resolve_checkpoint(str(folder), tmp_path)
    with pytest.raises(CheckpointError, match=f"cannot read the checkpoint {folder}"):
        load_training_state(folder)
    with pytest.raises(CheckpointError, match="no checkpoint under .* is readable"):
        resolve_checkpoint("latest", tmp_path)


def test_only_this_runs_newest_checkpoints_are_kept(tmp_path):
    save(tmp_path, 100, run_id="old")
    save(tmp_path, 200, run_id="old")
    for step in (1, 2, 3):
        save(tmp_path, step, run_id="new", keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-100", "step-2", "step-200",
                                                                           "step-3"]



def test_pruning_and_replacing_a_checkpoint_keep_the_users_files(tmp_path):
    first = save(tmp_path, 1, keep_last=1)
    (first / "notes").mkdir()
    (first / "notes" / "why.txt").write_text("the run before the learning-rate change")
    replaced = save(tmp_path, 1, keep_last=1)  # the same step again: a rerun of a resumed run
    assert (replaced / "notes" / "why.txt").read_text() == "the run before the learning-rate change"
    assert (replaced / "progress.json").is_file()
    save(tmp_path, 2, keep_last=1)
    assert sorted(path.relative_to(first).as_posix() for path in first.rglob("*")) == ["notes", "notes/why.txt"]
    assert resolve_checkpoint("latest", tmp_path).name == "step-2"

def flags(**changes):
    values = {"lora_base_model": "dit", "lora_target_modules": "q,to_k", "lora_rank": 4, "lora_alpha": None,
              "trainable_models": None}
    return RunConfig.from_flags({**values, **changes}, runnable=False)


def test_flags_that_change_the_trainable_weights_are_named_with_both_values(tmp_path):
    aliases = {"q": "to_q"}
    recorded = json.loads(json.dumps(training_flags(flags(), aliases)))  # as read back from progress.json
    # Same targets in another order or spelling, alpha left at the rank: nothing to report.
    assert flag_mismatches(tmp_path, recorded, training_flags(flags(lora_target_modules="to_k,to_q",
                                                                    lora_alpha=4), aliases)) == []
    problems = flag_mismatches(tmp_path, recorded, training_flags(flags(lora_rank=8, lora_target_modules="to_q"),
                                                                  aliases))
    assert len(problems) == 3  # rank, targets, and the alpha that follows the rank
    assert problems[0].startswith(f"--lora_target_modules to_q: the checkpoint {tmp_path} was trained with "
                                  "--lora_target_modules to_k,to_q; resume with --lora_target_modules to_k,to_q")
    assert "--lora_rank 8: the checkpoint" in problems[1] and "resume with --lora_rank 4" in problems[1]
    assert "--lora_alpha 8: the checkpoint" in problems[2] and "unset --lora_alpha equals --lora_rank" in problems[2]
    assert flag_mismatches(tmp_path, None, training_flags(flags(lora_rank=8), aliases)) == []


def test_a_resume_keeps_the_order_of_the_data():
    recorded = json.loads(json.dumps(training_flags(flags(batch_size=2), {})))
    problems = flag_mismatches("ckpt", recorded, training_flags(flags(batch_size=4), {}))
    assert problems[0].startswith("--batch_size 4: the checkpoint ckpt was trained with --batch_size 2")
    buckets = flag_mismatches("ckpt", training_flags(flags(), {}), training_flags(flags(aspect_ratio_buckets=True), {}))
    assert len(buckets) == 1 and "--aspect_ratio_buckets True" in buckets[0]


def test_a_resume_keeps_the_process_count_and_the_accumulation():
    recorded = json.loads(json.dumps(training_flags(flags(), {}, num_processes=1)))
    [processes] = flag_mismatches("ckpt", recorded, training_flags(flags(), {}, num_processes=2))
    assert processes.startswith("this run has 2 processes, but the checkpoint ckpt was trained on 1")
    assert "accelerate launch --num_processes 1" in processes
    [accumulation] = flag_mismatches("ckpt", recorded, training_flags(flags(gradient_accumulation_steps=2), {}))
    assert accumulation.startswith("--gradient_accumulation_steps 2: the checkpoint ckpt was trained with "
                                   "--gradient_accumulation_steps 1")


@pytest.mark.parametrize("poisoned", ["weights", "optimizer"])
def test_a_non_finite_state_is_refused_and_the_latest_checkpoint_stays(tmp_path, poisoned):
    from diffsynth.core.finite import NonFiniteTensorError

    model, optimizer, scheduler = trained_optimizer()
    save_training_state(tmp_path, model.state_dict(), optimizer.state_dict(), scheduler.state_dict(), progress(1))
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    state = optimizer.state_dict()
    if poisoned == "weights":
        weights["weight"][0, 0] = float("nan")
    else:
        state["state"][0]["exp_avg"][0, 0] = float("inf")
    part = "trainable weights" if poisoned == "weights" else "optimizer state"
    with pytest.raises(NonFiniteTensorError, match=f"not writing checkpoint .*step-2: the {part}"):
        save_training_state(tmp_path, weights, state, scheduler.state_dict(), progress(2))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
    assert resolve_checkpoint("latest", tmp_path) == tmp_path / "checkpoints" / "step-1"
