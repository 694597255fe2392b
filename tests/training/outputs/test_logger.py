"""ModelLogger: LoRA files that diffusers (and the other tools) load exactly, full checkpoints, save points, flags and
metrics."""

import copy
import json
import logging
import sys
import types

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors import safe_open

from diffsynth import __version__
from diffsynth.lora import from_peft_state_dict, load_lora
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.outputs.logger import METRICS_FILE, ModelLogger
from tests.conftest import load_lora_into_diffusers

TARGETS = ["to_q", "to_k", "to_v", "add_q_proj", "to_out.0", "to_add_out", "img_mlp.net.2", "txt_mod.1"]
RANK, ALPHA = 4, 8  # alpha != rank: a file that lost its alpha would load with half the effect


@pytest.fixture(scope="module")
def trained(tiny_root):
    """The tiny Qwen-Image transformer, the same with a peft LoRA as the training module injects it, and inputs."""
    from diffusers import QwenImageTransformer2DModel

    repo = tiny_root / "Qwen" / "Qwen-Image"
    base = QwenImageTransformer2DModel.from_pretrained(repo / "transformer").eval()  # float32 weights
    dit = copy.deepcopy(base).requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS), dit)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in dit.named_parameters():
            if "lora_B" in name:  # peft starts B at zero, which would make the LoRA a no-op
                parameter.normal_(std=0.1)
    inputs = dict(
        hidden_states=torch.randn(1, 16, 64), encoder_hidden_states=torch.randn(1, 7, 32),
        encoder_hidden_states_mask=torch.ones(1, 7), timestep=torch.tensor([0.6]), img_shapes=[(1, 4, 4)],
    )  # fmt: skip
    return repo, base, dit, inputs


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def named_trainable(dit):
    """The state dict as the training module names it: the pipeline is ``pipe``, the transformer its ``dit``."""
    return {"pipe.dit." + name: parameter for name, parameter in dit.named_parameters() if parameter.requires_grad}


def lora_logger(path, base=None, **kwargs):
    metadata = {"lora_rank": RANK, "lora_alpha": ALPHA, "lora_target_modules": ",".join(TARGETS),
                "lora_base_model": "dit"}
    if base is not None:  # what the training module adds, so that the first save is checked against every tool
        metadata.update(base_model_class=type(base).__name__,
                        base_model_config={k: v for k, v in dict(base.config).items() if not k.startswith("_")})
    return ModelLogger(path, "pipe.dit.", metadata, **kwargs)


def read(path):
    with safe_open(str(path), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()


def test_lora_file_loads_into_diffusers_exactly(trained, tmp_path):
    from diffusers import QwenImagePipeline

    repo, base, dit, inputs = trained
    path = lora_logger(tmp_path, base).save_lora(named_trainable(dit), "epoch-0")
    assert path == tmp_path / "epoch-0.safetensors"

    pipe = QwenImagePipeline.from_pretrained(repo)
    messages = load_lora_into_diffusers(pipe, path, "trained")
    assert not [m for m in messages if "missing" in m or "unexpected" in m or "No LoRA keys" in m], messages

    # The scale is folded into lora_B, so diffusers applies alpha = r; each layer's update is the trained one.
    loaded = {name: module for name, module in pipe.transformer.named_modules() if hasattr(module, "scaling")}
    trained_layers = {name: module for name, module in dit.named_modules() if hasattr(module, "scaling")}
    assert loaded.keys() == trained_layers.keys() and len(loaded) == 2 * len(TARGETS)
    for name, module in trained_layers.items():
        want = module.scaling["default"] * module.lora_B["default"].weight @ module.lora_A["default"].weight
        got = loaded[name].scaling["trained"] * loaded[name].lora_B["trained"].weight @ loaded[
            name].lora_A["trained"].weight
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)

    expected = run(dit, inputs)
    assert (expected - run(base, inputs)).abs().max() > 1e-3
    torch.testing.assert_close(run(pipe.transformer, inputs), expected, atol=1e-5, rtol=0)
    # This package's own merge reads the same file (alpha from the metadata) to the same output.
    merged = copy.deepcopy(base)
    assert load_lora(merged, path) == 2 * len(TARGETS)
    torch.testing.assert_close(run(merged, inputs), expected, atol=1e-5, rtol=0)


def test_lora_file_keys_and_metadata(trained, tmp_path):
    base, dit = trained[1], trained[2]
    path = lora_logger(tmp_path, base).save_lora(named_trainable(dit), "step-7", {"step": 7})
    tensors, metadata = read(path)
    assert all(key.startswith("diffusion_model.transformer_blocks.") for key in tensors)
    assert "diffusion_model.transformer_blocks.0.attn.to_out.0.lora_A.weight" in tensors
    assert not [key for key in tensors if ".default" in key or "pipe.dit" in key or key.endswith(".alpha")]
    assert all(tensor.dtype == torch.float32 for tensor in tensors.values())
    key = "transformer_blocks.1.txt_mod.1"
    trained_b = dict(dit.named_parameters())[f"{key}.lora_B.default.weight"]
    torch.testing.assert_close(tensors[f"diffusion_model.{key}.lora_B.weight"], trained_b * ALPHA / RANK)
    assert metadata["format"] == "pt" and metadata["diffsynth_version"] == __version__
    assert (metadata["lora_rank"], metadata["diffsynth.lora.alpha"], metadata["step"]) == ("4", "8", "7")
    assert (metadata["diffsynth.lora.layout"], float(metadata["diffsynth.lora.folded_scale"])) == ("universal", 2.0)
    assert metadata["lora_target_modules"] == ",".join(TARGETS) and metadata["lora_base_model"] == "dit"
    assert metadata["diffsynth.lora.layers"] == str(2 * len(TARGETS))
    assert metadata["diffsynth.lora.base_model_class"] == "QwenImageTransformer2DModel"
    assert json.loads(metadata["diffsynth.lora.base_model_config"])["num_layers"] == 2
    # No plain alpha entry: a reader that applied it would scale the folded factors twice.
    assert "lora_alpha" not in metadata and "lora_adapter_metadata" not in metadata
    assert [p.name for p in tmp_path.iterdir()] == ["step-7.safetensors"]  # no temporary file, no twin needed


def test_alpha_defaults_to_the_rank_and_save_dtype_casts(trained, tmp_path):
    dit = trained[2]
    logger = ModelLogger(tmp_path, lora_metadata={"lora_rank": RANK, "lora_target_modules": ["to_q", "to_k"]},
                         save_dtype="bfloat16")
    tensors, metadata = read(logger.save_lora(named_trainable(dit), "epoch-1.safetensors"))
    assert metadata["diffsynth.lora.alpha"] == "4" and metadata["dtype"] == "bfloat16"
    assert float(metadata["diffsynth.lora.folded_scale"]) == 1.0
    assert all(tensor.dtype == torch.bfloat16 for tensor in tensors.values())
    assert metadata["lora_target_modules"] == "to_q,to_k" and "lora_base_model" not in metadata


def test_save_lora_rejects_what_is_not_one_lora(trained, tmp_path):
    state_dict = named_trainable(trained[2])
    logger = lora_logger(tmp_path)
    with pytest.raises(ValueError, match="is not a peft LoRA weight; save full weights with save_state_dict"):
        logger.save_lora({**state_dict, "pipe.dit.proj_out.weight": torch.zeros(2, 2)}, "x")
    with pytest.raises(ValueError, match="rank 4 but --lora_rank is 8"):
        ModelLogger(tmp_path, lora_metadata={"lora_rank": 8}).save_lora(state_dict, "x")
    lonely = {key: value for key, value in state_dict.items() if "to_q.lora_B" not in key}
    with pytest.raises(ValueError, match=r"to_q.*lack their lora_A or lora_B"):
        logger.save_lora(lonely, "x")
    with pytest.raises(ValueError, match="mixes peft adapters"):
        from_peft_state_dict({"a.lora_A.one.weight": torch.zeros(1, 2), "a.lora_B.two.weight": torch.zeros(2, 1)}, None)
    with pytest.raises(ValueError, match="plain file name"):
        logger.save_lora(state_dict, "../outside")
    assert list(tmp_path.iterdir()) == []


def test_full_weights_and_mixed_runs_keep_everything(tmp_path):
    weights = {"pipe.dit.proj_out.weight": torch.ones(2, 3), "pipe.dit.blocks.0.to_q.lora_A.default.weight":
               torch.zeros(1, 3), "pipe.vae.scale": torch.ones(1)}
    logger = ModelLogger(tmp_path)
    tensors, metadata = read(logger.save_checkpoint(weights, "epoch-0"))
    assert set(tensors) == {"proj_out.weight", "blocks.0.to_q.lora_A.default.weight", "pipe.vae.scale"}
    assert metadata == {"format": "pt", "diffsynth_version": __version__}
    tensors, _ = read(logger.save_state_dict({"pipe.dit.norm.weight": torch.ones(3)}, "full"))
    assert list(tensors) == ["norm.weight"]


def test_a_lora_diffusers_cannot_take_is_still_saved(trained, tmp_path, caplog):
    state_dict = named_trainable(trained[2])
    with caplog.at_level(logging.WARNING, logger="diffsynth.training.outputs.logger"):
        path = ModelLogger(tmp_path, lora_metadata={"lora_rank": 8}).save_checkpoint(state_dict, "epoch-0")
    assert "epoch-0: saving the weights as they are" in caplog.text and "--lora_rank is 8" in caplog.text
    assert set(read(path)[0]) == {key.removeprefix("pipe.dit.") for key in state_dict}


def test_save_points_and_only_the_main_process_writes(trained, tmp_path):
    state_dict = named_trainable(trained[2])
    calls = []

    def gather():
        calls.append(1)
        return state_dict

    logger = lora_logger(tmp_path, save_steps=2, enable_csv_log=True)
    saved = [logger.on_step_end(step, 0.5, 1e-4, gather) for step in (1, 2, 3)]
    assert saved[0] is None and saved[1] == tmp_path / "step-2.safetensors" and saved[2] is None
    assert logger.on_train_end(3, gather) == tmp_path / "step-3.safetensors"  # step 3 was in no file yet
    assert logger.on_epoch_end(0, gather) == tmp_path / "epoch-0.safetensors"
    assert logger.on_train_end(3, gather) is None  # the epoch file already holds the last step
    assert len(calls) == 3
    assert read(tmp_path / "epoch-0.safetensors")[1]["epoch"] == "0"
    logger.close()

    other = tmp_path / "rank1"
    follower = lora_logger(other, save_steps=2, enable_csv_log=True, is_main_process=False)
    assert follower.on_step_end(2, 0.5, 1e-4, gather) is None and follower.on_epoch_end(0, gather) is None
    assert follower.save_training_args({"a": 1}) is None
    assert len(calls) == 5 and not other.exists()  # it gathered (a collective) but wrote nothing


def test_training_args_json(tmp_path):
    config = parse_args(["--model_paths", '["dit.safetensors"]', "--lora_base_model", "dit", "--dataset_metadata_path", "m.csv", "--lora_rank", "8",
                         "--output_path", str(tmp_path)]).with_pipeline_defaults(QwenImagePipeline)
    flags = {**config.to_flags(), "torch_dtype": torch.bfloat16, "folders": {tmp_path / "a"}, "shape": (1, 2)}
    logger = ModelLogger.from_config(config)
    # An unset --lora_target_modules is recorded as the model's defaults it stood for.
    assert logger.lora_metadata == {"lora_rank": 8, "lora_alpha": None,
                                    "lora_target_modules": QwenImagePipeline.default_lora_target_modules,
                                    "lora_base_model": "dit"}
    path = logger.save_training_args(flags)
    saved = json.loads(path.read_text())
    assert path == tmp_path / "training_args.json"
    assert saved["lora_rank"] == 8 and saved["task"] == "sft" and saved["save_steps"] is None
    assert saved["torch_dtype"] == "torch.bfloat16" and saved["folders"] == [str(tmp_path / "a")]
    assert saved["shape"] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training_args.json"]


def test_csv_rows_flush_and_resume_without_a_second_header(tmp_path):
    logger = ModelLogger(tmp_path, enable_csv_log=True)
    logger.log_metrics(1, {"loss": torch.tensor(0.25), "lr": 1e-4})
    csv_path = tmp_path / METRICS_FILE
    assert csv_path.read_text() == "step,loss,lr\n1,0.25,0.0001\n"  # on disk before close: a killed run keeps it
    logger.log_metrics(2, {"loss": 0.5})
    logger.close()
    with open(csv_path, "a") as handle:
        handle.write("3,0.7")  # a run killed mid-row
    with ModelLogger(tmp_path, enable_csv_log=True) as resumed:
        resumed.log_metrics(3, {"lr": 2e-4, "loss": 0.125, "grad_norm": 1.0})
    assert csv_path.read_text() == "step,loss,lr\n1,0.25,0.0001\n2,0.5,\n3,0.125,0.0002\n"


def test_a_metric_measured_on_some_steps_is_a_column_from_the_first_row(tmp_path):
    """``val_loss`` given as None on the steps it is not measured: in the header from the first row, cells empty, and
    only the measured values reach TensorBoard / wandb."""
    logged = []

    class Sink:
        def add_scalar(self, key, value, step):
            logged.append((key, value, step))

        def flush(self):
            pass

        def close(self):
            pass

    logger = ModelLogger(tmp_path, enable_csv_log=True)
    logger._tensorboard = Sink()
    logger.log_metrics(1, {"loss": 0.5, "lr": 1e-4, "val_loss": None})
    logger.log_metrics(2, {"loss": 0.25, "lr": 1e-4, "val_loss": 0.75})
    logger.close()
    assert (tmp_path / METRICS_FILE).read_text() == "step,loss,lr,val_loss\n1,0.5,0.0001,\n2,0.25,0.0001,0.75\n"
    assert ("val_loss", 0.75, 2) in logged and not any(key == "val_loss" and step == 1 for key, _, step in logged)


@pytest.mark.parametrize("flag,module,install", [
    ("enable_tensorboard_log", "torch.utils.tensorboard", "pip install tensorboard"),
    ("enable_wandb_log", "wandb", "pip install wandb"),
])
def test_missing_logging_package_fails_at_construction(tmp_path, monkeypatch, flag, module, install):
    monkeypatch.setitem(sys.modules, module, None)  # makes the import raise ImportError
    with pytest.raises(ImportError) as error:
        ModelLogger(tmp_path / "out", **{flag: True})
    assert f"--{flag}" in str(error.value) and install in str(error.value) and f"drop --{flag}" in str(error.value)
    with pytest.raises(ImportError, match=install):  # other ranks fail too rather than wait for the main one
        ModelLogger(tmp_path / "out", is_main_process=False, **{flag: True})
    assert not (tmp_path / "out").exists()


def test_tensorboard_and_wandb_receive_the_metrics(tmp_path, monkeypatch):
    events = []

    class FakeWriter:
        def __init__(self, log_dir):
            events.append(("tensorboard", log_dir))

        def add_scalar(self, key, value, step):
            events.append(("scalar", key, value, step))

        def flush(self):
            pass

        def close(self):
            events.append(("tensorboard closed",))

    class FakeRun:
        config = types.SimpleNamespace(update=lambda payload, allow_val_change: events.append(("config", payload)))
        log = staticmethod(lambda values, step: events.append(("wandb", values, step)))
        finish = staticmethod(lambda: events.append(("wandb finished",)))

    wandb = types.SimpleNamespace(init=lambda project, dir: events.append(("init", project, dir)) or FakeRun())
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    with ModelLogger(tmp_path, enable_tensorboard_log=True, enable_wandb_log=True, wandb_project="p") as logger:
        logger.save_training_args({"seed": 3})
        logger.log_metrics(5, {"loss": 0.5})
    assert events == [
        ("tensorboard", str(tmp_path / "logs" / "tensorboard")), ("init", "p", str(tmp_path)),
        ("config", {"seed": 3}), ("scalar", "loss", 0.5, 5), ("wandb", {"loss": 0.5}, 5), ("tensorboard closed",),
        ("wandb finished",),
    ]  # fmt: skip


def test_invalid_settings_fail_at_construction(tmp_path):
    with pytest.raises(ValueError, match="--save_steps 0 must be at least 1"):
        ModelLogger(tmp_path, save_steps=0)
    with pytest.raises(ValueError, match="save_dtype='int8' is not a floating dtype"):
        ModelLogger(tmp_path, save_dtype="int8")
    with pytest.raises(ValueError, match="--lora_alpha 0 must be positive"):
        ModelLogger(tmp_path, lora_metadata={"lora_alpha": 0})


@pytest.mark.parametrize("lora", [True, False])
def test_non_finite_weights_are_never_written(trained, tmp_path, lora):
    from diffsynth.core.finite import NonFiniteTensorError

    state_dict = {key: value.detach().clone() for key, value in named_trainable(trained[2]).items()}
    if not lora:
        state_dict = {"pipe.dit.proj_out.weight": torch.ones(2, 3)}
    next(iter(state_dict.values()))[0, 0] = float("nan")
    logger = lora_logger(tmp_path, save_steps=1)
    with pytest.raises(NonFiniteTensorError, match=r"not writing .*step-1\.safetensors: the trained weights"):
        logger.on_step_end(1, 0.5, 1e-4, lambda: state_dict)
    with pytest.raises(NonFiniteTensorError, match=r"epoch-0\.safetensors"):
        logger.on_epoch_end(0, lambda: state_dict)
    assert not list(tmp_path.glob("*.safetensors"))
