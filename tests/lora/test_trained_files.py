"""The trainer's LoRA files in the tools users generate with, at the strength that was trained (alpha != rank).

diffusers is run for real; ComfyUI, DiffSynth-Studio and musubi-tuner are emulated from their loading code
(:mod:`diffsynth.lora.tools`), and the emulation is checked here against the strengths measured with those tools on
this project's first file format.
"""

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset, build_example_video_dataset
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, WAN_MODEL_ID, WAN_PATTERNS
from diffsynth.lora import LAYOUTS, inspect_lora, load_lora, lora_layer_names, naming_for, read_file, read_lora
from diffsynth.lora.__main__ import main as lora_cli
from diffsynth.lora.base_layers import LAYERS_KEY, BaseLayers
from diffsynth.lora.inspect import skeleton_from_metadata
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.entry import main
from diffsynth.training.outputs.checkpoint import resolve_checkpoint
from tests.conftest import load_lora_into_diffusers, reset_accelerate_state

RANK = 4
QWEN_ALPHA, WAN_ALPHA = 2, 8  # scales 0.5 and 2: a file read without its scale is off by 2x either way


def qwen_argv(dataset, output):
    models = ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    return ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv"),
            "--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
            "to_q,to_k,add_v_proj,to_out.0,img_mlp.net.2,txt_mod.1", "--lora_rank", str(RANK), "--lora_alpha",
            str(QWEN_ALPHA), "--learning_rate", "1e-2", "--torch_dtype", "float32", "--seed", "1", "--max_pixels",
            "4096", "--output_path", str(output), "--num_epochs", "1"]


def wan_argv(videos, output):
    models = ",".join(f"{WAN_MODEL_ID}:{WAN_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    return ["--dataset_base_path", str(videos), "--dataset_metadata_path", str(videos / "metadata.csv"),
            "--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
            "q,k,v,o,ffn.0,ffn.2", "--lora_rank", str(RANK), "--lora_alpha", str(WAN_ALPHA), "--learning_rate",
            "1e-2", "--torch_dtype", "float32", "--seed", "2", "--max_pixels", "4096", "--num_frames", "5",
            "--output_path", str(output), "--num_epochs", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_root):
    """A Qwen-Image and a Wan LoRA from the trainer, each with alpha != rank."""
    root = tmp_path_factory.mktemp("trained")
    build_example_dataset(root / "images", num_images=2)
    build_example_video_dataset(root / "videos", num_videos=1, num_frames=6)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        main(QwenImagePipeline, qwen_argv(root / "images", root / "qwen"))
        reset_accelerate_state()
        main(WanVideoPipeline, wan_argv(root / "videos", root / "wan"), video=True)
        reset_accelerate_state()
    return {"qwen": (root / "qwen", QWEN_ALPHA), "wan": (root / "wan", WAN_ALPHA)}


def diffusers_pipeline(kind, tiny_root):
    from diffusers import QwenImagePipeline as DiffusersQwen
    from diffusers import WanPipeline

    cls, model_id = {"qwen": (DiffusersQwen, QWEN_IMAGE_MODEL_ID), "wan": (WanPipeline, WAN_MODEL_ID)}[kind]
    return cls.from_pretrained(str(tiny_root / model_id), dtype=torch.float32)


def trained_deltas(output, alpha):
    """``(alpha / rank) * B @ A`` by hand, from the training state (peft's own, unfolded factors)."""
    state = load_file(str(resolve_checkpoint("latest", output) / "trainable.safetensors"))
    deltas = {}
    for key, down in state.items():
        if ".lora_A." in key:
            up = state[key.replace(".lora_A.", ".lora_B.")]
            name = key.removeprefix("pipe.dit.").split(".lora_A.")[0]
            deltas[name] = alpha / down.shape[0] * up @ down
    return deltas


@pytest.mark.parametrize("kind", ["qwen", "wan"])
def test_the_trained_file_loads_into_diffusers_at_the_trained_strength(trained, tiny_root, kind):
    output, alpha = trained[kind]
    pipe = diffusers_pipeline(kind, tiny_root)
    messages = load_lora_into_diffusers(pipe, output / "epoch-0.safetensors", "trained")
    assert not [m for m in messages if "missing" in m or "unexpected" in m or "No LoRA keys" in m], messages
    want = trained_deltas(output, alpha)
    got = {name: module.scaling["trained"] * module.lora_B["trained"].weight @ module.lora_A["trained"].weight
           for name, module in pipe.transformer.named_modules() if hasattr(module, "scaling")}
    assert got.keys() == want.keys() and len(want) >= 12
    assert max(delta.abs().max().item() for delta in want.values()) > 1e-5  # the LoRA trained
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("kind", ["qwen", "wan"])
def test_every_tool_maps_every_layer_at_strength_one(trained, kind):
    inspection = inspect_lora(trained[kind][0] / "epoch-0.safetensors")
    assert inspection.model_source == "the file's metadata"
    assert not inspection.failing(), inspection.format()  # diffsynth, diffusers, ComfyUI, DiffSynth-Studio
    assert not list(trained[kind][0].glob("*.diffusers.safetensors"))  # the universal file serves diffusers too
    # musubi-tuner reads only its own layout: the report says so and gives the command.
    assert inspection.result("musubi-tuner").mapped == 0
    assert "--to kohya" in inspection.format()


@pytest.mark.parametrize("kind", ["qwen", "wan"])
def test_every_layout_round_trips_to_the_same_deltas(trained, tmp_path, kind):
    output, alpha = trained[kind]
    source = output / "epoch-0.safetensors"
    want = trained_deltas(output, alpha)
    metadata = read_file(source)[1]
    skeleton = skeleton_from_metadata(metadata)
    # The trainer records the base model's layer table, which inspecting and converting read instead of the model.
    assert BaseLayers.from_metadata(type(skeleton).__name__, metadata[LAYERS_KEY]) == BaseLayers.of(skeleton)
    for layout in LAYOUTS:
        converted = tmp_path / f"{layout}.safetensors"
        assert lora_cli(["convert", str(source), str(converted), "--to", layout]) == 0
        weights = read_lora(converted, lora_layer_names(skeleton), naming_for(skeleton))
        assert weights.layout == layout and weights.layers.keys() == want.keys()
        for name, layer in weights.layers.items():
            torch.testing.assert_close(layer.delta(), want[name], atol=1e-6, rtol=1e-4)
        # A layout read back converts again to the same thing: nothing is scaled twice on the way.
        again = tmp_path / f"{layout}-again.safetensors"
        assert lora_cli(["convert", str(converted), str(again), "--to", "universal"]) == 0
        assert not inspect_lora(again).failing(), inspect_lora(again).format()
        if layout == "kohya":
            assert inspect_lora(converted).result("musubi-tuner").ok


def test_merging_the_file_adds_the_trained_deltas(trained, tiny_root):
    from diffusers import QwenImageTransformer2DModel

    output, alpha = trained["qwen"]
    base = QwenImageTransformer2DModel.from_pretrained(tiny_root / QWEN_IMAGE_MODEL_ID / "transformer")
    before = {name: module.weight.detach().clone() for name, module in base.named_modules()
              if isinstance(module, torch.nn.Linear)}
    want = trained_deltas(output, alpha)
    assert load_lora(base, output / "epoch-0.safetensors") == len(want)
    for name, delta in want.items():
        torch.testing.assert_close(base.get_submodule(name).weight - before[name], delta, atol=1e-6, rtol=1e-4)
