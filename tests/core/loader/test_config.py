"""ModelConfig validation and the parsers of --model_id_with_origin_paths and --model_paths."""

import pytest

from diffsynth.core.loader import (
    ModelConfig,
    ModelConfigError,
    parse_model_configs,
    parse_model_id_with_origin_paths,
    parse_model_paths,
)


def test_parse_model_id_with_origin_paths_splits_entries_at_the_last_colon():
    configs = parse_model_id_with_origin_paths(
        "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors, Qwen/Qwen-Image:tokenizer/,"
    )
    assert [(c.model_id, c.origin_file_pattern) for c in configs] == [
        ("Qwen/Qwen-Image", "transformer/diffusion_pytorch_model*.safetensors"),
        ("Qwen/Qwen-Image", "tokenizer/"),
    ]
    assert all(not c.is_local for c in configs)
    assert parse_model_id_with_origin_paths("a:b:c/*.safetensors")[0].model_id == "a:b"


@pytest.mark.parametrize("value", ["Qwen/Qwen-Image", "Qwen/Qwen-Image:", ":vae/*.safetensors", "ok/id:x,broken"])
def test_parse_model_id_with_origin_paths_names_the_flag_and_the_bad_entry(value):
    bad = value.split(",")[-1]
    with pytest.raises(ModelConfigError, match="--model_id_with_origin_paths") as info:
        parse_model_id_with_origin_paths(value)
    assert repr(bad) in str(info.value)
    assert "model_id:origin_file_pattern" in str(info.value)


@pytest.mark.parametrize("value", ["", " , ", None])
def test_parse_model_id_with_origin_paths_rejects_an_empty_flag(value):
    with pytest.raises(ModelConfigError, match="--model_id_with_origin_paths"):
        parse_model_id_with_origin_paths(value)


@pytest.mark.parametrize(
    "entry", ["Qwen/Qwen-Image:/etc/*.safetensors", "../up:x.safetensors", "Qwen/Qwen-Image:a/../../b", "C:/models/x:y"]
)
def test_patterns_and_ids_cannot_escape_the_repository_folder(entry):
    with pytest.raises(ModelConfigError, match="relative"):
        parse_model_id_with_origin_paths(entry)


def test_parse_model_paths_accepts_paths_and_lists_of_shards():
    configs = parse_model_paths('["models/vae.safetensors", ["dit-1.safetensors", "dit-2.safetensors"]]')
    assert [c.path for c in configs] == ["models/vae.safetensors", ["dit-1.safetensors", "dit-2.safetensors"]]
    assert all(c.is_local for c in configs)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("models/vae.safetensors", "not valid JSON"),
        ('{"a": 1}', "non-empty JSON list"),
        ("[]", "non-empty JSON list"),
        ("[1]", "entry 0"),
        ('["a", []]', "entry 1"),
        ('["a", ["b", 2]]', "entry 1"),
    ],
)
def test_parse_model_paths_errors_name_the_flag_and_the_expected_form(value, message):
    with pytest.raises(ModelConfigError, match="--model_paths") as info:
        parse_model_paths(value)
    assert message in str(info.value)


def test_parse_model_configs_combines_both_flags_and_needs_one():
    configs = parse_model_configs('["a.safetensors"]', "Qwen/Qwen-Image:vae/*.safetensors")
    assert [c.is_local for c in configs] == [True, False]
    with pytest.raises(ModelConfigError, match="no model given"):
        parse_model_configs(None, "")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs path"),
        ({"path": "a", "model_id": "b", "origin_file_pattern": "c"}, "both"),
        ({"model_id": "Qwen/Qwen-Image"}, "origin_file_pattern"),
        ({"origin_file_pattern": "vae/*"}, "model_id"),
        ({"path": []}, "non-empty list"),
        ({"path": 3}, "string"),
        ({"model_id": "Qwen/ Qwen", "origin_file_pattern": "x"}, "whitespace"),
        ({"model_id": "a", "origin_file_pattern": "b", "download_source": "s3"}, "download_source"),
        ({"model_id": "a", "origin_file_pattern": "b", "skip_download": "yes"}, "skip_download"),
    ],
)
def test_model_config_validates_at_construction(kwargs, message):
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig(**kwargs)


def test_model_config_describe_names_the_model():
    assert ModelConfig(model_id="a/b", origin_file_pattern="vae/*").describe() == "a/b:vae/*"
    assert "x.safetensors" in ModelConfig(path="x.safetensors").describe()
