"""The Wan ``validate_full`` scripts and the ``validate_lora`` ones of the plain and Animate releases, on the tiny
repos: a full fine-tune's flat file renders as the pipeline holding those weights, each kind of trained model (the
transformer, the Wan2.2 experts, the VACE blocks, the Animate modules) and of input loads, and every script names
the release and files its training script uses.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from .helpers import REPO, load_script
from .test_validate_lora_wan import RENDER, decode, write_inputs

TRAINING = REPO / "examples/wanvideo/model_training"
# A weight of each trained model, under the transformer's own names (the flat file's): the tiny transformers are 32 wide.
WEIGHTS = {"dit": "blocks.0.attn1.to_q.weight", "vace": "vace_blocks.0.attn1.to_q.weight",
           "animate_adapter": "face_adapter.0.to_q.weight"}


def script(folder: str, name: str):
    return load_script(str(TRAINING / folder / f"{name}.py"),
                       f"{folder}_{name.replace('.', '_').replace('-', '_')}")


@pytest.mark.parametrize("folder", ["validate_full", "validate_lora"])
def test_every_script_names_its_release_and_the_files_its_training_reads(folder):
    full = folder == "validate_full"
    names = sorted(path.stem for path in (TRAINING / folder).glob("Wan*.py"))
    assert names == sorted(path.stem for path in (TRAINING / "full").glob("Wan*.sh"))
    for name in names:
        validate = script(folder, name)
        assert validate.NAME == name
        words = shlex.split((TRAINING / ("full" if full else "lora") / f"{name}.sh").read_text(), comments=True)
        trained = {entry for index, word in enumerate(words) if word == "--model_id_with_origin_paths"
                   for entry in words[index + 1].split(",")}
        assert set(validate.MODEL_ID_WITH_ORIGIN_PATHS.split(",")) == trained, name
        outputs = [words[index + 1] for index, word in enumerate(words) if word == "--output_path"]
        defaults = [validate.wan_validate.build_parser(name, full).get_default(flag[2:])
                    for flag in validate.wan_validate.weight_flags(name, full)]
        # A split script's first command writes its cache (Animate-2's): the trained files are the last commands'.
        outputs = outputs[len(outputs) - len(defaults):]
        assert [str(Path(path).parent) for path in defaults] == [str(Path(path)) for path in outputs], name


def test_a_full_checkpoint_renders_as_the_pipeline_holding_its_weights(base, tmp_path, monkeypatch):
    from diffsynth.core import parse_model_id_with_origin_paths
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline, save_video

    monkeypatch.chdir(tmp_path)
    validate = script("validate_full", "Wan2.1-T2V-1.3B")
    args = validate.wan_validate.build_parser(validate.NAME, full=True).parse_args(RENDER)
    pipe = WanVideoPipeline.from_pretrained(torch_dtype=torch.float32, device="cpu", model_configs=(
        parse_model_id_with_origin_paths(validate.MODEL_ID_WITH_ORIGIN_PATHS)))

    def render(output: str) -> np.ndarray:
        frames = pipe(args.prompt, negative_prompt=args.negative_prompt, cfg_scale=args.cfg_scale,
                      height=args.height, width=args.width, num_frames=args.num_frames, seed=args.seed,
                      num_inference_steps=args.steps)
        save_video(frames, output, fps=args.fps)
        return decode(Path(output))

    released = render("released.mp4")
    generator = torch.Generator().manual_seed(0)
    trained = {key: value + 0.3 * torch.randn(value.shape, generator=generator)
               for key, value in pipe.dit.state_dict().items() if key.startswith("blocks.")}
    save_file(trained, "epoch-1.safetensors")
    pipe.dit.load_state_dict(trained, strict=False)
    expected = render("expected.mp4")
    video = decode(validate.main(["--checkpoint_path", "epoch-1.safetensors", "--output", "out.mp4", *RENDER]))
    assert np.array_equal(video, expected)
    assert np.abs(video - released).max() > 20, "the fine-tuned weights left the clip unchanged"


# One script of each kind of trained model and input: (folder, release, flags besides the weights, after RENDER's).
RUNS = {
    "experts": ("validate_full", "Wan2.2-T2V-A14B", []),
    "vace": ("validate_full", "Wan2.1-VACE-1.3B", ["--vace_video", "clip.mp4", "--vace_reference_image", "look.png"]),
    # Animate renders num_frames - 4 frames (the reference image's latent slot is dropped).
    # In replacement mode: the background and mask clips are read like the pose clip.
    "animate": ("validate_full", "Wan2.2-Animate-14B", ["--input_image", "look.png", "--animate_pose_video",
                                                         "clip.mp4", "--animate_face_video", "clip.mp4",
                                                         "--animate_inpaint_video", "clip.mp4",
                                                         "--animate_mask_video", "clip.mp4", "--num_frames", "9"]),
    "wan2.2-vae": ("validate_lora", "Wan2.2-TI2V-5B", ["--input_image", "look.png"]),
}


@pytest.mark.parametrize("kind", list(RUNS))
def test_a_script_renders_with_its_trained_model_and_inputs(kind, base, tmp_path, monkeypatch, capsys):
    folder, name, flags = RUNS[kind]
    monkeypatch.chdir(tmp_path)
    write_inputs(tmp_path)
    validate = script(folder, name)
    full = folder == "validate_full"
    weights = validate.wan_validate.weight_flags(name, full)
    if full:
        key = WEIGHTS[validate.wan_validate.RELEASES[name].part]
        save_file({key: torch.randn(32, 32, generator=torch.Generator().manual_seed(1))}, "epoch-1.safetensors")
    path = "epoch-1.safetensors" if full else "dit.safetensors"
    argv = [word for flag in weights for word in (flag, path)]
    video = validate.main([*argv, "--output", "out.mp4", *RENDER, *flags])
    assert decode(video).shape == (5, 32, 32, 3)
    out = capsys.readouterr().out
    for model in ("dit", "dit2")[:len(weights)]:
        assert (f"loaded 1 weights from {path} into {model}" if full else
                f"merged 1 LoRA layers from {path} into {model}") in out


def test_a_checkpoint_of_another_model_is_refused(base, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    save_file({"vace_blocks.0.attn1.to_q.weight": torch.zeros(32, 32)}, "epoch-1.safetensors")
    with pytest.raises(SystemExit):
        script("validate_full", "Wan2.1-T2V-1.3B").main(["--checkpoint_path", "epoch-1.safetensors", *RENDER])
    error = capsys.readouterr().err
    assert "--checkpoint_path epoch-1.safetensors" in error and "full fine-tune of Wan2.1-T2V-1.3B" in error


# The NPU scripts are full/ scripts' commands (which test_wan_full_scripts.py and test_wan_vace_scripts.py run on the
# tiny repos) with the reference's example dataset, the model built on the CPU, and for VACE-Fun its learning rate.
NPU = {"Wan2.1-T2V-14B": {}, "Wan2.2-T2V-A14B": {}, "Wan2.2-VACE-Fun-A14B": {"learning_rate": (1e-4, 5e-5)}}


@pytest.mark.parametrize("name", list(NPU))
def test_npu_scripts_are_the_full_commands_built_on_the_cpu(name):
    from diffsynth.training.config.parsers import build_parser

    from .helpers import script_commands

    npu = script_commands(TRAINING, f"special/npu_training/{name}-NPU.sh")
    full = script_commands(TRAINING, f"full/{name}.sh")
    assert len(npu) == len(full) == (2 if "A14B" in name else 1)
    for (npu_config, npu_argv), (full_config, full_argv) in zip(npu, full):
        assert npu_config == full_config == TRAINING / "full/accelerate_config_14B.yaml"
        parsed = [vars(build_parser(video=True).parse_args(argv)) for argv in (npu_argv, full_argv)]
        differences = {key: (parsed[0][key], parsed[1][key]) for key in parsed[0] if parsed[0][key] != parsed[1][key]}
        assert parsed[0]["initialize_model_on_cpu"]
        assert parsed[0]["dataset_base_path"] == f"data/diffsynth_example_dataset/wanvideo/{name}"
        dataset = {key: value for key, value in differences.items() if key.startswith("dataset_")}
        assert {key: value for key, value in differences.items() if key not in dataset
                and key != "initialize_model_on_cpu"} == NPU[name]
    text = (TRAINING / f"special/npu_training/{name}-NPU.sh").read_text()
    assert "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in text
    assert "\nmodelscope" not in text  # the download is a comment


@pytest.mark.parametrize("kind", ["direct_distill", "fp8_training", "low_vram_training", "split_training"])
def test_special_validate_scripts_read_what_their_run_writes(kind):
    validate = load_script(str(TRAINING / "special" / kind / "validate.py"), f"validate_special_{kind}")
    [train] = (TRAINING / "special" / kind).glob(f"{validate.NAME}.sh")
    words = shlex.split(train.read_text(), comments=True)
    full = "checkpoint_path" in validate.DEFAULTS
    parser = validate.wan_validate.build_parser(validate.NAME, full)
    parser.set_defaults(**validate.DEFAULTS)
    weights = parser.get_default("checkpoint_path" if full else "lora_path")
    outputs = [words[index + 1] for index, word in enumerate(words) if word == "--output_path"]
    assert Path(weights).parent == Path(outputs[-1])  # a split run's stage 2 writes the LoRA
