"""Full checkpoints of a model trained in full: the diffusers folder that diffusers' ``from_pretrained`` and this
package's loader read, the original single-file layouts (FLUX.1, Wan) that ComfyUI reads, written block by block
and atomically."""

import contextlib
import copy
import json

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors import safe_open

from diffsynth.core.finite import NonFiniteTensorError
from diffsynth.core.loader.loading import load_model_from_files
from diffsynth.pipelines.flux.original import transformer_to_original
from diffsynth.testing.tiny_flux import TRANSFORMER_CONFIG
from diffsynth.testing.tiny_wan import tiny_wan_transformer
from diffsynth.training.config.errors import FlagError
from diffsynth.training.outputs import full_model
from diffsynth.training.outputs.full_model import FullCheckpointError, write_full_model
from diffsynth.training.outputs.logger import ModelLogger


def perturbed(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """``model`` with every weight moved off its initial value, like a trained one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.01)
    return model


def assert_same_tensors(loaded: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    state = loaded.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[key], expected[key]) for key in expected)


@pytest.fixture(scope="module")
def qwen_dit(tiny_root):
    from diffusers import QwenImageTransformer2DModel

    return perturbed(QwenImageTransformer2DModel.from_pretrained(tiny_root / "Qwen" / "Qwen-Image" / "transformer"))


@pytest.fixture(scope="module")
def flux_dit():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return perturbed(FluxTransformer2DModel(**TRANSFORMER_CONFIG))


def test_the_diffusers_folder_loads_in_from_pretrained_and_in_our_loader_as_the_trained_model(qwen_dit, tmp_path):
    from diffusers import QwenImageTransformer2DModel

    [folder] = write_full_model(qwen_dit, tmp_path, "epoch-0", "dit", ["diffusers"], max_shard_size=200_000,
                                metadata={"epoch": "0"})
    assert folder == tmp_path / "epoch-0.dit"
    index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"diffusion_pytorch_model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*shards, "config.json", "diffusion_pytorch_model.safetensors.index.json"])
    with safe_open(str(folder / shards[0]), "pt") as shard:
        assert shard.metadata()["epoch"] == "0"
    expected = qwen_dit.state_dict()
    assert_same_tensors(QwenImageTransformer2DModel.from_pretrained(folder), expected)
    assert_same_tensors(load_model_from_files([folder], torch_dtype=torch.float32), expected)
    [small] = write_full_model(qwen_dit, tmp_path, "step-3", "dit", ["diffusers"], dtype=torch.bfloat16)
    assert sorted(p.name for p in small.iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    loaded = QwenImageTransformer2DModel.from_pretrained(small, torch_dtype=torch.bfloat16)
    assert_same_tensors(loaded, {key: value.bfloat16() for key, value in expected.items()})


def test_a_transformers_model_is_written_under_its_librarys_names(tmp_path):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    encoder = T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                                      decoder_start_token_id=0))
    [folder] = write_full_model(encoder, tmp_path, "epoch-0", "text_encoder", ["diffusers"], max_shard_size=8_000)
    assert (folder / "model.safetensors.index.json").is_file()
    assert_same_tensors(T5EncoderModel.from_pretrained(folder), encoder.state_dict())


def test_the_flux1_original_file_is_bfls_layout_that_comfyui_detects_and_our_loader_reads(flux_dit, tmp_path):
    [file] = write_full_model(flux_dit, tmp_path, "epoch-0", "dit", ["original"])
    assert file == tmp_path / "epoch-0.dit.original.safetensors"
    with safe_open(str(file), "pt") as handle:
        written = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open is no dict)
    # Block by block, the file holds what converting the whole state dict at once gives.
    expected = transformer_to_original(flux_dit.state_dict())
    assert written.keys() == expected.keys() and all(torch.equal(written[k], expected[k]) for k in expected)
    # The keys comfy/model_detection.py detects a FLUX.1 file by, and the block counts it reads.
    assert {"double_blocks.0.img_attn.norm.key_norm.scale", "img_in.weight", "guidance_in.in_layer.weight"} <= set(
        written) and not any(key.startswith(("transformer_blocks.", "x_embedder.")) for key in written)
    assert 1 + max(int(k.split(".")[1]) for k in written if k.startswith("double_blocks.")) == 2
    assert_same_tensors(load_model_from_files([file], torch_dtype=torch.float32), flux_dit.state_dict())


def test_the_wan_original_folder_is_the_release_layout_that_comfyui_detects_and_our_loader_reads(tmp_path):
    wan = perturbed(tiny_wan_transformer(0))
    [folder] = write_full_model(wan, tmp_path, "step-2", "dit", ["original"])
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    assert json.loads((folder / "config.json").read_text())["_class_name"] == "WanModel"
    with safe_open(str(folder / "diffusion_pytorch_model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert {"head.modulation", "head.head.weight", "blocks.0.ffn.0.weight", "patch_embedding.weight"} <= keys
    assert_same_tensors(load_model_from_files([folder], torch_dtype=torch.float32), wan.state_dict())


def test_original_is_refused_for_a_family_released_as_a_diffusers_folder_before_training(qwen_dit, tmp_path):
    logger = ModelLogger(tmp_path, full_checkpoint_formats=("flat", "original"))
    with pytest.raises(FlagError, match="--full_checkpoint_format original: dit is a QwenImageTransformer2DModel, "
                                        "whose original release is its diffusers folder"):
        logger.attach_full_models({"dit": qwen_dit})
    with pytest.raises(FlagError, match="this run trains none; add --trainable_models dit"):
        ModelLogger(tmp_path, full_checkpoint_formats=("diffusers",)).attach_full_models({})
    with pytest.raises(FullCheckpointError, match="original release is its diffusers folder"):
        write_full_model(qwen_dit, tmp_path, "epoch-0", "dit", ["original"])
    with_lora = copy.deepcopy(qwen_dit)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["to_q"]), with_lora)
    with pytest.raises(FlagError, match="dit is trained in full and carries a LoRA"):
        ModelLogger(tmp_path, full_checkpoint_formats=("diffusers",)).attach_full_models({"dit": with_lora})
    assert list(tmp_path.iterdir()) == []


def test_a_failure_part_way_leaves_no_folder_and_keeps_the_complete_one_of_that_name(qwen_dit, tmp_path):
    [folder] = write_full_model(qwen_dit, tmp_path, "epoch-0", "dit", ["diffusers"], max_shard_size=200_000)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    last = list(qwen_dit.state_dict())[-1]  # in the last block: earlier shards are already on disk when it fails
    with pytest.raises(NonFiniteTensorError):
        write_full_model(qwen_dit, tmp_path, "epoch-0", "dit", ["diffusers"],
                         weights={last: torch.full_like(qwen_dit.state_dict()[last], float("nan"))},
                         max_shard_size=200_000)
    with pytest.raises(NonFiniteTensorError):
        write_full_model(qwen_dit, tmp_path, "epoch-1", "dit", ["diffusers"],
                         weights={last: torch.full_like(qwen_dit.state_dict()[last], float("nan"))})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0.dit"]  # no staging folder, no epoch-1.dit
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_the_model_is_gathered_one_block_at_a_time(qwen_dit, tmp_path, monkeypatch):
    """What bounds memory under ZeRO-3: each gather covers one block, never the model."""
    gathered = []

    def recording(params):
        gathered.append(sum(param.numel() for param in params))
        return contextlib.nullcontext()

    monkeypatch.setattr(full_model, "gathered_parameters", recording)
    for param in qwen_dit.parameters():  # what a ZeRO-3 partition carries
        monkeypatch.setattr(param, "ds_id", 0, raising=False)
    write_full_model(qwen_dit, tmp_path, "epoch-0", "dit", ["diffusers"])
    block = sum(param.numel() for param in qwen_dit.transformer_blocks[0].parameters())
    whole = sum(param.numel() for param in qwen_dit.parameters())
    assert len(gathered) == len(qwen_dit.transformer_blocks) + 1 and sum(gathered) == whole
    assert max(gathered) < whole / 2 and block in gathered


def test_a_mixed_run_keeps_its_flat_file_beside_the_folder_of_the_model_trained_in_full(qwen_dit, tmp_path):
    """A LoRA on one model plus another trained in full: only the flat file holds the LoRA, so it is written too."""
    logger = ModelLogger(tmp_path, full_checkpoint_formats=("diffusers",))
    logger.attach_full_models({"dit2": qwen_dit})
    lora = {"pipe.dit.transformer_blocks.0.attn.to_q.lora_A.default.weight": torch.ones(4, 16)}
    state = {**lora, **{f"pipe.dit2.{key}": value for key, value in qwen_dit.state_dict().items()}}
    assert logger.save_checkpoint(state, "epoch-0") == tmp_path / "epoch-0.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0.dit2", "epoch-0.safetensors"]
    assert_same_tensors(load_model_from_files([tmp_path / "epoch-0.dit2"], torch_dtype=torch.float32),
                        qwen_dit.state_dict())
    only_full = ModelLogger(tmp_path / "full", full_checkpoint_formats=("diffusers",))
    only_full.attach_full_models({"dit2": qwen_dit})
    assert only_full.save_checkpoint({k: v for k, v in state.items() if k not in lora}, "epoch-0") == \
        tmp_path / "full" / "epoch-0.dit2"
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["epoch-0.dit2"]


def test_an_unknown_format_is_refused_with_the_choices():
    from diffsynth.training.config.output import OutputSection

    assert OutputSection(full_checkpoint_format="flat, diffusers").full_checkpoint_formats == ("flat", "diffusers")
    with pytest.raises(FlagError, match=r"--full_checkpoint_format 'flat,gguf': expected a comma list of flat, "
                                        r"diffusers, original \(e.g. flat,diffusers\); 'gguf' is not one"):
        OutputSection(full_checkpoint_format="flat,gguf")
