"""The family test kit: the checks every registered family gets, parametrized over ``registry.families()``.

Per family, on its tiny repo (``diffsynth.testing.families``, one ``TinyFamily`` row each):

- load: its pipeline class loads every model into its slot;
- inference: its output equals diffusers' own pipeline's (slow);
- training: a LoRA step and a full step through the trainer; offload, block swap and H2D block streaming give the
  plain LoRA; the split run (``sft:data_process`` then ``sft:train``) gives the one-stage LoRA (slow);
- LoRA names: the trained file reads with the family's diffusers LoRA loader and loads fully into diffusers'
  pipeline, changing its output (slow);
- the planner: its table for the tiny files and for each kind of release without files (slow;
  ``test_family_kit_planner.py``, a module of its own so that a test worker plans while another trains);
- refusals: each ``refused_model_ids`` prefix stops the trainer before loading, with its reason.

A family's trainer runs happen once (module-scoped fixtures, one family after the other).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset, build_example_video_dataset
from diffsynth.diffusion.flow_match import DiffusersScheduler
from diffsynth.testing.families import TINY_FAMILIES, tiny_family
from tests.pipelines.conftest import FAMILIES
from diffsynth.training.config.errors import FlagError
from tests.training.conftest import max_difference
from tests.pipelines.family_helpers import (
    PLACEMENTS,
    Runs,
    assert_same_output,
    load_ours,
    load_theirs,
    lora_file,
    refused_before_loading,
    render_ours,
    render_theirs,
)



def test_the_table_covers_every_registered_family():
    assert sorted(TINY_FAMILIES) == sorted(spec.name for spec in FAMILIES)
    for spec in FAMILIES:
        assert tiny_family(spec.name).video == spec.video, spec.name
    with pytest.raises(KeyError, match="no TinyFamily row"):
        tiny_family("no_such_family")


@pytest.fixture(scope="module")
def ours(spec, tiny, tiny_root):
    return load_ours(tiny_root, tiny)


@pytest.fixture(scope="module")
def theirs(tiny, tiny_root):
    import diffusers

    return load_theirs(tiny_root, getattr(diffusers, tiny.diffusers_pipeline), tiny.model_id)


def test_every_model_lands_in_its_slot(spec, tiny, ours):
    assert type(ours) is spec.pipeline_class()
    for slot in tiny.models:
        model = getattr(ours, slot)
        assert isinstance(model, torch.nn.Module), f"{slot} is {model!r}"
        assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}, slot
    assert set(tiny.models) <= set(ours.model_names())
    assert type(getattr(ours, tiny.denoiser)).__name__ == spec.denoiser_class
    assert spec.pipeline_class().denoising_model_names[0] == tiny.denoiser


@pytest.mark.slow  # diffusers' whole pipeline
def test_inference_equals_diffusers(tiny, ours, theirs):
    if tiny.diffusers_scheduler:
        ours.scheduler = DiffusersScheduler(type(theirs.scheduler).from_config(theirs.scheduler.config))
    try:
        image = render_ours(ours, **tiny.call)
        reference = render_theirs(theirs, output=tiny.output, **tiny.diffusers_call)
        assert_same_output(image, reference, lambda: render_ours(ours, seed=8, **tiny.call))
    finally:
        ours.scheduler = type(ours)().scheduler if tiny.diffusers_scheduler else ours.scheduler


# Training: a tiny dataset per family, the runs cached by name.
@pytest.fixture(scope="module")
def data(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"{tiny.name}_data")
    if tiny.video:
        build_example_video_dataset(folder, num_videos=2, num_frames=6)
    else:
        build_example_dataset(folder, num_images=3)
    return folder


@pytest.fixture(scope="module")
def runs(spec, tiny, data, tmp_path_factory, tiny_root):
    return Runs(spec, tiny, data, tmp_path_factory.mktemp(f"{spec.name}_runs"), tiny_root)


def up_factors(weights):
    return [value for key, value in weights.items() if "lora_B" in key or "lora_up" in key]


@pytest.mark.slow
def test_a_lora_step_trains_the_denoiser(runs):
    weights = lora_file(runs.lora("plain"))
    result = runs.results["plain"]
    assert result["global_step"] > 0 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert up_factors(weights) and max(value.abs().max().item() for value in up_factors(weights)) > 1e-4


@pytest.mark.slow
def test_a_full_step_updates_every_weight_of_the_denoiser(runs, tiny, ours):
    output, result = runs.full()
    saved, original = lora_file(output), getattr(ours, tiny.denoiser).state_dict()
    assert result["global_step"] > 0 and set(saved) == set(original)
    assert max((saved[key] - original[key]).abs().max().item() for key in original) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_offload_and_block_swap_give_the_plain_lora(spec, runs, tiny, placement):
    if placement != "offload" and not spec.block_swap:
        # A family without a block sequence (a UNet) is refused block swap by name, before anything loads.
        with pytest.raises(FlagError, match=r"has no block list to swap; drop --blocks_to_swap"):
            runs.lora(placement, *PLACEMENTS[placement](tiny))
        return
    placed = runs.lora(placement, *PLACEMENTS[placement](tiny))
    assert max_difference(lora_file(placed), lora_file(runs.lora("plain"))) < tiny.lora_tolerance


@pytest.mark.slow
def test_split_training_gives_the_one_stage_lora(runs):
    stage_one, output = runs.split()
    assert stage_one["cached"] == len(list(runs.data.glob("*.*"))) - 1  # every sample but metadata.csv
    assert max_difference(lora_file(output), lora_file(runs.lora("plain"))) < runs.tiny.split_tolerance


@pytest.mark.slow
def test_the_lora_names_load_in_diffusers(spec, tiny, runs, theirs):
    import diffusers

    from tests.conftest import load_lora_into_diffusers

    output = runs.lora("plain")
    # A family whose universal file names its layers as ComfyUI does writes diffusers' names in a twin beside it.
    twin = output / "epoch-0.diffusers.safetensors"
    file = twin if twin.is_file() else output / "epoch-0.safetensors"
    layers = len(up_factors(load_file(str(file))))
    loader = getattr(diffusers.loaders, spec.lora_tools.diffusers_loader)
    state = loader.lora_state_dict(str(file))
    state = state[0] if isinstance(state, tuple) else state
    # The UNet loaders keep diffusers' older names for kohya files (``processor.to_q_lora.up.weight``).
    assert len([key for key in state if "lora_B" in key or "lora_up" in key or key.endswith(".up.weight")]) == layers
    before = render_theirs(theirs, output=tiny.output, **tiny.diffusers_call)
    try:
        warnings = load_lora_into_diffusers(theirs, file, "kit")
        # FLUX.1's pipeline says its text encoder has no LoRA keys: the file trains the transformer alone.
        assert [warning for warning in warnings if not warning.startswith("No LoRA keys associated to")] == []
        loaded = [name for name, _ in getattr(theirs, tiny.diffusers_denoiser).named_parameters() if "lora_A" in name]
        assert len(loaded) == layers
        with_lora = render_theirs(theirs, output=tiny.output, **tiny.diffusers_call)
    finally:
        theirs.unload_lora_weights()
    assert (with_lora - before).abs().max() > 1e-5


# The reference scripts' refusals.
@pytest.mark.fast  # refused before any model loads
def test_each_refused_model_is_refused_with_its_reason(spec, tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if not spec.refused_model_ids:
        pytest.skip(f"{spec.name} refuses no model")
    for prefix, reason in spec.refused_model_ids.items():
        models = ",".join([tiny.models[tiny.denoiser], f"{prefix}:model.safetensors"])
        problem = refused_before_loading(spec.pipeline_class(), [
            "--dataset_base_path", "data", "--model_id_with_origin_paths", models, "--lora_base_model", tiny.denoiser,
            *tiny.train_flags], tmp_path, capsys, video=spec.video)
        assert prefix in problem and reason in problem, problem
