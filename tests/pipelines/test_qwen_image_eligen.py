"""Qwen-Image EliGen (entity prompts and masks): the masked forward equals a plain-torch restatement of the reference
implementation's (DiffSynth-Studio's ``QwenImageDiT.process_entity_masks`` and its blocks) on the tiny repo's weights;
without entities nothing changes; the units, the dataset and bad input."""

import pytest
import torch
from PIL import Image

from diffsynth.pipelines.qwen_image.eligen import EntityAttnProcessor, EntityPromptUnit, entity_lists
from tests.pipelines.family_helpers import load_ours

PROMPT, NEGATIVE, ENTITIES = "a cat under a tree", "blurry", ["a red hat", "a tall green tree with many leaves"]
HEIGHT, WIDTH = 32, 48


def mask(box: tuple[int, int, int, int]) -> Image.Image:
    """A black RGB image of the output's size, white in ``box``."""
    picture = Image.new("RGB", (WIDTH, HEIGHT))
    picture.paste((255, 255, 255), box)
    return picture


@pytest.fixture(scope="module")
def ours(tiny_root):
    return load_ours(tiny_root, "qwen_image")


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """``B C (H P) (W Q) -> B (H W) (C P Q)``, the reference's rearrange."""
    batch, channels, height, width = latents.shape
    patches = latents.reshape(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(batch, (height // 2) * (width // 2), channels * 4)


def reference_mask(entity_masks, seq_lens, image_tokens):
    """``process_entity_masks``' attention mask, its loops as the reference writes them; ``entity_masks`` are
    ``(1, N, 1, h, w)`` floats."""
    masks = entity_masks.repeat(1, 1, 16, 1, 1)
    masks = [masks[:, i] for i in range(masks.shape[1])]
    masks = [patchify(m) for m in masks + [torch.ones_like(masks[0])]]
    total = sum(seq_lens) + image_tokens
    attention = torch.ones((1, total, total), dtype=torch.bool)
    cumsum = [0]
    for length in seq_lens:
        cumsum.append(cumsum[-1] + length)
    image_start = cumsum[-1]
    for i in range(len(masks)):
        image_mask = (masks[i].sum(dim=-1) > 0).unsqueeze(1).repeat(1, seq_lens[i], 1)
        image_mask = image_mask.repeat(1, 1, image_tokens // image_mask.shape[-1])
        attention[:, cumsum[i]:cumsum[i + 1], image_start:] = image_mask
        attention[:, image_start:, cumsum[i]:cumsum[i + 1]] = image_mask.transpose(1, 2)
    for i in range(len(masks)):
        for j in range(len(masks)):
            if i != j:
                attention[:, cumsum[i]:cumsum[i + 1], cumsum[j]:cumsum[j + 1]] = False
    additive = attention.float()
    additive[additive == 0] = float("-inf")
    additive[additive == 1] = 0
    return additive.unsqueeze(1)


def reference_rope(x, freqs):
    """The reference's ``apply_rotary_emb_qwen`` on ``b h s d`` tensors."""
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(rotated * freqs).flatten(3).type_as(x)


def reference_block(block, image, text, temb, rotary, attention_mask):
    """The reference's ``QwenImageTransformerBlock.forward`` and ``QwenDoubleStreamAttention``, in plain torch."""
    def modulate(x, params):
        shift, scale, gate = params.chunk(3, dim=-1)
        return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1), gate.unsqueeze(1)

    attn, heads = block.attn, block.attn.heads
    img_mod_attn, img_mod_mlp = block.img_mod(temb).chunk(2, dim=-1)
    txt_mod_attn, txt_mod_mlp = block.txt_mod(temb).chunk(2, dim=-1)
    img_in, img_gate = modulate(block.img_norm1(image), img_mod_attn)
    txt_in, txt_gate = modulate(block.txt_norm1(text), txt_mod_attn)

    def split(x):
        return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)

    img_q, img_k, img_v = split(attn.to_q(img_in)), split(attn.to_k(img_in)), split(attn.to_v(img_in))
    txt_q, txt_k = split(attn.add_q_proj(txt_in)), split(attn.add_k_proj(txt_in))
    txt_v = split(attn.add_v_proj(txt_in))
    img_q, img_k = attn.norm_q(img_q), attn.norm_k(img_k)
    txt_q, txt_k = attn.norm_added_q(txt_q), attn.norm_added_k(txt_k)
    img_q, img_k = reference_rope(img_q, rotary[0]), reference_rope(img_k, rotary[0])
    txt_q, txt_k = reference_rope(txt_q, rotary[1]), reference_rope(txt_k, rotary[1])
    joint = torch.nn.functional.scaled_dot_product_attention(
        torch.cat([txt_q, img_q], dim=2), torch.cat([txt_k, img_k], dim=2), torch.cat([txt_v, img_v], dim=2),
        attn_mask=attention_mask)
    joint = joint.transpose(1, 2).flatten(2)
    seq_txt = text.shape[1]
    image = image + img_gate * attn.to_out[0](joint[:, seq_txt:])
    text = text + txt_gate * attn.to_add_out(joint[:, :seq_txt])
    img_in2, img_gate2 = modulate(block.img_norm2(image), img_mod_mlp)
    txt_in2, txt_gate2 = modulate(block.txt_norm2(text), txt_mod_mlp)
    return text + txt_gate2 * block.txt_mlp(txt_in2), image + img_gate2 * block.img_mlp(img_in2)


def reference_forward(dit, latents, timestep, prompt_emb, entity_embs, entity_masks):
    """``model_fn_qwen_image`` with entity inputs (batch 1, no edit images), restated."""
    height, width = latents.shape[-2:]
    image = dit.img_in(patchify(latents))
    temb = dit.time_text_embed(timestep / 1000, image)
    text = torch.cat([dit.txt_in(dit.txt_norm(e)) for e in [*entity_embs, prompt_emb]], dim=1)
    shapes = [(1, height // 2, width // 2)]
    vid_freqs, txt_freqs = dit.pos_embed(shapes, max_txt_seq_len=prompt_emb.shape[1], device=latents.device)
    entity_freqs = [dit.pos_embed(shapes, max_txt_seq_len=e.shape[1], device=latents.device)[1] for e in entity_embs]
    rotary = (vid_freqs, torch.cat([*entity_freqs, txt_freqs]))
    seq_lens = [e.shape[1] for e in entity_embs] + [prompt_emb.shape[1]]
    attention_mask = reference_mask(entity_masks, seq_lens, image.shape[1])
    for block in dit.transformer_blocks:
        text, image = reference_block(block, image, text, temb, rotary, attention_mask)
    output = dit.proj_out(dit.norm_out(image, temb))
    tokens = output.reshape(1, height // 2, width // 2, 16, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return tokens.reshape(1, 16, height, width)


def entity_state(pipe, boxes, cfg_scale=1.0, on_negative=False):
    """The units' state for ``PROMPT`` with ``ENTITIES`` in ``boxes``."""
    shared = {"height": HEIGHT, "width": WIDTH, "seed": 0, "rand_device": "cpu", "cfg_scale": cfg_scale,
              "denoising_strength": 1.0, "max_sequence_length": 512, "eligen_entity_prompts": ENTITIES,
              "eligen_entity_masks": [mask(box) for box in boxes], "eligen_enable_on_negative": on_negative}
    pipe.scheduler.set_timesteps(2, image_seq_len=24)
    return shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}


def test_masked_forward_equals_the_reference_restatement(ours):
    boxes = [(0, 0, 16, 16), (24, 8, 48, 32)]
    shared, posi, nega = ours.run_units(*entity_state(ours, boxes))
    embeddings, masks = posi["entity_prompt_emb"], posi["entity_masks"]
    assert [e.shape[1] for e in embeddings] == [len(ours.encode_prompt(t, None)[0][0]) for t in ENTITIES]
    assert masks.shape == (1, 2, 4, 6) and masks[0, 0].sum() == 4 and masks[0, 1].sum() == 9
    latents, timestep = torch.randn(1, 16, 4, 6, generator=torch.Generator().manual_seed(0)), torch.tensor([700.0])
    ours_out = ours.model_fn(latents, timestep, posi["prompt_emb"], entity_prompt_emb=embeddings, entity_masks=masks)
    with torch.no_grad():
        expected = reference_forward(ours.dit, latents, timestep, posi["prompt_emb"], embeddings,
                                     masks.unsqueeze(2).float())
    assert (ours_out - expected).abs().max() < 1e-5
    # teeth: moving the first entity's mask moves the prediction far beyond the tolerance
    moved = entity_state(ours, [(32, 0, 48, 16), boxes[1]])[0]["eligen_entity_masks"]
    unit = next(unit for unit in ours.units if isinstance(unit, EntityPromptUnit))
    other = unit.process(ours, ENTITIES, moved, False, HEIGHT, WIDTH, PROMPT, posi["prompt_emb"])
    shifted = ours.model_fn(latents, timestep, posi["prompt_emb"], entity_prompt_emb=embeddings,
                            entity_masks=other["entity_masks"])
    assert (shifted - ours_out).abs().max() > 1e-3
    # without entities the transformer, now holding the entity processor, computes exactly as diffusers' own
    assert isinstance(ours.dit.transformer_blocks[0].attn.processor, EntityAttnProcessor)
    wrapped = ours.model_fn(latents, timestep, posi["prompt_emb"])
    for block in ours.dit.transformer_blocks:
        block.attn.set_processor(block.attn.processor.plain)
    assert torch.equal(wrapped, ours.model_fn(latents, timestep, posi["prompt_emb"]))


def test_calls_with_and_without_entities(ours):
    size = dict(height=HEIGHT, width=WIDTH, num_inference_steps=2, seed=0, output_type="pt", progress_bar=False)
    plain = ours(PROMPT, cfg_scale=1, **size)
    assert torch.equal(plain, ours(PROMPT, cfg_scale=1, eligen_entity_prompts=[], eligen_entity_masks=[], **size))
    entities = dict(eligen_entity_prompts=ENTITIES, eligen_entity_masks=[mask((0, 0, 16, 16)), mask((24, 8, 48, 32))])
    regional = ours(PROMPT, cfg_scale=1, **entities, **size)
    assert regional.shape == plain.shape and (regional - plain).abs().max() > 1e-4
    negative = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=2, eligen_enable_on_negative=True, **entities, **size)
    assert (negative - ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=2, **entities, **size)).abs().max() > 1e-5
    with pytest.raises(ValueError, match="2 eligen_entity_prompts and 1 eligen_entity_masks"):
        ours(PROMPT, eligen_entity_prompts=ENTITIES, eligen_entity_masks=[mask((0, 0, 8, 8))], **size)


def test_units_declare_what_they_do_with_entities_on_the_negative_branch(ours):
    from tests.pipelines.declarations import check_declarations

    shared, posi, nega = entity_state(ours, [(0, 0, 16, 16), (24, 8, 48, 32)], cfg_scale=2.0, on_negative=True)
    assert check_declarations(ours, {**shared, "input_image": Image.new("RGB", (WIDTH, HEIGHT))}, posi, nega) == {}
    shared, posi, nega = ours.run_units(shared, posi, nega)
    assert all(e is nega["prompt_emb"] for e in nega["entity_prompt_emb"])
    assert torch.equal(nega["entity_masks"], posi["entity_masks"])


def test_single_values_are_lists_of_one_and_bad_ones_are_refused():
    assert entity_lists("a hat", mask((0, 0, 8, 8)))[0] == ["a hat"]
    with pytest.raises(ValueError, match="non-empty prompts"):
        entity_lists(["a hat", ""], [mask((0, 0, 8, 8))] * 2)
    with pytest.raises(ValueError, match="PIL images"):
        entity_lists(["a hat"], ["mask.png"])


def test_dataset_rows_load_their_masks_and_a_count_mismatch_names_the_row(tmp_path):
    import json

    from diffsynth.core.data.dataset import UnifiedDataset
    from diffsynth.core.data.errors import DatasetError
    from diffsynth.core.data.example_eligen_dataset import build_example_eligen_dataset

    metadata = build_example_eligen_dataset(tmp_path, num_samples=2)
    options = dict(data_file_keys=("image", "eligen_entity_masks"), max_pixels=48 * 32,
                   required_columns=("image", "prompt", "eligen_entity_prompts", "eligen_entity_masks"),
                   paired_lists=[("eligen_entity_prompts", "eligen_entity_masks")])
    sample = UnifiedDataset(tmp_path, metadata, **options)[0]
    assert [m.size for m in sample["eligen_entity_masks"]] == [sample["image"].size] * 2 == [(48, 32)] * 2
    assert len(sample["eligen_entity_prompts"]) == 2
    rows = json.loads(metadata.read_text())
    rows[1]["eligen_entity_prompts"] = rows[1]["eligen_entity_prompts"][:1]
    metadata.write_text(json.dumps(rows))
    with pytest.raises(DatasetError, match="row 2 holds 1 entries in column 'eligen_entity_prompts' and 2 in"):
        UnifiedDataset(tmp_path, metadata, **options)


def test_prompt_file_entries_give_entity_inputs_to_samples(tmp_path):
    import json

    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
    from diffsynth.training.config.validation_prompts import ValidationConfig, ValidationError, read_validation_prompts
    from diffsynth.training.loop.sampling import unknown_input_problems

    mask((0, 0, 16, 16)).save(tmp_path / "hat.png")
    entry = {"prompt": PROMPT, "eligen_entity_prompts": ["a hat"], "eligen_entity_masks": ["hat.png"]}
    (tmp_path / "prompts.json").write_text(json.dumps([entry]))
    [prompt] = read_validation_prompts(tmp_path / "prompts.json")
    config = ValidationConfig((prompt,), every_steps=1, every_epochs=None, max_pixels=48 * 32)
    arguments = config.call_arguments(prompt, 16)
    assert arguments["eligen_entity_prompts"] == ["a hat"] and arguments["eligen_entity_masks"][0].size == (48, 32)
    pipe = QwenImagePipeline(torch_dtype=torch.float32)
    assert unknown_input_problems(pipe, prompt.inputs()) == []
    assert unknown_input_problems(pipe, {"control_video"}) == [
        '"control_video" is not an input of QwenImagePipeline; drop it']
    (tmp_path / "prompts.json").write_text(json.dumps([{**entry, "eligen_entity_prompts": ["a hat", "a cat"]}]))
    with pytest.raises(ValidationError, match='gives 2 "eligen_entity_prompts" and 1 "eligen_entity_masks"'):
        read_validation_prompts(tmp_path / "prompts.json")
