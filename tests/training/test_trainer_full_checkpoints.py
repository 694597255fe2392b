"""A full fine-tune's checkpoints end to end on the tiny Qwen-Image: the diffusers folder that diffusers and our
pipeline load as the trained transformer, and a resumed run that ends bit-identical to an uninterrupted one."""

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.loader.config import ModelConfig
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main
from tests.training.test_trainer import ALL_MODELS, raw

FULL = ["--model_id_with_origin_paths", ALL_MODELS, "--trainable_models", "dit", "--torch_dtype", "float32",
        "--seed", "3", "--max_pixels", "4096", "--learning_rate", "1e-3", "--dataset_repeat", "2"]  # fmt: skip
DIFFUSERS_ONLY = ["--full_checkpoint_format", "diffusers"]
SGD = ["--customized_optimizer", "torch.optim.SGD", "--learning_rate", "0.05", "--max_grad_norm", "1.0",
       "--weight_decay", "0"]


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def full_run(dataset, output, *extra):
    return main(QwenImagePipeline, [*raw(dataset), *FULL, "--output_path", str(output), *extra])


def weights(folder):
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel.from_pretrained(folder).state_dict()


def test_the_saved_folder_loads_in_diffusers_and_our_pipeline_as_the_trained_transformer(dataset, tmp_path):
    result = full_run(dataset, tmp_path / "out", *DIFFUSERS_ONLY)
    trained = result["module"].pipe.dit.state_dict()
    folder = tmp_path / "out" / "epoch-0.dit"
    assert not (tmp_path / "out" / "epoch-0.safetensors").exists()  # flat was not asked for
    loaded = weights(folder)
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)
    repo = [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[name])
            for name in ("text_encoder", "vae")]
    pipe = QwenImagePipeline.from_pretrained(torch_dtype=torch.float32,
                                             model_configs=[ModelConfig(path=str(folder)), *repo])
    ours = pipe.dit.state_dict()
    assert all(torch.equal(ours[k], trained[k]) for k in trained)


def test_an_interrupted_and_resumed_full_fine_tune_ends_bit_identical(dataset, tmp_path):
    full_run(dataset, tmp_path / "whole")
    stopped = full_run(dataset, tmp_path / "resumed", "--max_train_steps", "3")
    assert stopped["global_step"] == 3 and (tmp_path / "resumed" / "step-3.dit").is_dir()
    flat = load_file(str(tmp_path / "resumed" / "step-3.safetensors"))  # auto writes the flat file beside the folder
    folder = weights(tmp_path / "resumed" / "step-3.dit")
    assert flat and all(torch.equal(value, folder[key]) for key, value in flat.items())
    resumed = full_run(dataset, tmp_path / "resumed", "--resume_from_checkpoint", "latest")
    assert resumed["global_step"] == 6
    whole, continued = weights(tmp_path / "whole" / "epoch-0.dit"), weights(tmp_path / "resumed" / "epoch-0.dit")
    assert all(torch.equal(whole[key], continued[key]) for key in whole)
    assert not all(torch.equal(whole[key], value) for key, value in folder.items())


@pytest.mark.slow
def test_zero3_writes_the_full_fine_tunes_folder_block_by_block(dataset, tmp_path, tiny_root):
    """One process under ZeRO-3 (all this machine runs): every weight partitioned, the folder read block by block
    without the whole-model gather, and equal to the plain run's. SGD, whose update is linear in the gradient (Adam
    turns rounding differences of near-zero gradients into differences of a whole step), and --max_grad_norm 1.0,
    which accelerate's DeepSpeed config applies anyway (it fills gradient_clipping "auto" with 1.0); no weight decay,
    as DeepSpeed hands weights that get no gradient (the last block's text stream) a zero one and decays them."""
    pytest.importorskip("deepspeed")
    from tests.training.test_trainer_deepspeed import launch, write_configs

    argv = [*raw(dataset), *FULL, *DIFFUSERS_ONLY, *SGD, "--max_train_steps", "2"]
    zero3 = launch(write_configs(tmp_path), [*argv, "--output_path", str(tmp_path / "zero3")], tiny_root)
    assert zero3.returncode == 0, zero3.stderr[-3000:]
    plain = full_run(dataset, tmp_path / "plain", *SGD, "--max_train_steps", "2")["module"].pipe.dit.state_dict()
    partitioned = weights(tmp_path / "zero3" / "step-2.dit")
    initial = weights(tiny_root / QWEN_IMAGE_MODEL_ID / "transformer")
    assert max((plain[key] - partitioned[key]).abs().max().item() for key in plain) < 1e-6
    assert max((plain[key] - initial[key]).abs().max().item() for key in plain) > 1e-4


def test_a_flux1_full_fine_tune_writes_bfls_single_file_beside_the_flat_one(dataset, tmp_path):
    from diffsynth.core.loader.loading import load_model_from_files
    from diffsynth.pipelines.flux.pipeline import FluxPipeline
    from tests.training.test_trainer_flux import raw as flux_raw

    output = tmp_path / "flux"
    result = main(FluxPipeline, [*flux_raw(dataset), "--trainable_models", "dit", "--learning_rate", "1e-3",
                                 "--torch_dtype", "float32", "--max_pixels", "1024", "--output_path", str(output),
                                 "--max_train_steps", "2", "--full_checkpoint_format", "flat,original"])
    assert sorted(p.name for p in output.glob("step-2*")) == ["step-2.dit.original.safetensors", "step-2.safetensors"]
    trained = result["module"].pipe.dit.state_dict()
    loaded = load_model_from_files([output / "step-2.dit.original.safetensors"], torch_dtype=torch.float32)
    assert all(torch.equal(value, trained[key]) for key, value in loaded.state_dict().items())
