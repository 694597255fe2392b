"""Loading the tiny repos: bit-identical to the saved files and to the libraries' own loading, on the meta path."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.loader import (
    ModelConfig,
    ModelFilesNotFoundError,
    ModelLoadError,
    load_component,
    load_model,
    load_model_from_files,
    load_tokenizer,
    resolve,
)
from diffsynth.core.loader.loading import build_empty_model, find_model_class, read_config, resolve_dtype
from diffsynth.testing.tiny_models import QWEN_IMAGE_PATTERNS, WAN_PATTERNS

from .conftest import QWEN, WAN

DIT = QWEN_IMAGE_PATTERNS["dit"]
COMPONENTS = [
    pytest.param(model_id, component, patterns[name], id=f"{model_id.split('/')[0]}-{component}")
    for model_id, patterns in ((QWEN, QWEN_IMAGE_PATTERNS), (WAN, WAN_PATTERNS))
    for name, component in (("dit", "transformer"), ("text_encoder", "text_encoder"), ("vae", "vae"))
]


def files_state(folder: Path) -> dict[str, torch.Tensor]:
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(file))
    return state


def library_load(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The independent reference: the class's own from_pretrained."""
    _, cls = find_model_class(read_config(folder), folder / "config.json")
    return cls.from_pretrained(str(folder), dtype=dtype)


def assert_identical(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key, tensor in expected.items():
        assert actual[key].dtype == tensor.dtype, key
        assert torch.equal(actual[key], tensor), key


@pytest.mark.parametrize(("model_id", "component", "pattern"), COMPONENTS)
def test_loaded_model_resaves_to_the_same_tensors(base, tmp_path, model_id, component, pattern):
    model = load_model(ModelConfig(model_id=model_id, origin_file_pattern=pattern), torch.float32, "cpu")
    config = read_config(base / model_id / component)
    assert type(model).__name__ in (config.get("_class_name"), *config.get("architectures", []))
    model.save_pretrained(tmp_path / "resaved")
    assert_identical(files_state(tmp_path / "resaved"), files_state(base / model_id / component))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("model_id", "component", "pattern"), COMPONENTS)
def test_loaded_model_equals_from_pretrained(base, model_id, component, pattern, dtype):
    """Same parameters, buffers and tensor attributes, with the same dtypes (float32 modules included)."""
    model = load_model(ModelConfig(model_id=model_id, origin_file_pattern=pattern), dtype, "cpu")
    reference = library_load(base / model_id / component, dtype)
    assert_identical(dict(model.named_parameters()), dict(reference.named_parameters()))
    assert_identical(dict(model.named_buffers()), dict(reference.named_buffers()))
    for (name, module), (_, ref_module) in zip(model.named_modules(), reference.named_modules()):
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                assert_identical({f"{name}.{attr}": value}, {f"{name}.{attr}": getattr(ref_module, attr)})
    assert not model.training


def test_dtype_and_device_are_honoured_and_nothing_stays_on_meta(base):
    wan_dit = load_model(ModelConfig(model_id=WAN, origin_file_pattern=DIT), "bf16", torch.device("cpu"))
    tensors = dict(wan_dit.named_parameters()) | dict(wan_dit.named_buffers())
    assert all(t.device == torch.device("cpu") for t in tensors.values())
    kept = {name for name, p in wan_dit.named_parameters() if p.dtype == torch.float32}
    fp32_modules = {"scale_shift_table", "time_embedder", "norm1", "norm2", "norm3"}  # WanTransformer3DModel's
    assert kept and all(fp32_modules & set(name.split(".")) for name in kept)
    assert {p.dtype for name, p in wan_dit.named_parameters() if name not in kept} == {torch.bfloat16}


def test_the_model_is_built_on_meta_with_real_buffers(base):
    folder = base / QWEN / "text_encoder"
    library, cls = find_model_class(read_config(folder), folder / "config.json")
    empty = build_empty_model(library, cls, folder, torch.bfloat16)
    assert all(p.is_meta for p in empty.parameters())
    assert all(not b.is_meta for b in empty.buffers())
    assert torch.get_default_dtype() == torch.float32  # restored after building


def test_tied_embeddings_are_tied_after_loading(base):
    folder = base / WAN / "text_encoder"
    stored = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            stored |= set(handle.keys())
    assert "shared.weight" in stored and "encoder.embed_tokens.weight" not in stored
    encoder = load_model(ModelConfig(model_id=WAN, origin_file_pattern=WAN_PATTERNS["text_encoder"]), "bf16")
    assert encoder.encoder.embed_tokens.weight is encoder.shared.weight
    assert not encoder.shared.weight.is_meta


@pytest.mark.parametrize("bad", ["cuda:99", "tpu", "not-a-device"])
def test_a_bad_device_is_refused_before_loading(base, bad):
    with pytest.raises(ValueError, match="device="):
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern=DIT), torch.float32, bad)


@pytest.mark.parametrize("bad", [torch.int8, "int8", "double-ish"])
def test_a_bad_dtype_is_refused(bad):
    with pytest.raises(ValueError, match="torch_dtype"):
        resolve_dtype(bad)


def test_local_paths_load_shards_and_folders(base):
    folder = base / QWEN / "transformer"
    shards = sorted(str(p) for p in folder.glob("*.safetensors"))
    from_shards = load_model(ModelConfig(path=shards), torch.float32)
    from_folder = load_model(ModelConfig(path=str(folder)), torch.float32)
    assert_identical(from_shards.state_dict(), from_folder.state_dict())


def test_a_shard_list_missing_a_shard_names_it(base):
    shards = sorted(str(p) for p in (base / QWEN / "transformer").glob("*.safetensors"))
    with pytest.raises(ModelLoadError, match="00004-of-00004"):
        load_model(ModelConfig(path=shards[:3]), torch.float32)


def test_tokenizers_load_with_their_special_tokens(base):
    qwen = load_tokenizer(ModelConfig(model_id=QWEN, origin_file_pattern="tokenizer/"))
    ids = qwen("<|im_start|>user\nhi<|im_end|>").input_ids
    assert ids[0] == qwen.convert_tokens_to_ids("<|im_start|>") and ids[-1] == qwen.convert_tokens_to_ids("<|im_end|>")
    assert qwen.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    wan = load_component(ModelConfig(model_id=WAN, origin_file_pattern="tokenizer/"))
    assert wan("a red cat").input_ids[-1] == wan.eos_token_id and wan.pad_token_id == 0


def test_load_component_dispatches_on_the_files(base):
    model = load_component(ModelConfig(model_id=QWEN, origin_file_pattern=DIT), torch.float32)
    assert isinstance(model, torch.nn.Module)
    with pytest.raises(ModelLoadError, match="none of"):
        load_tokenizer(ModelConfig(model_id=QWEN, origin_file_pattern="scheduler/"))


# ---- errors -------------------------------------------------------------------------------------------------------


def shard(folder: Path, number: int) -> Path:
    return next(folder.glob(f"*-0000{number}-of-*.safetensors"))


@pytest.mark.parametrize("keep", [0.5, 0.001], ids=["truncated-data", "truncated-header"])
def test_a_corrupt_shard_is_named(scratch_base, keep):
    broken = shard(scratch_base(QWEN, "transformer"), 2)
    data = broken.read_bytes()
    broken.write_bytes(data[: max(4, int(len(data) * keep))])
    with pytest.raises(ModelLoadError, match="not a valid safetensors file") as info:
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern=DIT), torch.float32)
    assert str(broken) in str(info.value) and "re-download" in str(info.value)


@pytest.mark.parametrize(("component", "field"), [("transformer", "_class_name"), ("text_encoder", "architectures")])
def test_an_unknown_class_is_named(scratch_base, component, field):
    folder = scratch_base(QWEN, component)
    config = json.loads((folder / "config.json").read_text())
    config[field] = ["NoSuchModel"] if field == "architectures" else "NoSuchModel"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="'NoSuchModel'") as info:
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern=f"{component}/*.safetensors"), torch.float32)
    assert str(folder / "config.json") in str(info.value)


def test_a_config_without_a_class_is_refused(scratch_base):
    folder = scratch_base(QWEN, "vae")
    config = json.loads((folder / "config.json").read_text())
    del config["_class_name"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="names no class"):
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern="vae/*.safetensors"), torch.float32)


def rewrite_shard(path: Path, edit) -> None:
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_keys_are_named(scratch_base):
    folder = scratch_base(QWEN, "transformer")
    removed = []
    rewrite_shard(shard(folder, 1), lambda t: removed.append(next(iter(t))) or t.pop(removed[0]))
    with pytest.raises(ModelLoadError, match="1 weight\\(s\\) missing") as info:
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern=DIT), torch.float32)
    assert repr(removed[0]) in str(info.value)


def test_unexpected_keys_are_named(scratch_base):
    folder = scratch_base(QWEN, "transformer")
    rewrite_shard(shard(folder, 3), lambda t: t.update({"stray.weight": torch.zeros(2)}))
    with pytest.raises(ModelLoadError, match="1 checkpoint key\\(s\\) are not in the model: 'stray.weight'") as info:
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern=DIT), torch.float32)
    assert shard(folder, 3).name in str(info.value)


def test_a_shape_mismatch_names_the_key_and_both_shapes(scratch_base):
    folder = scratch_base(QWEN, "transformer")
    config = json.loads((folder / "config.json").read_text())
    config["joint_attention_dim"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"shape mismatch for 'txt_in.weight'.*\[32, 32\].*\[32, 64\]"):
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern=DIT), torch.float32)


def test_a_pattern_matching_nothing_fails_at_once_offline(base, monkeypatch):
    monkeypatch.setenv(resolve.SKIP_DOWNLOAD_ENV, "true")
    with pytest.raises(ModelFilesNotFoundError, match="pattern matches no file"):
        load_model(ModelConfig(model_id=QWEN, origin_file_pattern="transformer/model*.safetensors"))


def test_files_without_weights_or_config_are_refused(scratch_base, tmp_path):
    folder = scratch_base(QWEN, "vae")
    with pytest.raises(ModelLoadError, match="no .safetensors file"):
        load_model_from_files([folder / "config.json"])
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        load_model(ModelConfig(path=str(folder)))
    pickle = tmp_path / "model.bin"
    pickle.write_bytes(b"\x80")
    with pytest.raises(ModelLoadError, match="pickle"):
        load_model(ModelConfig(path=str(pickle)))


def test_files_from_two_folders_are_refused(base):
    files = [base / model_id / "vae" / "diffusion_pytorch_model.safetensors" for model_id in (QWEN, WAN)]
    with pytest.raises(ModelLoadError, match="several folders"):
        load_model_from_files(files)


@pytest.mark.gpu
@pytest.mark.parametrize(("model_id", "component", "pattern"), COMPONENTS)
def test_weights_load_straight_onto_cuda(base, model_id, component, pattern):
    model = load_model(ModelConfig(model_id=model_id, origin_file_pattern=pattern), torch.bfloat16, "cuda")
    reference = library_load(base / model_id / component, torch.bfloat16).cuda()
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"cuda"}
    assert_identical(model.state_dict(), reference.state_dict())


def test_a_text_encoder_saved_with_module_keys_loads_too(scratch_base):
    """transformers 5 writes Qwen2.5-VL in the original key layout; a file keyed like the module tree also loads."""
    folder = scratch_base(QWEN, "text_encoder")
    model = load_model(ModelConfig(model_id=QWEN, origin_file_pattern="text_encoder/*.safetensors"), torch.float32)
    assert any(key.startswith("model.language_model.") for key in model.state_dict())
    for file in folder.glob("model*"):
        file.unlink()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    again = load_model(ModelConfig(model_id=QWEN, origin_file_pattern="text_encoder/*.safetensors"), torch.float32)
    assert_identical(again.state_dict(), model.state_dict())


def test_model_classes_in_a_registered_module_are_found(monkeypatch):
    from diffsynth.core import model_traits
    from diffsynth.core.loader.loading import library_class

    monkeypatch.setattr(model_traits, "_MODEL_MODULES", [])
    with pytest.raises(ModelLoadError, match="'LTX2Vocoder'"):
        library_class("diffusers", "LTX2Vocoder", "vocoder/config.json")
    model_traits.register_model_module("diffusers.pipelines.ltx2")
    model_traits.register_model_module("diffusers.pipelines.ltx2")
    assert model_traits.model_modules("diffusers") == ["diffusers.pipelines.ltx2"]
    assert model_traits.model_modules("transformers") == []
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    assert library_class("diffusers", "LTX2Vocoder", "vocoder/config.json") is LTX2Vocoder
    with pytest.raises(ModelLoadError, match="'NoSuchModel'"):
        library_class("diffusers", "NoSuchModel", "x/config.json")
    with pytest.raises(ValueError, match="must be a submodule of diffusers or transformers"):
        model_traits.register_model_module("numpy.linalg")
