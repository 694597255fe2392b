"""``validate_lora/Wan2.1-T2V-1.3B.py`` on the tiny Wan: it writes a playable clip of the asked size and length,
and the merged LoRA changes it.

The LoRA comes from a one-epoch run of the trainer on two short generated clips, with the original Wan layer names
and a learning rate high enough that the merged weights visibly change the render.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.testing.tiny_models import WAN_ORIGINAL_MODEL_ID, WAN_ORIGINAL_PATTERNS
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline

from .helpers import REPO, load_script, train_lora

SCRIPT = "examples/wanvideo/model_training/validate_lora/Wan2.1-T2V-1.3B.py"
MODELS = ",".join(f"{WAN_ORIGINAL_MODEL_ID}:{WAN_ORIGINAL_PATTERNS[name]}"
                  for name in ("dit", "text_encoder", "vae"))
RENDER = ["--height", "32", "--width", "32", "--num_frames", "5", "--steps", "2", "--device", "cpu",
          "--torch_dtype", "float32"]


def script():
    return load_script(SCRIPT, "validate_wan_lora")


def decode(path: Path) -> np.ndarray:
    """Every frame of a video file as one ``(frames, height, width, 3)`` array."""
    import av

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]).astype(np.int16)


@pytest.fixture
def lora_file(base, tmp_path) -> Path:
    metadata = build_example_video_dataset(tmp_path / "dataset", num_videos=2, num_frames=6)
    return train_lora(WanVideoPipeline, metadata, MODELS, tmp_path / "train", "q,k,v,o,ffn.0,ffn.2",
                      extra=["--num_frames", "5"], video=True)


def test_default_models_are_the_trained_ones():
    assert script().MODEL_ID_WITH_ORIGIN_PATHS == MODELS


def test_renders_a_clip_with_the_lora_merged(lora_file, tmp_path, capsys):
    validate = script()
    with_lora = validate.main(["--lora_path", str(lora_file), "--output", str(tmp_path / "lora.mp4"), *RENDER])
    assert with_lora == tmp_path / "lora.mp4"
    out = capsys.readouterr().out
    # The tiny transformer has 2 blocks, each with 4 self-attention, 4 cross-attention and 2 FFN layers targeted.
    assert "merged 20 LoRA layers" in out and f"5 frames written to {with_lora.resolve()}" in out
    without = validate.main(["--lora_path", str(lora_file), "--lora_alpha_scale", "0", "--output",
                             str(tmp_path / "base.mp4"), "--model_id_with_origin_paths", MODELS, *RENDER])
    clips = [decode(path) for path in (with_lora, without)]
    assert clips[0].shape == clips[1].shape == (5, 32, 32, 3)
    assert np.abs(clips[0] - clips[1]).max() > 0, "the LoRA left the clip unchanged"


@pytest.mark.parametrize(("flags", "named"), [
    (["--lora_path", "missing.safetensors"], "--lora_path"),
    (["--output", "clip.avi"], "--output"),
])  # fmt: skip
def test_bad_flags_fail_before_loading(flags, named, base, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lora.safetensors").touch()
    with pytest.raises(SystemExit):
        script().main(["--lora_path", "lora.safetensors", *flags, *RENDER])
    assert named in capsys.readouterr().err


# ---- the control variants' scripts (one shared module, wan_validate.py) ----------------------------------------------

FOLDER = Path(SCRIPT).parent
# One script of each kind of input, run on its tiny repo (the Fun InP release is laid out as the tiny image-to-video
# one); the other scripts differ from these in their release's name alone.
RUNS = {
    "Wan2.1-VACE-1.3B": ["--vace_video", "clip.mp4", "--vace_reference_image", "look.png", "blue.png"],
    "Wan2.2-VACE-Fun-A14B": ["--vace_video", "clip.mp4", "--vace_video_mask", "clip.mp4", "--low_noise_lora_path",
                             "none"],
    "Wan2.1-FLF2V-14B-720P": ["--input_image", "look.png", "--end_image", "blue.png"],
    "Wan2.1-Fun-1.3B-InP": ["--input_image", "look.png"],
    "Wan2.1-Fun-V1.1-1.3B-Control": ["--control_video", "clip.mp4", "--reference_image", "look.png"],
    "Wan2.1-Fun-V1.1-1.3B-Control-Camera": ["--input_image", "look.png", "--camera_control_direction", "Left"],
}


def control_script(name: str):
    return load_script(str(FOLDER / f"{name}.py"), f"validate_{name.replace('.', '_').replace('-', '_')}")


@pytest.fixture(scope="module")
def control_root(tiny_root, tmp_path_factory) -> Path:
    from diffsynth.testing.tiny_models import WAN_I2V_ORIGINAL_MODEL_ID
    from diffsynth.testing.tiny_wan_fun import build_tiny_wan_fun

    from .helpers import linked_model_root

    root = linked_model_root(tiny_root, tmp_path_factory.mktemp("validate_models"),
                             {"PAI/Wan2.1-Fun-1.3B-InP": WAN_I2V_ORIGINAL_MODEL_ID})
    for model_id in ("PAI/Wan2.1-Fun-V1.1-1.3B-Control", "PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera"):
        build_tiny_wan_fun(root, model_id)
    return root


def write_inputs(folder: Path) -> None:
    """A clip, two images, and a LoRA of one main-block and one VACE-block layer under the original Wan names."""
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    metadata = build_example_video_dataset(folder, num_videos=1, num_frames=9, size=(32, 32))
    (metadata.parent / "video_000.mp4").rename(folder / "clip.mp4")
    Image.new("RGB", (32, 32), (220, 40, 40)).save(folder / "look.png")
    Image.new("RGB", (32, 32), (40, 40, 220)).save(folder / "blue.png")
    generator = torch.Generator().manual_seed(0)
    lora = {}
    for block in ("blocks.0", "vace_blocks.0"):
        lora[f"diffusion_model.{block}.self_attn.q.lora_A.weight"] = torch.randn(2, 32, generator=generator)
        lora[f"diffusion_model.{block}.self_attn.q.lora_B.weight"] = torch.randn(32, 2, generator=generator)
    save_file(lora, str(folder / "lora.safetensors"))
    save_file({key: value for key, value in lora.items() if ".vace_blocks." not in key}, str(folder / "dit.safetensors"))


def test_every_control_script_names_its_release_and_the_trained_files():
    scripts = sorted(path.stem for path in FOLDER.glob("Wan*.py"))
    validate = control_script("Wan2.1-VACE-1.3B").wan_validate
    assert scripts == sorted(validate.RELEASES)
    for name in scripts:
        script = control_script(name)
        entries = script.MODEL_ID_WITH_ORIGIN_PATHS.split(",")
        # Animate-2's scripts take the VAE from Wan2.1-T2V-14B
        others = {"Wan-AI/Wan2.1-T2V-14B"} if "Animate-2" in name else set()
        assert {entry.split(":")[0] for entry in entries} == {validate.RELEASES[name].model_id, *others}, name
        lora = script.wan_validate.build_parser(name).get_default("lora_path")
        assert lora.startswith(f"./models/train/{name}_") and lora.endswith("lora/epoch-4.safetensors")
    # The reference's training scripts load the same files.
    train = (REPO / "examples/wanvideo/model_training/lora/Wan2.1-Fun-V1.1-1.3B-Control.sh").read_text()
    assert control_script("Wan2.1-Fun-V1.1-1.3B-Control").MODEL_ID_WITH_ORIGIN_PATHS in train


@pytest.mark.parametrize("name", list(RUNS))
def test_a_control_script_renders_with_its_inputs(name, control_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(control_root))
    monkeypatch.chdir(tmp_path)
    write_inputs(tmp_path)
    lora = "lora.safetensors" if "VACE" in name else "dit.safetensors"
    video = control_script(name).main(["--lora_path", lora, "--output", "clip_out.mp4", *RUNS[name], *RENDER])
    assert decode(video).shape == (5, 32, 32, 3)
    out = capsys.readouterr().out
    assert f"merged {2 if 'VACE' in name else 1} LoRA layers from {lora} into dit" in out
    if name == "Wan2.1-VACE-1.3B":  # the VACE block's layer changes the clip
        base = control_script(name).main(["--lora_path", lora, "--lora_alpha_scale", "0", "--output", "base.mp4",
                                          *RUNS[name], *RENDER])
        assert np.abs(decode(video) - decode(base)).max() > 0


def test_a_control_script_refuses_missing_inputs_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lora.safetensors").touch()
    script = control_script("Wan2.1-FLF2V-14B-720P")
    with pytest.raises(SystemExit):
        script.main(["--lora_path", "lora.safetensors", "--input_image", "first.png", *RENDER])
    assert "needs --end_image: --end_image: the last frame" in capsys.readouterr().err
    (tmp_path / "first.png").touch()
    with pytest.raises(SystemExit):
        script.main(["--lora_path", "lora.safetensors", "--input_image", "first.png", "--end_image", "gone.png",
                     *RENDER])
    assert "--end_image gone.png: no such file" in capsys.readouterr().err


def test_animate_replacement_mode_takes_its_two_clips_together(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("lora.safetensors", "look.png", "clip.mp4"):
        (tmp_path / name).touch()
    with pytest.raises(SystemExit):
        control_script("Wan2.2-Animate-14B").main([
            "--lora_path", "lora.safetensors", "--input_image", "look.png", "--animate_pose_video", "clip.mp4",
            "--animate_face_video", "clip.mp4", "--animate_mask_video", "clip.mp4", *RENDER])
    assert "replacement mode takes --animate_inpaint_video (the background) and --animate_mask_video together" in \
        capsys.readouterr().err
