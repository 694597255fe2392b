"""Resuming a checkpoint on another launch: another batch size or accumulation is refused before any model loads
(the position in the data counts batches of the saving launch; another process count likewise, launched on two
processes in ``test_trainer.py``); the same launch continues to the end; a checkpoint at the end of the run is
refused (exit code 2) instead of "resuming" and training nothing."""

import pytest

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from diffsynth.training.exit_codes import BAD_INPUT, exit_code_for
from tests.conftest import reset_accelerate_state
from tests.training.test_trainer import COMMON, raw


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def folder_state(folder):
    """Every file under ``folder`` with its size and modification time."""
    return {path: (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*") if path.is_file()}


def refuse_to_load(*args, **kwargs):
    raise AssertionError("the models were loaded before the resume was refused")


def test_a_checkpoint_resumes_only_on_its_own_launch_and_not_past_its_end(dataset, tmp_path):
    output = tmp_path / "out"
    # Three samples, one per optimizer step: cut short after two, which checkpoints step 2.
    flags = [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1"]
    assert main(QwenImagePipeline, [*flags, "--max_train_steps", "2"])["global_step"] == 2
    reset_accelerate_state()
    before = folder_state(output)

    for changed, fragment in ((["--batch_size", "2"], "--batch_size 2: the checkpoint"),
                              (["--gradient_accumulation_steps", "2"], "--gradient_accumulation_steps 2: the")):
        with pytest.raises(FlagError, match=fragment), pytest.MonkeyPatch.context() as patch:
            patch.setattr("diffsynth.training.entry.load_pipeline", refuse_to_load)
            main(QwenImagePipeline, [*flags, *changed, "--resume_from_checkpoint", "latest"])
        reset_accelerate_state()
    assert folder_state(output) == before

    # The same launch continues from the samples already seen and trains to the end: step 3 of 3.
    resumed = main(QwenImagePipeline, [*flags, "--resume_from_checkpoint", "latest"])
    assert resumed["global_step"] == 3 and len(resumed["losses"]) == 1
    assert (output / "checkpoints" / "step-3").is_dir() and (output / "epoch-0.safetensors").is_file()
    reset_accelerate_state()

    # Resuming the end of the run would train nothing: refused, with the flag to raise, and nothing written.
    finished = folder_state(output)
    with pytest.raises(FlagError, match=r"step-3 \(optimizer step 3\) is the end of the run: all 1 epoch\(s\) "
                                        r"are done.*raise --num_epochs") as refused, pytest.MonkeyPatch.context() as patch:
        patch.setattr("diffsynth.training.entry.load_pipeline", refuse_to_load)
        main(QwenImagePipeline, [*flags, "--resume_from_checkpoint", "latest"])
    reset_accelerate_state()
    assert folder_state(output) == finished
    assert exit_code_for(refused.value) == BAD_INPUT
    with pytest.raises(FlagError, match=r"this run asks for --max_train_steps 2.*raise --max_train_steps"):
        main(QwenImagePipeline, [*flags, "--num_epochs", "2", "--max_train_steps", "2", "--resume_from_checkpoint",
                                 str(output / "checkpoints" / "step-2")])
    reset_accelerate_state()


def test_a_resume_whose_dataset_shrank_below_the_checkpoint_is_refused(dataset, tmp_path):
    """The checkpoint's position passes (epoch 0 of 1, no step budget), but the schedule of the smaller dataset
    ends before it: refused once the schedule is built, before the run's record is rewritten."""
    output = tmp_path / "out"
    flags = [*raw(dataset), *COMMON, "--output_path", str(output), "--num_epochs", "1"]
    main(QwenImagePipeline, [*flags, "--dataset_repeat", "2", "--max_train_steps", "4"])
    reset_accelerate_state()
    before = folder_state(output)
    with pytest.raises(FlagError, match="this run's schedule has 3 optimizer steps"):
        main(QwenImagePipeline, [*flags, "--resume_from_checkpoint", "latest"])
    assert folder_state(output) == before
