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

from .helpers import load_script, train_lora

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
