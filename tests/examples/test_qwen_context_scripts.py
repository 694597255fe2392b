"""The reference's Qwen-Image in-context control and Layered-Control commands, and its Qwen-Image and Z-Image NPU
commands, on the tiny repos: In-Context-Control-Union and Layered-Control V2 train as written (sizes aside), starting
from a tiny LoRA in the released file's layout where the command names one; the others are checked for what sets
them apart from commands other tests run (the NPU scripts: their launch commands parse, their environment is set).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
from diffsynth.core.data.example_layered_dataset import build_example_layered_dataset
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.testing.tiny_qwen_layered import build_tiny_qwen_image_layered, build_tiny_qwen_image_layered_control
from diffsynth.training.config.parsers import build_parser
from tests.conftest import load_lora_into_diffusers
from tests.examples.helpers import lora_update, run_command, script_commands

from .test_scripts import REPO

QWEN = REPO / "examples" / "qwen_image" / "model_training"
Z_IMAGE = REPO / "examples" / "z_image" / "model_training"
UNION = "models/DiffSynth-Studio/Qwen-Image-In-Context-Control-Union/model.safetensors"


@pytest.fixture(scope="module")
def model_root(tiny_root, tmp_path_factory) -> Path:
    """The tiny Qwen-Image repos, plus the tiny Qwen-Image-Layered and Layered-Control repos."""
    from tests.examples.helpers import linked_model_root

    root = linked_model_root(tiny_root, tmp_path_factory.mktemp("context_model_root"), {})
    build_tiny_qwen_image_layered(root)
    build_tiny_qwen_image_layered_control(root)
    return root


def draw(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    if "context_image" in args.extra_inputs and "layer_num" not in args.extra_inputs:
        build_example_edit_dataset(args.dataset_base_path, num_samples=2, column="context_image")
    else:
        build_example_layered_dataset(args.dataset_base_path, control="mask" if "context" in args.extra_inputs
                                      else "layer")


def released_union_lora(dit: torch.nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """A random LoRA in the released In-Context-Control-Union file's layout (DiffSynth-Studio's trainer output: peft
    names under the transformer, adapter ``default``) on every layer the script targets."""
    targets = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out",
               "img_mlp.net.2", "img_mod.1", "txt_mlp.net.2", "txt_mod.1")
    generator, tensors = torch.Generator().manual_seed(0), {}
    for name, module in dit.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(targets):
            tensors[f"{name}.lora_A.default.weight"] = torch.randn(rank, module.in_features, generator=generator) / 8
            tensors[f"{name}.lora_B.default.weight"] = torch.randn(module.out_features, rank, generator=generator) / 8
    return tensors


def test_in_context_control_union_trains_from_the_released_lora(workdir, tiny_root):
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    [(config, argv)] = script_commands(QWEN, "lora/Qwen-Image-In-Context-Control-Union.sh")
    theirs = DiffusersQwenImagePipeline.from_pretrained(str(tiny_root / QWEN_IMAGE_MODEL_ID), dtype=torch.float32)
    released = released_union_lora(theirs.transformer, int(argv[argv.index("--lora_rank") + 1]))
    Path(UNION).parent.mkdir(parents=True)
    save_file(released, UNION)
    assert config is None and argv[argv.index("--lora_checkpoint") + 1] == UNION
    result = run_command(QwenImagePipeline, argv, draw)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    pipe = result["module"].pipe
    trained = workdir / "models/train/Qwen-Image-In-Context-Control-Union_lora/epoch-0.safetensors"
    # training started from the released LoRA: two Adam steps at 1e-4 leave each factor within 1e-3 of it
    peft = {name: module for name, module in pipe.dit.named_modules() if hasattr(module, "lora_A")}
    assert len(peft) == len(released) // 2
    for name, module in peft.items():
        start = released[f"{name}.lora_A.default.weight"]
        assert (module.lora_A["default"].weight.detach().cpu() - start).abs().max() < 1e-3, name
    assert lora_update(trained) > 0
    # both files load fully in diffusers' Qwen-Image pipeline
    for path, name in ((UNION, "released"), (trained, "trained")):
        messages = load_lora_into_diffusers(theirs, path, name)
        assert not [m for m in messages if "missing" in m or "unexpected" in m or "No LoRA keys" in m], messages
        assert sum(1 for key in theirs.transformer.state_dict() if f"lora_A.{name}." in key) == len(peft)


def test_layered_control_v2_trains_one_layer_with_its_mask(workdir, model_root):
    [(config, argv)] = script_commands(QWEN, "lora/Qwen-Image-Layered-Control-V2.sh", {"--dataset_num_workers": "0"})
    result = run_command(QwenImagePipeline, argv, draw)
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == "DiffSynth-Studio/Qwen-Image-Layered-Control"
    assert config is None and result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    assert lora_update(workdir / "models/train/Qwen-Image-Layered-Control-V2_lora/epoch-0.safetensors") > 0
    # The first version's command is V2's without the mask (and at rank 32); its full command trains in
    # test_qwen_full_scripts.py.
    [(_, first)] = script_commands(QWEN, "lora/Qwen-Image-Layered-Control.sh", {"--dataset_num_workers": "0"})
    parsed = [vars(build_parser().parse_args(words)) for words in (argv, first)]
    assert {key: (parsed[0][key], parsed[1][key]) for key in parsed[0] if parsed[0][key] != parsed[1][key]} == {
        "dataset_base_path": ("data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control-V2",
                              "data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control"),
        "dataset_metadata_path": ("data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control-V2/"
                                  "metadata.json",
                                  "data/diffsynth_example_dataset/qwen_image/Qwen-Image-Layered-Control/metadata.json"),
        "data_file_keys": ("image,layer_input_image,context_image", "image,layer_input_image"),
        "extra_inputs": ("layer_num,layer_input_image,context_image", "layer_num,layer_input_image"),
        "output_path": ("./models/train/Qwen-Image-Layered-Control-V2_lora",
                        "./models/train/Qwen-Image-Layered-Control_lora"),
        "lora_rank": (64, 32),
    }


# NPU script -> (its accelerate config, how many launches, the trainer flags it must hold)
NPU = {
    (QWEN, "Qwen-Image-LoRA-NPU"): (None, 2, {"task": ["sft:data_process", "sft:train"]}),
    (QWEN, "Qwen-Image-Edit-2509-LoRA-NPU"): (None, 2, {"task": ["sft:data_process", "sft:train"]}),
    (QWEN, "Qwen-Image-Edit-2509-NPU"): ("full/accelerate_config_zero3.yaml", 1, {"initialize_model_on_cpu": [True]}),
    (Z_IMAGE, "Z-Image-Turbo-NPU"): ("full/accelerate_config.yaml", 1, {"enable_npu_patch": [True]}),
}


@pytest.mark.parametrize(("training", "name"), list(NPU))
def test_npu_scripts_parse_into_runs_without_problems(training, name):
    from diffsynth.training.config.run_config import RunConfig

    config, launches, flags = NPU[(training, name)]
    found = script_commands(training, f"special/npu_training/{name}.sh")
    assert len(found) == launches and {path for path, _ in found} == {config and training / config}
    parsed = [build_parser().parse_args(argv) for _, argv in found]
    for flag, values in flags.items():
        assert [getattr(args, flag) for args in parsed] == values
    for args in parsed:
        RunConfig.from_namespace(args, runnable=False)  # raises FlagError naming every problem
    text = (training / f"special/npu_training/{name}.sh").read_text()
    assert "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in text and "\nmodelscope" not in text
