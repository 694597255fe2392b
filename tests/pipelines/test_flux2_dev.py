"""FLUX.2 [dev] in the FLUX.2 room: output parity with diffusers' own Flux2Pipeline on the tiny repo (the guidance
input, a reference image), the Mistral-3 prompt embedding, CFG, training inputs, the tokenizer beside a text encoder
given by path, and a trained LoRA loading fully in diffusers' pipeline."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline
from diffsynth.testing.tiny_flux2 import FLUX2_PATTERNS
from diffsynth.testing.tiny_flux2_dev import FLUX2_DEV_MODEL_ID
from tests.conftest import load_lora_into_diffusers
from tests.examples.helpers import train_lora
from tests.pipelines.family_helpers import load_ours

PROMPT = "a red cube on a blue table"
MODELS = [f"{FLUX2_DEV_MODEL_ID}:{FLUX2_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")]
SIZE = dict(height=48, width=80)


def diffusers_pipeline(repo):
    """diffusers' Flux2Pipeline on the repo's folders; the tokenizer as ``AutoTokenizer`` reads it, since diffusers'
    own loader would read it as a PixtralProcessor, which needs torchvision."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel
    from transformers import AutoTokenizer, Mistral3ForConditionalGeneration

    pipe = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(repo / "scheduler"),
                         vae=AutoencoderKLFlux2.from_pretrained(repo / "vae"),
                         text_encoder=Mistral3ForConditionalGeneration.from_pretrained(repo / "text_encoder"),
                         tokenizer=AutoTokenizer.from_pretrained(repo / "tokenizer"),
                         transformer=Flux2Transformer2DModel.from_pretrained(repo / "transformer"))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def ours(tiny_root):
    return load_ours(tiny_root, "flux2_klein", MODELS)


@pytest.fixture(scope="module")
def theirs(tiny_root):
    return diffusers_pipeline(tiny_root / FLUX2_DEV_MODEL_ID)


def render(pipe, seed=7, **options):
    return pipe(PROMPT, seed=seed, num_inference_steps=3, output_type="pt", progress_bar=False, **options)


def render_theirs(pipe, guidance, seed=7, **options):
    return pipe(prompt=PROMPT, guidance_scale=guidance, num_inference_steps=3, output_type="pt",
                generator=torch.Generator().manual_seed(seed), **options).images


@pytest.mark.parametrize(("guidance", "with_image"), [(4.0, False), (2.5, True)])
def test_matches_diffusers_flux2_pipeline(ours, theirs, guidance, with_image):
    image_in = Image.fromarray(np.random.default_rng(0).integers(0, 256, (72, 88, 3), dtype=np.uint8))
    ours_size, their_size = ({"edit_image": [image_in]}, {"image": [image_in]}) if with_image else (SIZE, SIZE)
    image = render(ours, embedded_guidance=guidance, **ours_size)
    reference = render_theirs(theirs, guidance, **their_size)
    # With a reference image the output takes its size, the sides cut down to multiples of 16.
    assert image.shape == reference.shape == ((1, 3, 64, 80) if with_image else (1, 3, 48, 80))
    assert (image - reference).abs().max() < 1e-4
    # Teeth: another seed, and another guidance scale, move the output far beyond the tolerance.
    assert (render(ours, seed=8, embedded_guidance=guidance, **ours_size) - reference).abs().max() > 1e-2
    assert (render(ours, embedded_guidance=1.0, **ours_size) - reference).abs().max() > 1e-3


def test_the_prompt_embedding_is_diffusers(ours, theirs):
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    from diffsynth.pipelines.flux2_klein.prompt import MISTRAL_SYSTEM_MESSAGE, PromptEmbedderUnit

    assert MISTRAL_SYSTEM_MESSAGE == SYSTEM_MESSAGE
    # The byte-level tiny tokenizer spends 170 tokens on the system message.
    embedding = PromptEmbedderUnit().process(ours, PROMPT + " [IMG]", 256)["prompt_emb"]
    reference = theirs._get_mistral_3_small_prompt_embeds(theirs.text_encoder, theirs.tokenizer, PROMPT + " [IMG]",
                                                          max_sequence_length=256)
    assert embedding.shape == (1, 256, 3 * 16) and torch.equal(embedding, reference)
    other = PromptEmbedderUnit().process(ours, "a green sphere", 256)["prompt_emb"]
    assert (other - reference).abs().max() > 1e-2
    without_encoder = Flux2KleinPipeline()
    without_encoder.dit = ours.dit
    with pytest.raises(ValueError, match=r"add 'black-forest-labs/FLUX.2-dev:text_encoder/\*.safetensors'"):
        PromptEmbedderUnit().process(without_encoder, PROMPT, 256)


def test_a_folder_holding_only_the_processors_template_tokenizes_alike(theirs, tiny_root, tmp_path):
    from transformers import AutoTokenizer

    from diffsynth.pipelines.flux2_klein.prompt import mistral3_tokens

    folder = shutil.copytree(tiny_root / FLUX2_DEV_MODEL_ID / "tokenizer", tmp_path / "tokenizer")
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))  # the processor's old file
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template is None  # a tokenizer reads no chat_template.json
    assert torch.equal(mistral3_tokens(tokenizer, PROMPT, 256)["input_ids"],
                       mistral3_tokens(theirs.tokenizer, PROMPT, 256)["input_ids"])


def test_dev_runs_without_cfg_unless_asked_and_trains_at_guidance_one(ours):
    assert ours.dit.config.guidance_embeds and not ours.is_distilled
    assert ours._effective_cfg_scale(None) == 1.0 and ours._effective_cfg_scale(2.0) == 2.0
    plain = render(ours, height=32, width=32)
    guided = render(ours, cfg_scale=2.0, negative_prompt="blurry", height=32, width=32)
    assert (plain - guided).abs().max() > 1e-3  # true CFG runs on top of the embedded guidance, as the reference's
    shared, _, _ = ours.training_inputs({"image": Image.new("RGB", (32, 48)), "prompt": "p"})
    assert shared["embedded_guidance"] == 1.0 and shared["cfg_scale"] == 1


def test_a_mistral_encoder_given_by_path_gets_the_dev_tokenizer(tiny_root):
    encoder = ModelConfig(path=str(tiny_root / FLUX2_DEV_MODEL_ID / "text_encoder"))
    companions = Flux2KleinPipeline.companion_configs([encoder])
    assert [(config.model_id, config.origin_file_pattern) for config in companions] == \
        [(FLUX2_DEV_MODEL_ID, "tokenizer/")]
    klein = ModelConfig(path=str(tiny_root / "black-forest-labs/FLUX.2-klein-4B" / "text_encoder"))
    assert Flux2KleinPipeline.companion_configs([klein]) == [Flux2KleinPipeline.default_tokenizer_config]


def test_a_trained_lora_loads_fully_in_diffusers_and_changes_its_output(base, theirs, tmp_path):
    metadata = build_example_dataset(tmp_path / "data", num_images=2)
    lora = train_lora(Flux2KleinPipeline, metadata, ",".join(MODELS), tmp_path / "train",
                      "to_q,to_k,to_v,to_out.0,add_q_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj")
    # The universal file keeps diffusers' names bare (ComfyUI's FLUX.2 map); its twin is the one diffusers reads whole.
    twin = lora.with_name("epoch-0.diffusers.safetensors")
    before = render_theirs(theirs, 4.0, height=32, width=32)
    try:
        assert load_lora_into_diffusers(theirs, twin, "dev") == []
        layers = [name for name, _ in theirs.transformer.named_parameters() if "lora_A" in name]
        with_lora = render_theirs(theirs, 4.0, height=32, width=32)
    finally:
        theirs.unload_lora_weights()
    double, single = len(theirs.transformer.transformer_blocks), len(theirs.transformer.single_transformer_blocks)
    # to_q, to_k, to_v, to_out.0, add_q_proj, to_add_out, ff.linear_in/out and ff_context.linear_in/out per double
    # block; to_qkv_mlp_proj per single block.
    assert len(layers) == 10 * double + single
    assert (with_lora - before).abs().max() > 1e-5
