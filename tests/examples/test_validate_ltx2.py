"""The LTX-2 ``validate_lora`` / ``validate_full`` scripts (one shared module, ``ltx2_validate.py``): each loads the
models its training script trains on and reads the file it writes by default; on the tiny LTX-2 repos the LoRA
script writes a clip with its sound and the merged LoRA changes it, the full script loads a fine-tune's weights over
the transformer's and they change the clip; bad flags stop the script before any model loads.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from .helpers import REPO, load_script

LTX2 = REPO / "examples/ltx2/model_training"
# The reference's validate scripts' names -> their training scripts (the reference names most of them *-splited).
TRAINING = {"JoyAI-Echo-T2AV": "JoyAI-Echo-T2AV-splited", "LTX-2-T2AV-IC-LoRA": "LTX-2-T2AV-IC-LoRA-splited",
            "LTX-2-T2AV": "LTX-2-T2AV-splited", "LTX-2-T2AV_noaudio": "LTX-2-T2AV-noaudio",
            "LTX-2.3-I2AV": "LTX-2.3-I2AV-splited", "LTX-2.3-T2AV-IC-LoRA": "LTX-2.3-T2AV-IC-LoRA-splited",
            "LTX-2.3-T2AV": "LTX-2.3-T2AV-splited"}
RENDER = ["--height", "32", "--width", "32", "--num_frames", "5", "--steps", "1", "--cfg_scale", "1", "--device",
          "cpu", "--torch_dtype", "float32"]


def script(kind: str, name: str):
    return load_script(f"examples/ltx2/model_training/{kind}/{name}.py",
                       f"{kind}_{re.sub(r'[^A-Za-z0-9]', '_', name)}")


def decode(path: Path) -> tuple[np.ndarray, int]:
    """Every frame of a video file as one ``(frames, height, width, 3)`` array, and its count of audio streams."""
    import av

    with av.open(str(path)) as container:
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
        return frames.astype(np.int16), len(container.streams.audio)


@pytest.mark.parametrize("kind", ["validate_lora", "validate_full"])
def test_every_script_loads_its_training_scripts_models_and_reads_its_file(kind):
    names = sorted(path.stem for path in (LTX2 / kind).glob("*.py") if path.stem != "ltx2_validate")
    validate = script("validate_lora", "ltx2_validate")
    assert set(names) <= set(validate.RELEASES) and len(names) == (7 if kind == "validate_lora" else 4)
    for name in names:
        module = script(kind, name)
        training = (LTX2 / kind.removeprefix("validate_") / f"{TRAINING[name]}.sh").read_text()
        # every model the training script loads, but the encoders it caches with (the clip is decoded instead)
        trained = {entry for line in re.findall(r'--model_id_with_origin_paths "([^"]+)"', training)
                   for entry in line.split(",") if "_vae_encoder" not in entry}
        assert trained and trained <= set(module.MODEL_ID_WITH_ORIGIN_PATHS.split(",")), name
        flag = "checkpoint_path" if kind == "validate_full" else "lora_path"
        default = Path(module.ltx2_validate.build_parser(name, kind == "validate_full").get_default(flag))
        output = re.findall(r'--output_path "([^"]+)"', training)[-1]
        epochs = int(re.findall(r"--num_epochs (\d+)", training)[-1])
        assert default == Path(output) / f"epoch-{epochs - 1}.safetensors", name


@pytest.fixture
def trained(base, tmp_path) -> dict[str, Path]:
    """A LoRA of one attention layer (LTX-2's own names) and a full fine-tune's file moving the output layer."""
    import torch
    from safetensors.torch import load_file, save_file

    from diffsynth.testing.tiny_ltx2_repackage import LTX2_REPACKAGE_MODEL_ID

    # the released file's names: the transformer's own behind model.diffusion_model.
    weights = load_file(str(base / LTX2_REPACKAGE_MODEL_ID / "transformer.safetensors"))
    generator = torch.Generator().manual_seed(0)
    width = weights["model.diffusion_model.transformer_blocks.0.attn1.to_q.weight"].shape[1]
    layer = "diffusion_model.transformer_blocks.0.attn1.to_q"
    lora = {f"{layer}.lora_A.weight": torch.randn(2, width, generator=generator),
            f"{layer}.lora_B.weight": torch.randn(width, 2, generator=generator)}
    save_file(lora, str(tmp_path / "lora.safetensors"))
    released = weights["model.diffusion_model.proj_out.weight"]
    moved = released + torch.randn(released.shape, generator=generator)
    save_file({"proj_out.weight": moved.contiguous()}, str(tmp_path / "full.safetensors"))
    return {"lora": tmp_path / "lora.safetensors", "full": tmp_path / "full.safetensors"}


def test_the_lora_and_full_scripts_render_a_clip_with_sound_that_the_weights_change(trained, tmp_path, capsys):
    lora = script("validate_lora", "LTX-2-T2AV")
    with_lora = lora.main(["--lora_path", str(trained["lora"]), "--output", str(tmp_path / "lora.mp4"), *RENDER])
    base = lora.main(["--lora_path", str(trained["lora"]), "--lora_alpha_scale", "0", "--output",
                      str(tmp_path / "base.mp4"), *RENDER])
    full = script("validate_full", "LTX-2-T2AV").main(["--checkpoint_path", str(trained["full"]), "--output",
                                                       str(tmp_path / "full.mp4"), *RENDER])
    out = capsys.readouterr().out
    assert f"merged 1 LoRA layers from {trained['lora']} into dit" in out
    assert f"loaded 1 weights from {trained['full']} into dit" in out
    assert f"5 frames with its sound written to {with_lora.resolve()}" in out
    (lora_frames, sound), (base_frames, _), (full_frames, _) = (decode(path) for path in (with_lora, base, full))
    assert lora_frames.shape == base_frames.shape == full_frames.shape == (5, 32, 32, 3) and sound == 1
    assert np.abs(lora_frames - base_frames).max() > 8, "the LoRA left the clip (nearly) unchanged"
    assert np.abs(full_frames - base_frames).max() > 8, "the fine-tune's weights left the clip (nearly) unchanged"
    assert not list(tmp_path.glob("*.tmp*")), "a temporary file was left behind"


@pytest.mark.parametrize(("name", "flags", "message"), [
    ("LTX-2-T2AV", ["--lora_path", "missing.safetensors"], "--lora_path missing.safetensors: no such file"),
    ("LTX-2-T2AV", ["--output", "clip.gif"], "--output clip.gif: the suffix picks the format; end it in .mp4"),
    ("LTX-2.3-I2AV", [], "LTX-2.3-I2AV needs --input_image"),
    ("LTX-2-T2AV-IC-LoRA", ["--in_context_videos", "depth.mp4"], "--in_context_videos depth.mp4: no such file"),
    ("LTX-2-T2AV", ["--num_frames", "0"], "--num_frames 0 and --fps 24 must be positive"),
])  # fmt: skip
def test_bad_flags_fail_before_loading(name, flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path))  # nothing to load: a check must stop it first
    (tmp_path / "lora.safetensors").touch()
    with pytest.raises(SystemExit):
        script("validate_lora", name).main(["--lora_path", "lora.safetensors", *RENDER, *flags])
    assert message in capsys.readouterr().err


def test_the_input_scripts_render_with_their_inputs_and_the_no_audio_one_without_sound(trained, tmp_path, capsys):
    from PIL import Image

    from diffsynth.core.data.example_dataset import build_example_video_dataset

    metadata = build_example_video_dataset(tmp_path / "clips", num_videos=1, num_frames=5, size=(32, 32))
    Image.new("RGB", (32, 32), (220, 40, 40)).save(tmp_path / "first.png")
    runs = {"LTX-2-T2AV_noaudio": [], "LTX-2.3-I2AV": ["--input_image", str(tmp_path / "first.png")],
            "LTX-2-T2AV-IC-LoRA": ["--in_context_videos", str(metadata.parent / "video_000.mp4")]}
    for name, flags in runs.items():
        video = script("validate_lora", name).main(["--lora_path", str(trained["lora"]), "--lora_alpha_scale", "0",
                                                     "--output", str(tmp_path / f"{name}.mp4"), *RENDER, *flags])
        frames, sound = decode(video)
        assert frames.shape == (5, 32, 32, 3) and sound == (0 if "noaudio" in name else 1), name
    assert "5 frames without sound written to" in capsys.readouterr().out
