"""DiffusionTrainingModule on the tiny Qwen-Image: what trains, which units run per stage, LoRA set-up errors."""

import pytest
import torch
from PIL import Image

from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.pipelines.qwen_image.pipeline import ModelConfig, QwenImagePipeline
from diffsynth.training.objective.training_module import DiffusionTrainingModule

TARGETS = ["to_q", "to_k", "img_mlp.net.2"]
SAMPLE = {"image": Image.new("RGB", (32, 48), "blue"), "prompt": "a blue field"}


def load(*names, skeletons=()):
    configs = [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[n]) for n in names]
    skeleton_configs = [c for c, n in zip(configs, names) if n in skeletons]
    return QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs, skeleton_configs=skeleton_configs)


@pytest.fixture
def pipe(base):
    return load("dit", "text_encoder", "vae")


def unit_names(units):
    return [type(unit).__name__ for unit in units]


def test_only_the_lora_trains_and_its_weights_are_float32(pipe):
    module = DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=TARGETS, lora_rank=4)
    trainable = module.trainable_state_dict()
    assert len(trainable) == 2 * 3 * 2  # A and B, three targets, two blocks
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable)
    assert all(n.startswith("pipe.dit.transformer_blocks.") and t.dtype == torch.float32 for n, t in trainable.items())
    assert not any(p.requires_grad for p in pipe.text_encoder.parameters())
    config = dict(module.lora_config)
    assert config.pop("base_model_class") == "QwenImageTransformer2DModel"
    assert config.pop("base_model_config") == {k: v for k, v in pipe.dit.config.items() if not k.startswith("_")}
    layers = config.pop("base_model_layers")  # every LoRA-able layer of the base, the targeted ones among them
    assert layers.model_class == "QwenImageTransformer2DModel"
    to_q = pipe.dit.transformer_blocks[1].attn.to_q.base_layer
    assert layers.shapes["transformer_blocks.1.attn.to_q"] == tuple(to_q.weight.shape)
    assert layers.shapes["proj_out"] == tuple(pipe.dit.proj_out.weight.shape)
    assert config == {"lora_rank": 4, "lora_alpha": 4, "lora_target_modules": TARGETS, "lora_base_model": "dit"}


def test_a_lora_on_the_transformers_text_encoder_records_its_config(pipe):
    module = DiffusionTrainingModule(pipe, lora_base_model="text_encoder", lora_target_modules=["q_proj"])
    config = module.lora_config
    assert config["base_model_class"] == "Qwen2_5_VLForConditionalGeneration"
    assert config["base_model_config"]["text_config"]["hidden_size"] == pipe.text_encoder.config.text_config.hidden_size
    assert not any(key.startswith("_") for key in config["base_model_config"])

def test_stages_run_complementary_units(pipe):
    full = DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=TARGETS)
    stage_one = DiffusionTrainingModule(pipe, task="sft:data_process", lora_base_model="dit")
    # Nothing before the loss uses the dit: one-stage runs every unit without a graph, stage 2 runs none.
    assert unit_names(full.unrelated_units) == unit_names(pipe.units) and full.related_units == []
    assert unit_names(stage_one.unrelated_units) == [*unit_names(pipe.units), "PruneCacheUnit"]
    assert stage_one.active_model_names() == ["vae", "text_encoder"]
    assert full.active_model_names() == ["vae", "text_encoder", "dit"]
    cached = stage_one.process_sample(SAMPLE)
    assert {scope: sorted(values) for scope, values in cached.items()} == {
        "shared": ["blockwise_controlnet_conditioning", "context_latents", "edit_latents", "input_latents",
                   "layer_input_latents"],
        "posi": ["entity_masks", "entity_prompt_emb", "prompt_emb", "prompt_emb_mask"], "nega": []}
    assert cached["shared"]["input_latents"].shape == (1, 16, 6, 4)
    # a text-to-image sample has no reference images, nor an image to decompose into layers, nor EliGen entities
    assert cached["shared"]["edit_latents"] is None and cached["shared"]["layer_input_latents"] is None
    assert cached["posi"]["entity_prompt_emb"] is None


def test_a_cached_state_gives_the_one_stage_loss(pipe):
    stage_one = DiffusionTrainingModule(load("text_encoder", "vae"), task="sft:data_process",
                                        lora_base_model="dit")
    cached = stage_one.process_sample(SAMPLE)
    full = DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=TARGETS)
    stage_two = DiffusionTrainingModule(load("dit"), task="sft:train", lora_base_model="dit",
                                        lora_target_modules=TARGETS)
    stage_two.load_trainable_state_dict(full.trainable_state_dict())
    loss = full([SAMPLE], [torch.Generator().manual_seed(5)])
    assert torch.equal(stage_two([cached], [torch.Generator().manual_seed(5)]), loss)
    assert not torch.equal(full([SAMPLE], [torch.Generator().manual_seed(6)]), loss)


def test_lora_set_up_errors_name_the_flag(pipe):
    with pytest.raises(ValueError, match=r"--lora_target_modules entries \['q', 'ffn.0'\] match no module of dit"):
        DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=["to_q", "q", "ffn.0"])
    with pytest.raises(ValueError, match="--lora_base_model names 'image_encoder'.*holds"):
        DiffusionTrainingModule(pipe, lora_base_model="image_encoder", lora_target_modules=TARGETS)
    with pytest.raises(ValueError, match="nothing to train"):
        DiffusionTrainingModule(pipe)
    with pytest.raises(ValueError, match="unknown|not a known task"):
        DiffusionTrainingModule(pipe, task="sft:everything")


def test_a_skeleton_the_stage_computes_with_is_refused(base):
    pipe = load("dit", "text_encoder", "vae", skeletons=("dit",))
    assert all(p.is_meta for p in pipe.dit.parameters())
    DiffusionTrainingModule(pipe, task="sft:data_process", lora_base_model="dit")  # stage 1 never runs the dit
    with pytest.raises(ValueError, match="--offload_models includes the dit model, but --task sft computes with it"):
        DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=TARGETS)


def lora_deltas(module):
    """Each LoRA layer's update ``scaling * B @ A`` as peft applies it, by module name."""
    return {name: layer.scaling["default"] * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
            for name, layer in module.pipe.dit.named_modules() if hasattr(layer, "scaling")}


def test_a_lora_checkpoint_continues_training(pipe, tmp_path):
    from diffsynth.training.outputs.logger import ModelLogger

    first = DiffusionTrainingModule(pipe, lora_base_model="dit", lora_target_modules=TARGETS, lora_rank=4,
                                    lora_alpha=2)
    with torch.no_grad():
        for param in first.parameters():
            if param.requires_grad:
                param.normal_()
    state = first.trainable_state_dict()
    path = ModelLogger(tmp_path, lora_metadata=first.lora_config).save_lora(state, "lora")
    # The file holds the scale folded into lora_B; reading it back must not apply the scale a second time, whatever
    # alpha the continuing run uses.
    for alpha in (2, 8):
        second = DiffusionTrainingModule(load("dit"), lora_base_model="dit", lora_target_modules=TARGETS,
                                         lora_rank=4, lora_alpha=alpha, lora_checkpoint=path)
        want, got = lora_deltas(first), lora_deltas(second)
        assert want.keys() == got.keys() and len(want) == 2 * len(TARGETS)
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5)
    same = dict(DiffusionTrainingModule(load("dit"), lora_base_model="dit", lora_target_modules=TARGETS,
                                        lora_rank=4, lora_alpha=2, lora_checkpoint=path).trainable_state_dict())
    assert all(torch.allclose(state[name], value, atol=1e-6) for name, value in same.items())
    with pytest.raises(ValueError, match="has rank 4 but --lora_rank is 8; pass --lora_rank 4"):
        DiffusionTrainingModule(load("dit"), lora_base_model="dit", lora_target_modules=TARGETS, lora_rank=8,
                                lora_checkpoint=path)
    with pytest.raises(ValueError, match="other modules than this run trains.*made with --lora_target_modules"):
        DiffusionTrainingModule(load("dit"), lora_base_model="dit", lora_target_modules=["to_q"], lora_rank=4,
                                lora_checkpoint=path)
    pickle = tmp_path / "lora_pickle.safetensors"
    torch.save({"a": torch.zeros(1)}, pickle)
    with pytest.raises(ValueError, match=f"--lora_checkpoint {pickle}: .*not a readable safetensors file"):
        DiffusionTrainingModule(load("dit"), lora_base_model="dit", lora_target_modules=TARGETS, lora_rank=4,
                                lora_checkpoint=pickle)
    with pytest.raises(ValueError, match="differ from this run's"):
        second.load_trainable_state_dict({})


def test_the_stage_one_identity_names_its_models_and_sees_their_weights_and_dtype(base):
    from diffsynth.core.data.fingerprint import digest

    stage_one = DiffusionTrainingModule(load("text_encoder", "vae"), task="sft:data_process", lora_base_model="dit")
    identity = stage_one.stage_one_identity()
    # (plus the Edit processor, which is on disk among the tiny repos and taken as the default without a dit)
    assert {"text_encoder", "tokenizer", "vae"} <= set(identity["models"]) <= {"text_encoder", "tokenizer", "vae",
                                                                              "processor"}
    assert identity["torch_dtype"] == "torch.float32" and identity["pipeline"] == "QwenImagePipeline"
    assert "_name_or_path" not in identity["models"]["text_encoder"]["config"]  # the folder may move
    first = digest(identity)
    assert digest(DiffusionTrainingModule(load("text_encoder", "vae"), task="sft:data_process",
                                          lora_base_model="dit").stage_one_identity()) == first
    with torch.no_grad():
        next(stage_one.pipe.vae.parameters()).view(-1)[0] += 1.0
    assert digest(stage_one.stage_one_identity()) != first
