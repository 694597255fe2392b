"""The tool emulations of ``inspect``, checked against what the tools were measured to do, and the CLI.

The measurements (issue 15, on this project's first file format, rank 8): diffusers loaded every file, at strength
1.0 except after the old ``convert_wan_lora.py`` (0.5); ComfyUI took the Qwen-Image file at 2.0 (alpha 4 ignored), none
of the Wan file's 40 keys, and the converted Wan file at 0.5; DiffSynth-Studio fused nothing of either file and the
converted one at 0.5. Later measured with the tools' real code on today's files: musubi-tuner's Wan and Qwen-Image
loaders read none of a ``diffusion_model.`` file and all of its kohya conversion; DiffSynth-Studio none of a kohya
file.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffsynth.testing.tiny_flux2 import FLUX2_KLEIN_4B_MODEL_ID
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_I2V_MODEL_ID, WAN_MODEL_ID
from diffsynth.lora import from_peft_state_dict, inspect_lora, to_state_dict
from diffsynth.pipelines.wan_video.naming import NAMING as WAN_NAMING
from diffsynth.lora.__main__ import main as lora_cli
from diffsynth.training.outputs.logger import ModelLogger
from tests.lora.conftest import random_lora_model

RANK = 8


def lora_model(cls, folder, targets, seed=0):
    base = cls.from_pretrained(folder).eval()
    return base, random_lora_model(base, targets, RANK, RANK, seed)


@pytest.fixture(scope="module")
def models(tiny_root):
    from diffusers import QwenImageTransformer2DModel, WanTransformer3DModel

    return {
        "qwen": lora_model(QwenImageTransformer2DModel, tiny_root / QWEN_IMAGE_MODEL_ID / "transformer",
                           ["to_q", "to_k", "to_v", "to_out.0", "img_mlp.net.2"]),
        "wan": lora_model(WanTransformer3DModel, tiny_root / WAN_MODEL_ID / "transformer",
                          ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]),
    }


def first_format_file(path, model, alpha, converted=False):
    """A LoRA as this project wrote it before (``transformer.`` keys, alpha in metadata), or as the old Wan converter
    rewrote it (original names, the peft JSON dropped)."""
    # Its factors as trained (the scale alpha / rank unfolded), peft's LoraConfig under the transformer's name.
    tensors = {"transformer." + key.replace(".default.", "."): value for key, value in model.named_parameters()
               if ".lora_" in key}
    modules = sorted({key.split(".", 1)[1].rsplit(".lora_", 1)[0] for key in tensors})
    config = {"transformer.r": RANK, "transformer.lora_alpha": alpha, "transformer.target_modules": modules}
    metadata = {"format": "pt", "lora_rank": str(RANK), "lora_alpha": str(alpha),
                "lora_adapter_metadata": json.dumps(config, sort_keys=True)}
    if converted:
        tensors = {key.replace("transformer.", "diffusion_model.", 1): value for key, value in tensors.items()}
        tensors = {_original(key): value for key, value in tensors.items()}
        del metadata["lora_adapter_metadata"]
    tensors = {key: value.detach().contiguous() for key, value in tensors.items()}
    save_file(tensors, str(path), metadata={k: v for k, v in metadata.items() if not k.startswith("diffsynth.")})
    return path


def _original(key):
    head, module, tail = key.split(".", 1)[0], key.split(".", 1)[1].rsplit(".lora_", 1)[0], key.rsplit(".lora_", 1)[1]
    return f"{head}.{WAN_NAMING.to_native(module)}.lora_{tail}"


def strengths(inspection):
    return {result.tool: (result.mapped, result.total, None if result.strength is None else round(result.strength, 3))
            for result in inspection.results}


def test_the_emulations_reproduce_what_the_tools_did_with_the_first_file_format(models, tmp_path):
    qwen_base, qwen = models["qwen"]
    found = strengths(inspect_lora(first_format_file(tmp_path / "qwen.safetensors", qwen, 4), qwen_base))
    assert found["diffusers"] == (10, 10, 1.0)
    assert found["ComfyUI"] == (10, 10, 2.0)
    assert found["DiffSynth-Studio"][0] == 0
    wan_base, wan = models["wan"]
    found = strengths(inspect_lora(first_format_file(tmp_path / "wan.safetensors", wan, 16), wan_base))
    assert found["diffusers"] == (20, 20, 1.0)
    assert found["ComfyUI"][0] == 0 and found["DiffSynth-Studio"][0] == 0
    converted = first_format_file(tmp_path / "wan_converted.safetensors", wan, 16, converted=True)
    found = strengths(inspect_lora(converted, wan_base))
    assert found["diffusers"] == found["ComfyUI"] == found["DiffSynth-Studio"] == (20, 20, 0.5)
    assert found["diffsynth"] == (20, 20, 1.0)  # this project reads the plain lora_alpha entry
    assert found["musubi-tuner"][0] == 0


def test_musubi_tuner_and_diffsynth_studio_read_complementary_layouts(models, tmp_path):
    wan_base, wan = models["wan"]
    weights = from_peft_state_dict({k: v for k, v in wan.named_parameters() if ".lora_" in k}, 16)
    for layout, readers, blind in (("universal", ("ComfyUI", "DiffSynth-Studio"), "musubi-tuner"),
                                   ("kohya", ("ComfyUI", "musubi-tuner"), "DiffSynth-Studio")):
        tensors, metadata = to_state_dict(weights, layout, WAN_NAMING)
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp_path / f"{layout}.safetensors"),
                  metadata=metadata)
        found = strengths(inspect_lora(tmp_path / f"{layout}.safetensors", wan_base))
        assert all(found[tool] == (20, 20, 1.0) for tool in readers), found
        assert found[blind][0] == 0


def test_the_diffusers_emulation_agrees_with_diffusers_itself(models, tiny_root, tmp_path):
    from diffusers import QwenImagePipeline

    qwen_base, qwen = models["qwen"]
    path = first_format_file(tmp_path / "kohya_like.safetensors", qwen, 4, converted=False)
    # A kohya file with per-layer alphas that differ from the rank: diffusers folds them in its converter.
    weights = from_peft_state_dict({k: v for k, v in qwen.named_parameters() if ".lora_" in k}, 3.0)
    tensors, _ = to_state_dict(weights, "kohya")
    save_file(tensors, str(tmp_path / "kohya.safetensors"))
    for file in (path, tmp_path / "kohya.safetensors"):
        emulated = inspect_lora(file, qwen_base).result("diffusers")
        pipe = QwenImagePipeline.from_pretrained(str(tiny_root / QWEN_IMAGE_MODEL_ID), dtype=torch.float32)
        pipe.load_lora_weights(str(file), adapter_name="x")
        layers = [module for module in pipe.transformer.modules() if hasattr(module, "scaling")]
        assert len(layers) == emulated.mapped == 10
        reference = inspect_lora(file, qwen_base).weights.layers
        ratios = []
        for name, module in pipe.transformer.named_modules():
            if hasattr(module, "scaling"):
                real = (module.scaling["x"] * module.lora_B["x"].weight @ module.lora_A["x"].weight).detach()
                want = reference[name].delta()
                ratios.append(float((real * want).sum() / (want * want).sum()))
        assert ratios == pytest.approx([emulated.strength] * len(ratios), abs=1e-4)


def test_a_layer_diffusers_cannot_take_gets_a_diffusers_twin(tiny_root, tmp_path):
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

    folder = tiny_root / WAN_I2V_MODEL_ID / "transformer"
    # diffusers' Wan converter takes the image key projection only together with the value one: k_img alone fails.
    base, model = lora_model(WanTransformer3DModel, folder, ["add_k_proj", "to_q"])
    state = {"pipe.dit." + k: v for k, v in model.named_parameters() if ".lora_" in k}
    config = {k: v for k, v in dict(base.config).items() if not k.startswith("_")}
    logger = ModelLogger(tmp_path, lora_metadata={"lora_rank": RANK, "lora_alpha": 4, "base_model_class":
                                                  "WanTransformer3DModel", "base_model_config": config})
    main = logger.save_lora(state, "epoch-0")
    twin = tmp_path / "epoch-0.diffusers.safetensors"
    assert twin.is_file()
    found = strengths(inspect_lora(main))
    assert found["diffusers"][0] == 0 and found["ComfyUI"] == found["DiffSynth-Studio"] == (6, 6, 1.0)
    assert strengths(inspect_lora(twin))["diffusers"] == (6, 6, 1.0)
    logger.save_lora(state, "epoch-1")  # later saves write the twin too
    assert (tmp_path / "epoch-1.diffusers.safetensors").is_file()
    pipe = WanImageToVideoPipeline.from_pretrained(str(tiny_root / WAN_I2V_MODEL_ID), dtype=torch.float32)
    pipe.load_lora_weights(str(twin))
    assert len([m for m in pipe.transformer.modules() if hasattr(m, "scaling")]) == 6


def test_comfyui_reads_flux2_layers_bare_or_under_transformer_but_not_under_diffusion_model(tiny_root, tmp_path):
    """ComfyUI's Flux key map (comfy/lora.py, comfy/utils.flux_to_diffusers) has FLUX.2's diffusers names bare and
    under ``transformer.``; its shared modulation layers are in no map. The trainer's files name them bare."""
    from diffusers import Flux2Transformer2DModel

    targets = ["to_q", "add_k_proj", "to_out.0", "linear_in", "to_qkv_mlp_proj", "double_stream_modulation_img.linear"]
    base, model = lora_model(Flux2Transformer2DModel, tiny_root / FLUX2_KLEIN_4B_MODEL_ID / "transformer", targets)
    config = {k: v for k, v in dict(base.config).items() if not k.startswith("_")}
    state = {"pipe.dit." + k: v for k, v in model.named_parameters() if ".lora_" in k}
    logger = ModelLogger(tmp_path, lora_metadata={"lora_rank": RANK, "lora_alpha": RANK, "base_model_class":
                                                  "Flux2Transformer2DModel", "base_model_config": config})
    with pytest.raises(Exception, match="would not load fully .* ComfyUI"):
        logger.save_lora(state, "with-modulation")  # the modulation layer: refused, the file kept for inspection
    total = len({k.rsplit(".lora_", 1)[0] for k in state}) - 1
    bare = tmp_path / "with-modulation.safetensors"
    found = strengths(inspect_lora(bare, base))
    assert found["ComfyUI"] == (total, total + 1, 1.0) and found["DiffSynth-Studio"] == (total + 1, total + 1, 1.0)
    tensors = load_file(str(bare))
    prefixed = {"diffusion_model." + key: value for key, value in tensors.items()}
    save_file(prefixed, str(tmp_path / "prefixed.safetensors"), metadata=safe_metadata(bare))
    assert strengths(inspect_lora(tmp_path / "prefixed.safetensors", base))["ComfyUI"][0] == 0


def safe_metadata(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return handle.metadata()


def test_inspect_command(models, tiny_root, tmp_path, capsys):
    wan_base, wan = models["wan"]
    state = {"pipe.dit." + k: v for k, v in wan.named_parameters() if ".lora_" in k}
    config = {k: v for k, v in dict(wan_base.config).items() if not k.startswith("_")}
    ModelLogger(tmp_path, lora_metadata={"lora_rank": RANK, "lora_alpha": 16, "base_model_class":
                                         "WanTransformer3DModel", "base_model_config": config}).save_lora(state, "ok")
    assert lora_cli(["inspect", str(tmp_path / "ok.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "layout    universal" in out and "alpha/rank = 2, alpha 16" in out
    assert "ComfyUI           20/20           1" in out
    assert lora_cli(["inspect", str(tmp_path / "ok.safetensors"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trained_alpha"] == "16"
    old = first_format_file(tmp_path / "old.safetensors", wan, 16)
    assert lora_cli(["inspect", str(old)]) == 2  # records no model
    assert "pass --model" in capsys.readouterr().err
    assert lora_cli(["inspect", str(old), "--model", str(tiny_root / WAN_MODEL_ID)]) == 1
    assert "not loaded fully at the trained strength by: ComfyUI, DiffSynth-Studio" in capsys.readouterr().out
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 16)
    assert lora_cli(["inspect", str(broken)]) == 2
    assert "not a readable safetensors file" in capsys.readouterr().err
