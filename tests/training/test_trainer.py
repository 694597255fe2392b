"""The CLI trainer end to end on the tiny Qwen-Image: stages, offload modes, resume, LoRA output, loss, bad input.

Runs go through ``trainer.main`` with a real argv (the entry every ``train.py`` calls); one test launches
``train.py`` itself with ``accelerate launch`` on two processes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.conftest import reset_accelerate_state
from tests.training.conftest import lora, max_difference, run_once
from tests.launching import accelerate_launch

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "examples" / "qwen_image" / "model_training" / "train.py"
PATTERN = {name: f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
ALL_MODELS = ",".join(PATTERN.values())
COMMON = [
    "--model_id_with_origin_paths", ALL_MODELS, "--lora_base_model", "dit",
    "--lora_target_modules", "to_q,to_k,to_v,add_q_proj,to_out.0,img_mlp.net.2,txt_mod.1", "--lora_rank", "4",
    "--learning_rate", "1e-3", "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "4096",
    "--use_gradient_checkpointing", "--remove_prefix_in_ckpt", "pipe.dit.",
]  # fmt: skip
OFFLOAD_MODES = {"plain": [], "offload": ["--enable_model_cpu_offload"],
                 "optimizer_offload": ["--enable_model_cpu_offload", "--enable_optimizer_cpu_offload"]}


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


def raw(dataset, *extra):
    return ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv"), *extra]


def one_stage(dataset, output, *extra):
    return main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--dataset_repeat", "2",
                                    "--num_epochs", "2", *extra])


def two_stage(dataset, output, *extra):
    cache = output.parent / f"{output.name}_cache"
    stage_one = main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(cache), "--task",
                                         "sft:data_process", "--offload_models", PATTERN["dit"], *extra])
    stage_two = main(QwenImagePipeline, [
        "--dataset_base_path", str(cache), *COMMON, "--output_path", str(output), "--task", "sft:train",
        "--dataset_repeat", "2", "--num_epochs", "2", "--offload_models",
        f"{PATTERN['text_encoder']},{PATTERN['vae']}", *extra,
    ])  # fmt: skip
    return stage_one, stage_two


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory, tiny_root):
    """One-stage plain training: the LoRA every other way of training must reproduce."""
    return run_once(tiny_root, tmp_path_factory.mktemp("reference"), lambda output: one_stage(dataset, output))


def test_one_stage_writes_a_lora_per_epoch_and_the_run_record(reference):
    output, result = reference
    assert result["global_step"] == 12 and len(result["losses"]) == 12
    assert (output / "epoch-0.safetensors").is_file() and (output / "training_args.json").is_file()
    weights = lora(output)
    assert all(key.startswith("diffusion_model.transformer_blocks.") for key in weights)
    # The trained LoRA is no longer its initialisation (lora_B starts at zero).
    assert max(weights[key].abs().max().item() for key in weights if "lora_B" in key) > 1e-4


@pytest.mark.parametrize("prefetch", ["0", "2"])
@pytest.mark.parametrize("mode", ["offload", "optimizer_offload"])
def test_offloaded_training_gives_the_plain_lora(reference, dataset, tmp_path, mode, prefetch):
    one_stage(dataset, tmp_path / "out", *OFFLOAD_MODES[mode], "--offload_prefetch_depth", prefetch)
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


def test_gradient_accumulation_works_with_optimizer_offload(dataset, tmp_path):
    for mode in ("plain", "optimizer_offload"):
        result = one_stage(dataset, tmp_path / mode, "--gradient_accumulation_steps", "2", "--num_epochs", "1",
                           *OFFLOAD_MODES[mode])
        assert result["global_step"] == 3
    assert max_difference(lora(tmp_path / "plain", "epoch-0"), lora(tmp_path / "optimizer_offload", "epoch-0")) < 1e-6


@pytest.mark.parametrize("mode", list(OFFLOAD_MODES))
def test_two_stage_training_gives_the_one_stage_lora(reference, dataset, tmp_path, mode):
    stage_one, _ = two_stage(dataset, tmp_path / "out", *OFFLOAD_MODES[mode])
    assert stage_one["cached"] == 3
    cache_files = sorted(p.name for p in (tmp_path / "out_cache" / "0").iterdir())
    assert cache_files == ["0.safetensors", "1.safetensors", "2.safetensors"]
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


def test_stage_one_may_leave_out_the_trained_model(reference, dataset, tmp_path):
    without_dit = [*COMMON]
    without_dit[1] = f"{PATTERN['text_encoder']},{PATTERN['vae']}"
    main(QwenImagePipeline, [*raw(dataset), *without_dit, "--output_path", str(tmp_path / "cache"), "--task",
                             "sft:data_process"])
    main(QwenImagePipeline, stage_two_argv(tmp_path / "cache", tmp_path / "out", "--dataset_repeat", "2",
                                           "--num_epochs", "2"))
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


def test_rerunning_stage_one_skips_cached_samples(dataset, tmp_path):
    # A repeat in stage 1 would only write identical files; each row is cached once.
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "cache"), "--task", "sft:data_process",
            "--dataset_repeat", "3"]
    assert main(QwenImagePipeline, argv)["cached"] == 3
    (tmp_path / "cache" / "0" / "1.safetensors").unlink()
    assert main(QwenImagePipeline, argv)["cached"] == 1


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(reference, dataset, tmp_path):
    output = tmp_path / "out"
    stopped = one_stage(dataset, output, "--max_train_steps", "5")
    assert stopped["global_step"] == 5 and (output / "checkpoints" / "step-5").is_dir()
    resumed = one_stage(dataset, output, "--resume_from_checkpoint", "latest")
    assert resumed["global_step"] == 12 and len(resumed["losses"]) == 7
    assert resumed["losses"] == pytest.approx(reference[1]["losses"][5:], abs=1e-6)
    assert max_difference(lora(output), lora(reference[0])) < 1e-6


def test_a_resume_that_fails_before_its_first_step_leaves_the_earlier_runs_files(dataset, tmp_path, monkeypatch):
    from diffsynth.training.loop.training_loop import TrainingLoop

    output = tmp_path / "out"
    one_stage(dataset, output, "--max_train_steps", "5", "--save_steps", "2", "--enable_csv_log")
    earlier = {name: (output / name).read_bytes() for name in ("logs/metrics.csv", "training_args.json",
                                                               "config.yaml")}
    reset_accelerate_state()

    def fail(self):
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(TrainingLoop, "_prepare", fail)
    with pytest.raises(RuntimeError, match="the device is gone"):
        one_stage(dataset, output, "--resume_from_checkpoint", "latest", "--learning_rate", "2e-3", "--enable_csv_log")
    assert {name: (output / name).read_bytes() for name in earlier} == earlier


def test_a_checkpoint_of_one_process_is_refused_on_two_before_anything_changes(dataset, tmp_path, tiny_root):
    flags = [*raw(dataset), *COMMON, "--num_epochs", "1", "--dataset_repeat", "2", "--enable_csv_log"]
    main(QwenImagePipeline, [*flags, "--max_train_steps", "3", "--save_steps", "3", "--output_path",
                             str(tmp_path / "two")])
    metrics = (tmp_path / "two" / "logs" / "metrics.csv").read_bytes()
    with pytest.raises(AssertionError, match="this run has 2 processes, but the checkpoint .* was trained on 1"):
        launch_two_processes(tmp_path, tiny_root, [*flags, "--resume_from_checkpoint", "latest"], tmp_path / "two")
    assert (tmp_path / "two" / "logs" / "metrics.csv").read_bytes() == metrics


def test_the_loss_falls_when_overfitting_one_image(dataset, tmp_path, tiny_root):
    from diffsynth.core import ModelConfig
    from diffsynth.core.data import UnifiedDataset
    from diffsynth.lora import load_lora
    from diffsynth.training.objective.loss import FlowMatchSFTLoss

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "metadata.csv").write_text("image,prompt\nimage_000.png,a shape\n")
    (tmp_path / "one" / "image_000.png").write_bytes((dataset / "image_000.png").read_bytes())
    output = tmp_path / "out"
    main(QwenImagePipeline, [*raw(tmp_path / "one"), *COMMON, "--output_path", str(output), "--dataset_repeat", "60",
                             "--learning_rate", "1e-2"])
    # The same timesteps and noise before and after: only the LoRA differs.
    configs = [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[name])
               for name in ("dit", "text_encoder", "vae")]
    pipe = QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs)
    sample = UnifiedDataset(tmp_path / "one", tmp_path / "one" / "metadata.csv", max_pixels=4096)[0]
    state = pipe.run_units(*pipe.training_inputs(sample))

    def mean_loss():
        with torch.no_grad():
            return sum(FlowMatchSFTLoss()(pipe, *state, generator=torch.Generator().manual_seed(i)).item()
                       for i in range(16)) / 16

    before = mean_loss()
    load_lora(pipe.dit, output / "epoch-0.safetensors")
    assert mean_loss() < 0.8 * before


MULTI_PROCESS_MODES = {**OFFLOAD_MODES, "block_swap": ["--blocks_to_swap", "1"],
                       "h2d_streaming": ["--blocks_to_swap", "2", "--block_swap_h2d_only"],
                       # Batches of 2 from one bucket, 12 samples: each process a batch per step, 3 steps.
                       "batches": ["--batch_size", "2", "--height", "64", "--width", "64", "--dataset_repeat", "4"]}


def launch_two_processes(tmp_path, tiny_root, flags, output):
    """``main`` on two gloo processes, as ``accelerate launch --multi_gpu --num_processes 2`` starts it; returns the
    finished process and each rank's trained weights."""
    script = tmp_path / "run.py"
    script.write_text(
        "import atexit, os, sys\n"
        "from diffsynth.core.unused_libraries import keep_out\n"
        "keep_out('bitsandbytes')\n"  # as the trainer's command line does: a second less per process
        "import torch\n"
        "from safetensors.torch import save_file\n"
        "from diffsynth.training.entry import main\n"
        # Registered first, so it runs last: after the trainer's own exit handler.
        # One write: the two ranks share the pipe, and print's pieces interleave.
        "atexit.register(lambda: os.write(2, f'group alive at exit: "
        "{torch.distributed.is_initialized()}\\n'.encode()))\n"
        "from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline\n"
        "result = main(QwenImagePipeline, sys.argv[1:])\n"
        "rank = torch.distributed.get_rank()\n"
        "save_file(result['module'].trainable_state_dict(), sys.argv[sys.argv.index('--output_path') + 1]"
        " + f'/rank{rank}.safetensors')\n"
    )
    command = [*accelerate_launch(2), str(script), *flags,
               "--output_path", str(output)]
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # A gloo group left to interpreter finalisation can abort a finished run.
    assert done.stderr.count("group alive at exit: False") == 2, done.stderr[-3000:]
    return done, load_file(str(output / "rank0.safetensors")), load_file(str(output / "rank1.safetensors"))


@pytest.mark.parametrize("mode", list(MULTI_PROCESS_MODES))
def test_two_processes_train_what_one_process_accumulating_two_samples_trains(dataset, tmp_path, tiny_root, mode):
    """DDP for plain training, the offload manager's own all-reduce for offloaded training, the runner's for block
    swap; with batches, two processes at batch 2 train what one process at batch 2 accumulating two batches trains."""
    flags = [*raw(dataset), *COMMON, "--num_epochs", "1", "--dataset_repeat", "2", *MULTI_PROCESS_MODES[mode]]
    done, first, second = launch_two_processes(tmp_path, tiny_root, flags, tmp_path / "two")
    assert max_difference(first, second) == 0
    # Six samples: three optimizer steps, each averaging two samples, in both runs.
    single = main(QwenImagePipeline, [*flags, "--gradient_accumulation_steps", "2", "--output_path",
                                      str(tmp_path / "one")])
    assert single["global_step"] == 3 and "training: 100%" in done.stderr
    assert max_difference(first, single["module"].trainable_state_dict()) < 1e-6
    assert max_difference(lora(tmp_path / "two", "epoch-0"), lora(tmp_path / "one", "epoch-0")) < 1e-6


def test_two_processes_train_from_a_cache_beside_skeleton_models(dataset, tmp_path, tiny_root):
    """Stage 2 builds the models it never runs (``--offload_models``) as skeletons on the meta device: DDP must not
    be handed them, and two processes train what one accumulating two samples trains (with fp8 storage as well:
    tests/examples/test_multi_process_scripts.py)."""
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "cache"), "--task",
                             "sft:data_process", "--offload_models", PATTERN["dit"]])
    reset_accelerate_state()
    flags = ["--dataset_base_path", str(tmp_path / "cache"), *COMMON, "--task", "sft:train", "--offload_models",
             f"{PATTERN['text_encoder']},{PATTERN['vae']}", "--dataset_repeat", "2", "--num_epochs", "1"]
    done, first, second = launch_two_processes(tmp_path, tiny_root, flags, tmp_path / "two")
    assert max_difference(first, second) == 0
    single = main(QwenImagePipeline, [*flags, "--gradient_accumulation_steps", "2", "--output_path",
                                      str(tmp_path / "one")])
    assert single["global_step"] == 3
    assert max_difference(lora(tmp_path / "two", "epoch-0"), lora(tmp_path / "one", "epoch-0")) < 1e-6


def write_dataset(folder, metadata, images=("a.png",)):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name in images:
        Image.new("RGB", (64, 64), "red").save(folder / name)
    (folder / "metadata.csv").write_text(metadata)
    return folder


@pytest.mark.parametrize("metadata, images, fragments", [
    ("image,caption\na.png,red\n", ["a.png"], ["prompt", "caption"]),
    ("image,prompt\nmissing.png,red\n", [], ["missing.png"]),
    ("image,prompt\n", [], ["metadata.csv", "no rows"]),
    # Renaming the column would not make an image model train on videos: the message names the video trainer.
    ("video,prompt\nclip.mp4,red\n", [], ["lists videos", "QwenImagePipeline) trains on images",
                                          "examples/wanvideo/model_training/train.py"]),
])  # fmt: skip
def test_bad_datasets_fail_before_any_model_loads(tmp_path, monkeypatch, metadata, images, fragments):
    from diffsynth.core.loader import loading

    data = write_dataset(tmp_path / "data", metadata, images)
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        main(QwenImagePipeline, [*raw(data), *COMMON, "--output_path", str(tmp_path / "out")])
    assert all(fragment in str(error.value) for fragment in fragments), str(error.value)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_image_is_named(tmp_path):
    data = write_dataset(tmp_path / "data", "image,prompt\nbroken.png,red\n", [])
    (data / "broken.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="broken.png"):
        main(QwenImagePipeline, [*raw(data), *COMMON, "--output_path", str(tmp_path / "out")])


@pytest.mark.parametrize("argv, fragment", [
    (["--task", "sft:everything"], "invalid choice: 'sft:everything'"),
    (["--output_path", "FILE"], "is a file"),
    (["--enable_optimizer_cpu_offload"], "add --enable_model_cpu_offload"),
])  # fmt: skip
def test_bad_flags_exit_with_the_flag_named(dataset, tmp_path, capsys, argv, fragment):
    (tmp_path / "FILE").write_text("")
    argv = [str(tmp_path / "FILE") if item == "FILE" else item for item in argv]
    with pytest.raises(SystemExit):
        main(QwenImagePipeline, [*raw(dataset), *COMMON, *argv])
    assert fragment in capsys.readouterr().err


def stage_two_argv(cache, output, *extra):
    return ["--dataset_base_path", str(cache), *COMMON, "--output_path", str(output), "--task", "sft:train", *extra]


@pytest.fixture(scope="module")
def cache(dataset, tmp_path_factory, tiny_root):
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(folder), "--task", "sft:data_process"])
    reset_accelerate_state()
    return folder


def test_a_cache_made_for_other_units_is_refused(cache, tmp_path):
    from diffsynth.core.data import CacheError

    # Training the VAE too makes the image encoder a stage-2 unit, so this cache lacks what stage 2 would read.
    with pytest.raises(CacheError, match="stage_two_units") as error:
        main(QwenImagePipeline, stage_two_argv(cache, tmp_path / "out", "--trainable_models", "vae"))
    assert "sft:data_process" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_cache_made_for_another_model_is_refused(cache, tmp_path):
    import json
    import shutil

    from diffsynth.core.data import CacheError

    other = tmp_path / "other_cache"
    shutil.copytree(cache, other)
    info = json.loads((other / "cache_info.json").read_text())
    info["model_configs"]["dit"]["num_layers"] += 1
    (other / "cache_info.json").write_text(json.dumps(info))
    with pytest.raises(CacheError, match="model_configs"):
        main(QwenImagePipeline, stage_two_argv(other, tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="--dataset_base_path"):
        main(QwenImagePipeline, stage_two_argv(tmp_path / "nowhere", tmp_path / "out"))


def test_fp8_models_train_a_lora_on_an_fp8_transformer(dataset, tmp_path):
    from diffsynth.core.fp8 import Fp8Linear

    result = one_stage(dataset, tmp_path / "out", "--fp8_models", PATTERN["dit"], "--num_epochs", "1",
                       "--enable_model_cpu_offload")
    dit = result["module"].pipe.dit
    assert any(isinstance(layer, Fp8Linear) for layer in dit.modules())
    assert all(p.dtype == torch.float32 for n, p in dit.named_parameters() if ".lora_" in n)
    assert max(lora(tmp_path / "out", "epoch-0")[k].abs().max().item()
               for k in lora(tmp_path / "out", "epoch-0") if "lora_B" in k) > 1e-4
    with pytest.raises(FlagError, match="--fp8_models entries"):
        one_stage(dataset, tmp_path / "bad", "--fp8_models", "Qwen/Qwen-Image:nothing/*.safetensors")


@pytest.mark.parametrize("swap", [["--blocks_to_swap", "1"], ["--blocks_to_swap", "2"],
                                  ["--blocks_to_swap", "2", "--block_swap_h2d_only", "--block_swap_ring_size", "1"]])
def test_block_swap_gives_the_plain_lora(reference, dataset, tmp_path, swap):
    one_stage(dataset, tmp_path / "out", *swap)
    assert max_difference(lora(tmp_path / "out"), lora(reference[0])) < 1e-6


@pytest.mark.parametrize("swap", [["--blocks_to_swap", "2"], ["--blocks_to_swap", "2", "--block_swap_h2d_only"]])
def test_fp8_weights_combine_with_block_swap(dataset, tmp_path, swap):
    fp8 = ["--fp8_models", PATTERN["dit"], "--num_epochs", "1"]
    one_stage(dataset, tmp_path / "fp8", *fp8)
    one_stage(dataset, tmp_path / "fp8_swap", *fp8, *swap)
    assert max_difference(lora(tmp_path / "fp8", "epoch-0"), lora(tmp_path / "fp8_swap", "epoch-0")) < 1e-6


def test_a_run_without_lora_target_modules_trains_the_models_own_layers_and_resumes(dataset, tmp_path):
    # The reference's parser default, Wan's q,k,v,o,ffn.0,ffn.2, names no Qwen-Image layer.
    at = COMMON.index("--lora_target_modules")
    output = tmp_path / "out"
    argv = [*raw(dataset), *COMMON[:at], *COMMON[at + 2:], "--output_path", str(output), "--num_epochs", "1"]
    main(QwenImagePipeline, [*argv, "--max_train_steps", "2"])
    defaults = QwenImagePipeline.default_lora_target_modules
    # What trains is recorded as the layers it stood for, so a resume without the flag compares equal.
    assert json.loads((output / "training_args.json").read_text())["lora_target_modules"] == defaults
    recorded = json.loads((output / "checkpoints" / "step-2" / "progress.json").read_text())["flags"]
    assert recorded["lora_target_modules"] == sorted(defaults.split(","))
    reset_accelerate_state()
    assert main(QwenImagePipeline, [*argv, "--resume_from_checkpoint", "latest"])["global_step"] == 3
    layers = {key.split(".lora")[0] for key in lora(output, "epoch-0")}
    assert all(any(layer.endswith(f".{target}") for layer in layers) for target in defaults.split(",")), layers


def test_lora_targets_that_match_nothing_fail_before_the_weights_load(dataset, tmp_path, monkeypatch):
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--lora_target_modules", "q,k,ffn.0"]
    with pytest.raises(ValueError, match=r"--lora_target_modules entries \['q', 'k', 'ffn.0'\] match no module"):
        main(QwenImagePipeline, argv)


def test_lora_targets_the_original_code_cannot_name_fail_before_the_weights_load(dataset, tmp_path, monkeypatch):
    from diffsynth.core.loader import loading
    from diffsynth.lora import naming

    # A model whose original code names only the attention projections: a LoRA on its MLP could not be loaded by
    # ComfyUI or DiffSynth-Studio, so the run is refused before minutes of loading.
    partial = naming.ModuleNaming("original partial", block_layers={"attn.to_q": "attn.q"})
    from diffsynth.pipelines.qwen_image import naming as qwen_naming

    monkeypatch.setattr(qwen_naming, "NAMING", partial)
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"entries \[.*'img_mlp.net.2'.*\] select layers of dit that the original "
                                         "partial code has no name for"):
        main(QwenImagePipeline, argv)


def test_a_stage_one_cache_from_fp8_encoders_is_within_the_fp8_error(dataset, tmp_path):
    """fp8 text encoder (Linear layers) and VAE (convolutions): each weight is off by about 2.5%; through the tiny
    random-weight models that measures about 1% on the prompt embeddings and 3-5% on the latents (float32 and bf16)."""
    encoders = f"{PATTERN['text_encoder']},{PATTERN['vae']}"
    caches = {}
    for name, extra in (("plain", []), ("fp8", ["--fp8_models", encoders])):
        main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / name), "--task",
                                 "sft:data_process", "--offload_models", PATTERN["dit"], *extra])
        caches[name] = {path.name: load_file(str(path)) for path in sorted((tmp_path / name / "0").iterdir())}
    bounds = {"posi/prompt_emb": 0.02, "shared/input_latents": 0.08}
    for sample, plain in caches["plain"].items():
        for key, bound in bounds.items():
            exact, fp8 = plain[key].float(), caches["fp8"][sample][key].float()
            error = ((fp8 - exact).norm() / exact.norm()).item()
            assert 0 < error < bound, (sample, key, error)


def test_a_customized_optimizer_trains_with_optimizer_offload_and_resumes(dataset, tmp_path):
    from safetensors import safe_open

    flags = ["--customized_optimizer", "torch.optim.RMSprop", "--num_epochs", "1",
             *OFFLOAD_MODES["optimizer_offload"]]
    one_stage(dataset, tmp_path / "whole", *flags)
    one_stage(dataset, tmp_path / "resumed", *flags, "--max_train_steps", "3")
    with safe_open(str(tmp_path / "resumed" / "checkpoints" / "step-3" / "state.safetensors"), "pt") as state:
        assert any("square_avg" in key for key in state.keys())  # RMSprop's state, not AdamW's exp_avg
    resumed = one_stage(dataset, tmp_path / "resumed", *flags, "--resume_from_checkpoint", "latest")
    assert resumed["global_step"] == 6
    assert max_difference(lora(tmp_path / "whole", "epoch-0"), lora(tmp_path / "resumed", "epoch-0")) < 1e-6
    with pytest.raises(FlagError, match="--customized_optimizer torch.optim.Adagrad: the checkpoint .* was trained "
                                        "with --customized_optimizer torch.optim.RMSprop"):
        one_stage(dataset, tmp_path / "resumed", *flags[:1], "torch.optim.Adagrad", *flags[2:],
                  "--resume_from_checkpoint", "latest")


@pytest.mark.parametrize("settings", [(0, "cpu", 2, 1.0), (7, "cpu", 3, 2.5)], ids=["2-steps", "3-steps-cfg"])
def test_direct_distill_runs_each_samples_sampler_as_inference_does(tmp_path, settings):
    """The first step's loss (the LoRA still does nothing) is the distance between the clean latents and what
    inference with the row's seed, steps and guidance produces: each row's values are used, typed from the CSV."""
    from diffsynth.core import ModelConfig
    from diffsynth.core.data import UnifiedDataset
    from tests.examples.test_qwen_reference_scripts import write_distill_dataset

    metadata = write_distill_dataset(tmp_path / "data", [settings])
    result = main(QwenImagePipeline, [
        *raw(tmp_path / "data"), *COMMON, "--output_path", str(tmp_path / "out"), "--task", "direct_distill",
        "--extra_inputs", "seed,rand_device,num_inference_steps,cfg_scale", "--height", "32", "--width", "32",
    ])  # fmt: skip
    pipe = QwenImagePipeline.from_pretrained(
        torch_dtype=torch.float32, model_configs=[ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=p)
                                                  for p in ("transformer/*.safetensors", "text_encoder/*.safetensors",
                                                            "vae/*.safetensors")])
    sample = UnifiedDataset(metadata.parent, metadata, height=32, width=32)[0]
    clean = pipe.run_units(*pipe.training_inputs(sample))[0]["input_latents"]
    pipe.decode = lambda shared, posi, nega: shared["latents"]  # inference's latents, before the VAE
    seed, rand_device, steps, cfg_scale = settings
    sampled = pipe(sample["prompt"], seed=seed, rand_device=rand_device, num_inference_steps=steps,
                   cfg_scale=cfg_scale, height=32, width=32, output_type="pt", progress_bar=False)
    expected = torch.nn.functional.mse_loss(sampled, clean).item()
    assert result["losses"][0] == pytest.approx(expected, rel=1e-5)


def test_two_stage_direct_distill_gives_the_one_stage_lora(tmp_path):
    from tests.examples.test_qwen_reference_scripts import write_distill_dataset

    write_distill_dataset(tmp_path / "data", [(0, "cpu", 2, 1.0), (7, "cpu", 2, 2.5)])
    distill = ["--extra_inputs", "seed,rand_device,num_inference_steps,cfg_scale", "--height", "32", "--width", "32"]
    main(QwenImagePipeline, [*raw(tmp_path / "data"), *COMMON, *distill, "--output_path", str(tmp_path / "one"),
                             "--task", "direct_distill"])
    main(QwenImagePipeline, [*raw(tmp_path / "data"), *COMMON, *distill, "--output_path", str(tmp_path / "cache"),
                             "--task", "direct_distill:data_process", "--offload_models", PATTERN["dit"]])
    main(QwenImagePipeline, ["--dataset_base_path", str(tmp_path / "cache"), *COMMON, "--output_path",
                             str(tmp_path / "two"), "--task", "direct_distill:train", "--offload_models",
                             f"{PATTERN['text_encoder']},{PATTERN['vae']}"])
    assert max_difference(lora(tmp_path / "one", "epoch-0"), lora(tmp_path / "two", "epoch-0")) < 1e-6


def test_a_weights_file_as_resume_from_checkpoint_starts_from_its_weights(dataset, tmp_path):
    """The reference's meaning: a full fine-tune's weights file to train on, beside this trainer's state folders."""
    full = main(QwenImagePipeline, [
        *raw(dataset), "--model_id_with_origin_paths", ALL_MODELS, "--trainable_models", "dit", "--torch_dtype",
        "float32", "--seed", "3", "--max_pixels", "4096", "--learning_rate", "1e-2", "--output_path",
        str(tmp_path / "full"),
    ])  # fmt: skip
    trained = full["module"].pipe.dit.state_dict()
    weights = tmp_path / "full" / "epoch-0.safetensors"
    assert set(load_file(str(weights))) == set(trained)  # the names written for a full fine-tune
    result = one_stage(dataset, tmp_path / "lora", "--resume_from_checkpoint", str(weights), "--num_epochs", "1")
    base = {name: value for name, value in result["module"].pipe.dit.state_dict().items() if ".lora_" not in name}
    assert max_difference({name.replace(".base_layer", ""): value for name, value in base.items()}, trained) == 0
    assert not (tmp_path / "lora" / "checkpoints" / "step-0").exists() and result["global_step"] == 6
    with pytest.raises(FlagError, match="holds LoRA weights; continue a LoRA from it with --lora_checkpoint"):
        one_stage(dataset, tmp_path / "lora2", "--resume_from_checkpoint",
                  str(tmp_path / "lora" / "epoch-0.safetensors"))
    with pytest.raises(FlagError, match=r"loads into controlnet \(--remove_prefix_in_ckpt pipe.controlnet.\), "
                                        "which is not loaded"):
        one_stage(dataset, tmp_path / "x", "--remove_prefix_in_ckpt", "pipe.controlnet.", "--resume_from_checkpoint",
                  str(weights))
