"""Wan: output parity with diffusers' WanPipeline on the tiny repo, unit declarations, video I/O, bad input."""

import logging

import pytest
import torch
from PIL import Image

from diffsynth.testing.tiny_models import WAN_MODEL_ID, WAN_PATTERNS, WAN_SCHEDULER_CONFIG
from diffsynth.diffusion.flow_match import DiffusersScheduler
from diffsynth.pipelines.wan_video.units import clean_prompt, round_frames
from diffsynth.pipelines.wan_video.pipeline import ModelConfig, WanVideoPipeline, save_video
from tests.pipelines.family_helpers import load_ours, load_theirs

PROMPT, NEGATIVE = "a red ball   rolling &amp; bouncing", "static, blurry"
SIZE = dict(height=32, width=48, num_frames=5, num_inference_steps=3)


def configs(*names):
    return [ModelConfig(model_id=WAN_MODEL_ID, origin_file_pattern=WAN_PATTERNS[n]) for n in names]


def unipc():
    from diffusers import UniPCMultistepScheduler

    return DiffusersScheduler(UniPCMultistepScheduler.from_config(WAN_SCHEDULER_CONFIG))


@pytest.fixture(scope="module")
def pipes(tiny_root):
    from diffusers import WanPipeline

    return load_ours(tiny_root, "wan_video"), load_theirs(tiny_root, WanPipeline, WAN_MODEL_ID)


# CFG with a negative prompt is the family kit's case (tests/pipelines/test_family_kit.py).
@pytest.mark.parametrize("cfg_scale", [1.0])
def test_matches_diffusers_pipeline(pipes, cfg_scale):
    ours, theirs = pipes
    ours.scheduler = unipc()
    try:
        video = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=7, output_type="pt",
                     progress_bar=False, **SIZE)
        other = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=8, output_type="pt",
                     progress_bar=False, **SIZE)
    finally:
        ours.scheduler = WanVideoPipeline().scheduler
    reference = theirs(PROMPT, negative_prompt=NEGATIVE, guidance_scale=cfg_scale,
                       generator=torch.Generator().manual_seed(7), output_type="pt", **SIZE).frames
    assert video.shape == reference.shape == (1, 5, 3, 32, 48)
    assert (video - reference).abs().max() < 1e-4
    assert (other - reference).abs().max() > 1e-2


def test_default_schedule_returns_frames_of_the_rounded_size(pipes, caplog):
    ours, _ = pipes
    with caplog.at_level(logging.WARNING, logger="diffsynth.pipelines"):
        frames = ours(PROMPT, cfg_scale=1.0, height=30, width=40, num_frames=7, num_inference_steps=2, seed=0,
                      progress_bar=False)
    assert len(frames) == 5 and all(isinstance(f, Image.Image) and f.size == (48, 32) for f in frames)
    assert "num_frames=7 is not of the form 4k+1; using 5" in caplog.text and "width=40" in caplog.text
    assert ours.scheduler.timesteps[0] == 1000


def test_video_to_video_noises_the_input_to_the_first_timestep(pipes):
    ours, _ = pipes
    ours.scheduler.set_timesteps(4, 0.5)
    frames = [Image.new("RGB", (48, 32), (20 * i, 100, 200)) for i in range(5)]
    shared, _, _ = ours.run_units({"height": 32, "width": 48, "num_frames": 5, "seed": 3, "input_video": frames,
                                   "denoising_strength": 0.5}, {"prompt": PROMPT}, {})
    sigma = ours.scheduler.sigmas[0]
    assert shared["input_latents"].shape == shared["noise"].shape == (1, 16, 2, 4, 6)
    expected = (1 - sigma) * shared["input_latents"] + sigma * shared["noise"]
    assert torch.allclose(shared["latents"], expected, atol=1e-6)
    with pytest.raises(ValueError, match="input_video has 5 frames, fewer than num_frames=9; pass num_frames=5"):
        ours.run_units({"height": 32, "width": 48, "num_frames": 9, "input_video": frames}, {"prompt": PROMPT}, {})


def test_units_do_what_they_declare(pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes
    ours.scheduler.set_timesteps(2, 0.5)
    frames = [Image.new("RGB", (48, 32))] * 5
    shared = {"cfg_scale": 2.0, "height": 32, "width": 48, "num_frames": 5, "seed": 0, "rand_device": "cpu",
              "input_video": frames, "denoising_strength": 0.5, "max_sequence_length": 16}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}


def test_prompt_cleaning_and_frame_rounding():
    assert clean_prompt("  a  &amp;lt;b&amp;gt;\n c ") == "a <b> c"
    assert [round_frames(n) for n in (1, 4, 5, 8, 81, 84)] == [1, 1, 5, 5, 81, 81]


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_save_video_writes_a_readable_file(tmp_path, suffix):
    import av

    frames = [Image.new("RGB", (48, 32), (40 * i, 0, 0)) for i in range(5)]
    path = save_video(frames, tmp_path / f"clip{suffix}", fps=8)
    with av.open(str(path)) as container:
        decoded = [frame.to_image() for frame in container.decode(video=0)]
    assert len(decoded) == 5 and decoded[0].size == (48, 32)
    assert decoded[4].getpixel((10, 10))[0] > decoded[0].getpixel((10, 10))[0] + 100
    with pytest.raises(ValueError, match="must end in .mp4 or .gif"):
        save_video(frames, tmp_path / "clip.avi")


def test_original_wan_names_select_diffusers_layers_and_the_file_names_them_back(tiny_root, monkeypatch, tmp_path):
    from safetensors.torch import load_file

    from diffsynth.training.outputs.logger import ModelLogger
    from diffsynth.training.objective.training_module import DiffusionTrainingModule

    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    pipe = WanVideoPipeline.from_pretrained(torch.float32, "cpu", configs("dit"))
    module = DiffusionTrainingModule(pipe, task="sft:train", lora_base_model="dit",
                                     lora_target_modules=["q", "k", "v", "o", "ffn.0", "ffn.2"], lora_rank=4)
    wrapped = sorted({name.split(".lora_")[0].removeprefix("pipe.dit.") for name in module.trainable_state_dict()})
    assert len(wrapped) == 2 * 10  # per block: q, k, v, o of both attentions, and the two FFN layers
    assert "blocks.1.attn2.to_out.0" in wrapped and "blocks.0.ffn.net.0.proj" in wrapped
    assert module.lora_config["lora_target_modules"] == ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj",
                                                          "ffn.net.2"]
    path = ModelLogger(tmp_path, lora_metadata=module.lora_config).save_lora(module.trainable_state_dict(), "lora")
    saved = load_file(str(path))
    assert "diffusion_model.blocks.1.cross_attn.o.lora_B.weight" in saved
    assert "diffusion_model.blocks.0.ffn.0.lora_A.weight" in saved and len(saved) == 40


def test_video_to_video_works_with_the_diffusers_scheduler_too(pipes):
    ours, _ = pipes
    ours.scheduler = unipc()
    try:
        frames = [Image.new("RGB", (48, 32), (200, 30, 90))] * 5
        video = ours(PROMPT, cfg_scale=1.0, input_video=frames, denoising_strength=0.5, seed=0, output_type="pt",
                     progress_bar=False, **{**SIZE, "num_inference_steps": 4})
    finally:
        ours.scheduler = WanVideoPipeline().scheduler
    assert video.shape == (1, 5, 3, 32, 48) and torch.isfinite(video).all()
