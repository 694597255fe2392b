"""The families' registry: every room's spec is well formed, what it names exists, and reading it imports no model
library."""

import ast
from pathlib import Path

import pytest

from diffsynth.core import model_traits
from diffsynth.pipelines import registry
from diffsynth.pipelines.registry import FamilySpec, LoraTools, Release, families, load
from tests.conftest import python_output

REPO = Path(__file__).resolve().parents[2]
SPECS = {spec.name: spec for spec in families()}


def test_every_room_with_a_spec_is_registered_under_its_folder_name():
    rooms = sorted(path.parent.name for path in (REPO / "diffsynth" / "pipelines").glob("*/spec.py"))
    assert sorted(SPECS) == rooms and len(rooms) >= 5


def test_reading_the_registry_imports_no_model_library():
    code = ("import sys; from diffsynth.pipelines.registry import families, releases; families(); releases(); "
            "print(sorted(m for m in ('torch', 'diffusers', 'transformers', 'peft') if m in sys.modules))")
    assert python_output(code) == "[]"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_what_a_spec_names_exists(name):
    spec = SPECS[name]
    pipeline = spec.pipeline_class()
    assert spec.denoiser_class in pipeline.model_roles
    assert callable(load(spec.planner_inputs))
    assert all(callable(load(reader)) for reader in spec.original_readers)
    if spec.original_checkpoint is not None:
        assert callable(load(spec.original_checkpoint.convert))
    if spec.lora_naming is not None:
        from diffsynth.lora.naming import ModuleNaming, naming_for

        assert isinstance(load(spec.lora_naming), ModuleNaming) and naming_for(spec.denoiser_class) is load(
            spec.lora_naming)
    import diffusers.loaders.lora_pipeline as lora_pipeline

    assert hasattr(lora_pipeline, spec.lora_tools.diffusers_loader)
    assert (REPO / "docs" / "en" / spec.docs_page).is_file() and (REPO / "docs" / "zh" / spec.docs_page).is_file()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_example_train_script_runs_the_spec_pipeline(name):
    spec = SPECS[name]
    script = REPO / spec.example_folder / "train.py"
    calls = [node for node in ast.walk(ast.parse(script.read_text())) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "cli"]
    assert len(calls) == 1
    assert calls[0].args[0].value == spec.pipeline
    video = {keyword.arg: keyword.value.value for keyword in calls[0].keywords}.get("video", False)
    assert video == spec.video


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_scheduler_presets_build(name):
    from diffsynth.pipelines.common import scheduler_from_preset

    for preset in SPECS[name].scheduler_presets:
        assert len(scheduler_from_preset(preset).training_timesteps) == 1000


@pytest.mark.parametrize("architecture", sorted(registry.releases()))
def test_each_release_builds_its_family_denoiser_on_meta(architecture):
    import torch

    from diffsynth.training.placement.planner import build_architecture

    spec, release = registry.releases()[architecture]
    model = build_architecture(architecture, torch.bfloat16)
    assert type(model).__name__ == (release.denoiser_class or spec.denoiser_class)
    assert registry.family_of_class(type(model).__name__) is spec
    assert next(model.parameters()).device.type == "meta"


def test_importing_the_pipelines_registers_the_families_traits():
    import diffsynth.pipelines  # noqa: F401  (registers on import)

    readers = {reader for spec in families() for reader in spec.original_readers}
    assert readers and readers <= set(model_traits._READERS)
    for spec in families():
        assert set(spec.fp8_input_casting_layers) <= set(model_traits.input_casting_layers(spec.denoiser_class))


def _spec(**changes):
    fields = dict(name="toy", title="Toy", pipeline="diffsynth.pipelines.toy:ToyPipeline", plan_name="toy",
                  denoiser_class="ToyTransformer", planner_inputs="diffsynth.pipelines.toy.planning:planner_inputs",
                  lora_tools=LoraTools("ToyLoraLoaderMixin"), example_folder="examples/toy/model_training",
                  docs_page="Toy.md")
    return FamilySpec(**{**fields, **changes})


def test_a_spec_refuses_references_outside_the_package_and_bad_values():
    assert _spec().architectures == []
    with pytest.raises(ValueError, match="pipeline='toy:ToyPipeline' must be 'diffsynth.pipelines.<module>:<name>'"):
        _spec(pipeline="toy:ToyPipeline")
    with pytest.raises(ValueError, match="prompt_tokens=0 must be at least 1"):
        _spec(prompt_tokens=0)
    with pytest.raises(ValueError, match="comfyui_key_map='sdxl' must be"):
        LoraTools("X", comfyui_key_map="sdxl")


def test_two_families_may_not_claim_one_name(monkeypatch):
    first = _spec(releases=(Release("toy-1b"),))
    with pytest.raises(ValueError, match="families 'toy' and 'twin' both declare the architecture 'toy-1b'"):
        registry._check_unique([first, _spec(name="twin", plan_name="twin", pipeline="diffsynth.pipelines.twin:T",
                                             denoiser_class="TwinTransformer", releases=(Release("toy-1b"),))])
    # One class, one family: LoRA naming, the planner's inputs and full-model writing look a family up by its class.
    with pytest.raises(ValueError, match="both declare the denoiser class 'ToyTransformer'"):
        registry._check_unique([first, _spec(name="twin", plan_name="twin", pipeline="diffsynth.pipelines.twin:T")])


def test_lookups_name_what_there_is():
    assert registry.family("wan_video").video
    assert registry.family_of_class("FluxTransformer2DModel").name == "flux"
    assert registry.family_of_class("UNet2DConditionModel").name == "stable_diffusion"
    assert registry.family_of_class("HunyuanVideoTransformer3DModel") is None
    with pytest.raises(registry.FamilyNotFound, match="no family 'sdxl'; the families are ernie_image, flux, "):
        registry.family("sdxl")
    with pytest.raises(registry.FamilyNotFound,
                       match="choose one of ernie-image, flux, flux2-klein, krea2, ltx2, qwen-image, stable-diffusion, "
                             "wan, z-image"):
        registry.family_of_plan_name("sdxl")
    with pytest.raises(ValueError, match="scheduler preset 'sdxl' is unknown"):
        registry.scheduler_preset("sdxl")
    assert registry.released_architecture(["Wan-AI/Wan2.1-T2V-1.3B", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]) == \
        "wan2.1-t2v-1.3b"
    assert registry.released_architecture(["Wan-AI/Wan2.1-T2V-1.3B", "Qwen/Qwen-Image"]) is None
