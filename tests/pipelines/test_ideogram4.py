"""Ideogram 4's pipeline on a tiny diffusers-layout repo: inference equal to diffusers' ``Ideogram4Pipeline`` (both
transformers and CFG, where the kit's check runs ``dit`` alone without CFG), the second transformer landing in
``dit_uncond``, and the logit-normal schedule."""

from __future__ import annotations

import pytest
import torch

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.ideogram4.pipeline import Ideogram4Pipeline
from diffsynth.testing.tiny_ideogram4 import IDEOGRAM4_MODEL_ID, IDEOGRAM4_PATTERNS

SIZE = {"height": 48, "width": 80}
STEPS = 3


@pytest.fixture(scope="module")
def repo(tiny_root):
    return tiny_root / IDEOGRAM4_MODEL_ID


def load(repo, slots=("dit", "dit_uncond", "text_encoder", "vae")):
    configs = [ModelConfig(model_id=IDEOGRAM4_MODEL_ID, origin_file_pattern=IDEOGRAM4_PATTERNS[slot]) for slot in slots]
    tokenizer = ModelConfig(model_id=IDEOGRAM4_MODEL_ID, origin_file_pattern=IDEOGRAM4_PATTERNS["tokenizer"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(repo.parents[1]))
        return Ideogram4Pipeline.from_pretrained(torch.float32, "cpu", configs, tokenizer_config=tokenizer)


@pytest.fixture(scope="module")
def ours(repo):
    return load(repo)


@pytest.fixture(scope="module")
def theirs(repo):
    import diffusers

    pipe = diffusers.Ideogram4Pipeline.from_pretrained(str(repo), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render_ours(pipe, seed=7, **kwargs):
    return pipe("a red fox", seed=seed, num_inference_steps=STEPS, output_type="pt", progress_bar=False,
                **{**SIZE, **kwargs})


def render_theirs(pipe, guidance_scale):
    return pipe(prompt="a red fox", num_inference_steps=STEPS, guidance_scale=guidance_scale, guidance_schedule=None,
                max_sequence_length=64, generator=torch.Generator().manual_seed(7), output_type="pt", **SIZE).images


def test_both_transformers_land_in_their_slots(ours):
    assert type(ours.dit).__name__ == type(ours.dit_uncond).__name__ == "Ideogram4Transformer2DModel"
    assert not torch.equal(ours.dit.input_proj.weight, ours.dit_uncond.input_proj.weight)


def test_inference_equals_diffusers(ours, theirs):
    image = render_ours(ours, cfg_scale=3.5)
    reference = render_theirs(theirs, 3.5)
    assert image.shape == reference.shape == (1, 3, 48, 80)
    difference = (image - reference).abs().max()
    assert difference < 1e-4, difference
    # Teeth: another seed, or no CFG, moves the image far beyond the tolerance.
    assert (render_ours(ours, seed=8, cfg_scale=3.5) - reference).abs().max() > 1e-2
    assert (render_ours(ours, cfg_scale=1.0) - reference).abs().max() > 1e-2


def test_without_the_unconditional_transformer_dit_runs_both_branches(repo, ours):
    single = load(repo, ("dit", "text_encoder", "vae"))
    assert single.dit_uncond is None
    image = render_ours(single, cfg_scale=3.5)
    assert (image - render_ours(ours, cfg_scale=3.5)).abs().max() > 1e-2


def test_the_schedule_is_diffusers_logit_normal(ours):
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import _logit_normal_sigmas, _resolution_aware_mu

    ours.scheduler.set_timesteps(48, image_seq_len=64 * 64)
    expected = _logit_normal_sigmas(48, _resolution_aware_mu(1024, 1024, 0.0), std=1.5)
    assert torch.allclose(ours.scheduler.sigmas, expected, atol=1e-7)
    ours.scheduler.set_timesteps(48, image_seq_len=32 * 32)
    assert not torch.allclose(ours.scheduler.sigmas, expected, atol=1e-3)


def test_a_padded_prompt_in_a_batch_gives_the_unpadded_velocity(ours):
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 128, 3, 5, generator=generator)
    prompt = torch.randn(1, 5, ours.dit.config.llm_features_dim, generator=generator)
    with torch.no_grad():
        alone = ours.model_fn(latents, torch.tensor([500.0]), prompt)
    padded = torch.cat([prompt, torch.randn(1, 3, prompt.shape[-1], generator=generator)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    with torch.no_grad():
        assert (ours.model_fn(latents, torch.tensor([500.0]), padded, mask) - alone).abs().max() < 1e-5
        # Teeth: the same padding read as text moves the velocity.
        assert (ours.model_fn(latents, torch.tensor([500.0]), padded) - alone).abs().max() > 1e-2


@pytest.mark.parametrize("model_id, tolerance", [("DiffSynth-Studio/ideogram-4-bf16-repackage", 0.0),
                                                 ("ideogram-ai/ideogram-4-fp8", 0.05)])
def test_ideograms_own_layout_loads_the_same_weights(tiny_root, model_id, tolerance):
    from diffsynth.core.loader.loading import load_model_from_files
    from diffsynth.testing.tiny_ideogram4 import RELEASE_TRANSFORMER_CONFIG, _transformer

    file = tiny_root / model_id / "transformer" / "diffusion_pytorch_model.safetensors"
    loaded = load_model_from_files([file], torch.float32, "cpu").state_dict()
    expected = _transformer(7, RELEASE_TRANSFORMER_CONFIG).state_dict()
    assert loaded.keys() == expected.keys()
    # fp8 keeps 3 mantissa bits: each weight within 1/16 of its row's largest magnitude, relative to it.
    worst = max(((loaded[key] - value).abs().max() / value.abs().max().clamp(min=1e-12)).item()
                for key, value in expected.items())
    assert worst <= tolerance, worst
    # Teeth: q and k of one block differ by far more than the tolerance (the fused rows were split in order).
    q, k = (loaded[f"layers.0.attention.to_{name}.weight"] for name in "qk")
    assert (q - k).abs().max() > 10 * max(tolerance, 1e-3) * q.abs().max()
    # The text encoder (fp8 with scales in the fp8 release) holds the weights of the plain one, the tiny repos' seed.
    encoder, plain = (load_model_from_files([tiny_root / repo / "text_encoder" / "model.safetensors"], torch.float32,
                                            "cpu").state_dict() for repo in (model_id, IDEOGRAM4_MODEL_ID))
    assert encoder.keys() == plain.keys()
    assert max(((encoder[key] - value).abs().max() / value.abs().max().clamp(min=1e-12)).item()
               for key, value in plain.items()) <= tolerance


def test_a_full_checkpoint_in_the_original_layout_reads_back(tmp_path):
    from diffsynth.core.loader.loading import load_model_from_files
    from diffsynth.testing.tiny_ideogram4 import RELEASE_TRANSFORMER_CONFIG, _transformer
    from diffsynth.training.outputs.full_model import write_full_model

    model = _transformer(7, RELEASE_TRANSFORMER_CONFIG)
    [file] = write_full_model(model, tmp_path, "epoch-0", "dit", ["original"])
    loaded = load_model_from_files([file], torch.float32, "cpu").state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in model.state_dict().items())


def _velocity(model, latents: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
    """``model``'s output for text tokens then image tokens, one segment (as the pipeline packs them)."""
    text, image = prompt.shape[1], latents.shape[1]
    positions = torch.arange(text + image)[None, :, None].expand(1, -1, 3)
    indicator = torch.tensor([[3] * text + [1] * image])  # diffusers' LLM and image token indicators
    hidden = torch.cat([latents.new_zeros(1, text, latents.shape[2]), latents], dim=1)
    features = torch.cat([prompt, prompt.new_zeros(1, image, prompt.shape[2])], dim=1)
    with torch.no_grad():
        return model(hidden, torch.tensor([0.4]), features, positions, torch.ones(1, text + image, dtype=torch.long),
                     indicator).sample


def test_the_nf4_release_loads_packed_and_computes_its_dequantized_weights(tiny_root, tmp_path):
    bnb = pytest.importorskip("bitsandbytes")
    from safetensors.torch import load_file, save_file

    from diffsynth.core.loader.loading import load_model_from_files
    from diffsynth.testing.tiny_ideogram4 import NF4_ID, RELEASE_TRANSFORMER_CONFIG, _transformer

    file = tiny_root / NF4_ID / "transformer" / "diffusion_pytorch_model.safetensors"
    nf4 = load_model_from_files([file], torch.float32, "cpu")
    linears = [module for module in nf4.modules() if isinstance(module, torch.nn.Linear)]
    assert linears and all(isinstance(module, bnb.nn.Linear4bit) for module in linears)
    assert nf4.layers[0].attention.to_q.weight.dtype == torch.uint8
    # The reference: bitsandbytes' own dequantize_4bit of each tensor of the file as it is (the fused qkv whole),
    # loaded through the bf16 repackage's reader, which splits plain rows.
    raw = load_file(str(file))
    blob = ".quant_state.bitsandbytes__nf4"
    # The keys the reference's loader groups (everything after ``.weight.`` is a statistic of that packed weight):
    # exactly bitsandbytes' non-nested three beside each uint8 weight.
    stats = {}
    for key in (key for key in raw if ".weight." in key):
        weight, _, stat = key.rpartition(".weight.")
        stats.setdefault(f"{weight}.weight", set()).add(stat)
    assert stats and all(raw[weight].dtype == torch.uint8 for weight in stats)
    assert all(names == {"absmax", "quant_map", blob[1:]} for names in stats.values())
    states = {key.removesuffix(blob): bnb.functional.QuantState.from_dict(
        {name: value for name, value in raw.items() if name.startswith(key.removesuffix(blob) + ".")}, "cpu")
        for key in raw if key.endswith(blob)}
    assert "layers.0.attention.qkv.weight" in states
    dequantized = {key: bnb.functional.dequantize_4bit(value, states[key]) if key in states else value
                   for key, value in raw.items() if ".weight." not in key}
    save_file(dequantized, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    plain = load_model_from_files([tmp_path / "diffusion_pytorch_model.safetensors"], torch.float32, "cpu")
    generator = torch.Generator().manual_seed(0)
    latents, prompt = torch.randn(1, 6, 128, generator=generator), torch.randn(1, 4, 208, generator=generator)
    out = _velocity(nf4, latents, prompt)
    assert (out - _velocity(plain, latents, prompt)).abs().max() < 1e-5
    # Close to the float32 weights it was quantized from, within NF4's error (4 bits: a code step is up to a seventh
    # of the block's largest magnitude); teeth: the weights of another seed move it far more.
    scale = out.abs().max()
    error = (out - _velocity(_transformer(7, RELEASE_TRANSFORMER_CONFIG), latents, prompt)).abs().max() / scale
    other = (out - _velocity(_transformer(9, RELEASE_TRANSFORMER_CONFIG), latents, prompt)).abs().max() / scale
    assert error < 0.15 and other > 5 * error, (error, other)


def test_the_nf4_text_encoder_loads_packed_close_to_the_plain_one(tiny_root):
    bnb = pytest.importorskip("bitsandbytes")
    from diffsynth.core.loader.loading import load_model_from_files
    from diffsynth.testing.tiny_ideogram4 import NF4_ID

    nf4, plain = (load_model_from_files([tiny_root / repo / "text_encoder" / "model.safetensors"], torch.float32,
                                        "cpu") for repo in (NF4_ID, IDEOGRAM4_MODEL_ID))
    linears = {name: module.weight for name, module in plain.named_modules() if isinstance(module, torch.nn.Linear)}
    packed = {name: nf4.get_submodule(name) for name in linears}
    assert linears and all(isinstance(layer, bnb.nn.Linear4bit) for layer in packed.values())
    # Each layer holds its own weight's blocks: their largest magnitudes (bitsandbytes' CPU dequantizer misreads rows
    # narrower than a block, as these 16-wide ones are, so the statistics are compared, not the dequantized values).
    for name, layer in packed.items():
        assert layer.weight.quant_state.shape == linears[name].shape
        assert torch.equal(layer.weight.quant_state.absmax, linears[name].reshape(-1, 64).abs().amax(dim=1)), name
    with torch.no_grad():
        assert torch.isfinite(nf4(input_ids=torch.arange(3, 19)[None]).last_hidden_state).all()


@pytest.mark.parametrize("quant_type, compress, why", [("fp4", False, "quant type 'fp4'"),
                                                       ("nf4", True, "double-quantized")])
def test_other_4bit_layouts_are_refused_naming_why(tmp_path, quant_type, compress, why):
    bnb = pytest.importorskip("bitsandbytes")
    from safetensors.torch import save_file

    from diffsynth.core.loader.errors import ModelLoadError
    from diffsynth.pipelines.ideogram4.original import identify

    layer = bnb.nn.Linear4bit(64, 8, bias=False, compress_statistics=compress, quant_type=quant_type, device="meta")
    layer.weight = bnb.nn.Params4bit(torch.randn(8, 64), compress_statistics=compress, quant_type=quant_type).to("cpu")
    save_file({f"llm_cond_proj.{key}": value for key, value in layer.state_dict().items()},
              str(tmp_path / "other.safetensors"))
    with pytest.raises(ModelLoadError, match=f"llm_cond_proj.weight is bitsandbytes {why}.*compress_statistics=False"):
        identify([tmp_path / "other.safetensors"])
