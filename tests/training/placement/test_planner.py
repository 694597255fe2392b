"""The memory planner from the trainer's flags: choice within budgets, explicit flags, the CLI, refusals."""

import dataclasses
import math
import re

import pytest

from diffsynth.core.loader import resolve
from diffsynth.core.planning.plans import NoPlanFits, Plan, predict
from diffsynth.core.planning.profiles import GIB, DeviceProfile
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.plan import main as plan_main
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, WAN_MODEL_ID, WAN_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.parsers import parse_args
from diffsynth.pipelines.registry import released_architecture
from diffsynth.training.config.placement import PlacementConfig
from diffsynth.training.placement.planner import (
    apply_plan,
    build_architecture,
    build_workload,
    denoiser_skeleton,
    explicit_plan,
    plan_workload,
    repo_files_missing,
)
from tests.docs.test_readme import README, training_commands

QWEN = f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS['dit']}"
TEXT_ENCODER = f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS['text_encoder']}"
COMMAND = ["--model_id_with_origin_paths", QWEN, "--lora_base_model", "dit", "--lora_target_modules", "to_q,to_k",
           "--dataset_metadata_path", "unused.csv", "--height", "64", "--width", "64"]
PROFILE = DeviceProfile("test", 1 << 30, 10.0, 1.0, "a made-up device")


@pytest.fixture
def qwen_workload(base):
    args = parse_args(COMMAND + ["--task", "sft"])
    model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
    return build_workload(model, args, others, QwenImagePipeline.lora_target_aliases)


def test_unbounded_budgets_choose_the_fastest_plan_and_a_tight_one_a_plan_that_fits(qwen_workload):
    placement = PlacementConfig()
    report = plan_workload(qwen_workload, placement, PROFILE, math.inf, math.inf)
    assert report.chosen.plan == Plan("off", "device")  # nothing moves and nothing is recomputed
    everything = report.chosen.device_bytes
    tight = plan_workload(qwen_workload, placement, PROFILE, everything - 1, math.inf)
    assert tight.chosen.device_bytes <= everything - 1 and tight.chosen.plan != report.chosen.plan
    assert tight.chosen.step_seconds >= report.chosen.step_seconds


def test_no_plan_fits_names_the_smallest_budget_that_would(qwen_workload):
    with pytest.raises(NoPlanFits, match="raise --vram_budget to at least") as error:
        plan_workload(qwen_workload, PlacementConfig(), PROFILE, 1024, math.inf)
    least = float(re.search(r"at least (\d+\.\d)", str(error.value)).group(1))
    # That budget (rounded up to the printed tenth) fits some plan.
    assert plan_workload(qwen_workload, PlacementConfig(), PROFILE, (least + 0.1) * GIB, math.inf).chosen


def test_explicit_placement_flags_are_predicted_not_replaced(qwen_workload):
    placement = PlacementConfig(use_gradient_checkpointing=True, blocks_to_swap=1)
    report = plan_workload(qwen_workload, placement, PROFILE, 1024, math.inf)  # far over budget: still predicted
    assert report.explicit and report.chosen.plan == Plan("on", "classic", 1, pinned=False)
    assert not report.chosen.fits(1024, math.inf)


@pytest.mark.parametrize("plan", [Plan("on", "h2d", 2, ring_size=1), Plan("off", "classic", 1, pinned=False),
                                  Plan("offload", "offload", prefetch_depth=2), Plan("on", "device")])
def test_a_plan_applied_to_the_placement_gives_valid_flags_that_name_it_again(plan):
    placement = apply_plan(PlacementConfig(vram_budget="24"), plan)
    assert placement.vram_budget == "24"
    args = parse_args(COMMAND + plan.flags())
    assert args.placement == dataclasses.replace(placement, vram_budget=None)
    if plan.policy != "device":
        assert explicit_plan(placement) == plan


def test_predictions_add_up_and_moving_policies_need_less_device_memory(qwen_workload):
    device = predict(Plan("on", "device"), qwen_workload, PROFILE)
    offload = predict(Plan("on", "offload"), qwen_workload, PROFILE)
    assert device.allocated_bytes == sum(v for k, v in device.parts.items() if k != "CUDA context + slack")
    assert device.parts["weights"] + device.parts["trained weights"] == qwen_workload.model_bytes
    # AdamW keeps two moments in the trained weights' dtype, and every gradient exists until the step.
    assert device.parts["gradients"] == device.parts["trained weights"] == qwen_workload.trainable_bytes
    assert device.parts["optimizer state"] == 2 * qwen_workload.trainable_bytes
    assert offload.parts["weights"] == 0 and 0 < offload.parts["moving weights"] < qwen_workload.model_bytes
    assert offload.allocated_bytes < device.allocated_bytes and offload.host_bytes > device.host_bytes


def test_one_stage_training_counts_the_other_models_and_training_from_a_cache_does_not(base):
    one_stage = parse_args(COMMAND[:1] + [f"{QWEN},{TEXT_ENCODER}"] + COMMAND[2:])
    _, others, _ = denoiser_skeleton(one_stage, QwenImagePipeline)
    assert others and sum(others) > 0
    cached = parse_args(["--model_id_with_origin_paths", f"{QWEN},{TEXT_ENCODER}", "--lora_base_model", "dit",
                         "--lora_target_modules", "to_q", "--task", "sft:train", "--dataset_base_path", "cache"])
    assert denoiser_skeleton(cached, QwenImagePipeline)[1] == []


def test_the_released_architectures_have_their_published_sizes():
    import torch

    sizes = {name: sum(p.numel() for p in build_architecture(name, torch.bfloat16).parameters()) / 1e9
             for name in ("qwen-image", "wan2.1-t2v-14b", "wan2.1-t2v-1.3b", "z-image", "flux.2-klein-4b",
                          "flux.2-klein-9b")}
    assert sizes["qwen-image"] == pytest.approx(20.4, abs=0.1)
    assert sizes["z-image"] == pytest.approx(6.15, abs=0.05)
    assert sizes["flux.2-klein-4b"] == pytest.approx(3.9, abs=0.1)
    assert sizes["flux.2-klein-9b"] == pytest.approx(9.1, abs=0.1)
    assert sizes["wan2.1-t2v-14b"] == pytest.approx(14.3, abs=0.1)
    assert sizes["wan2.1-t2v-1.3b"] == pytest.approx(1.4, abs=0.1)


# ---- the command line ----------------------------------------------------------------------------------------------

def test_plan_cli_prints_the_table_and_the_chosen_flags(base, capsys):
    assert plan_main(COMMAND + ["--device_profile", "rtx4090-24gb"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("QwenImageTransformer2DModel at 64x64x1")  # the files on disk, not a release
    assert "| checkpointing | placement |" in out and "rtx4090-24gb" in out
    assert "chosen: all on the GPU, checkpointing off" in out


@pytest.fixture
def no_models(tmp_path, monkeypatch):
    """An empty model folder, and a planner that fails the test if it tries to download."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path / "models"))
    for downloader in ("download_from_modelscope", "download_from_huggingface"):
        monkeypatch.setattr(resolve, downloader, lambda *a, **k: pytest.fail("the planner downloaded"))
    monkeypatch.setattr(resolve, "unreachable_reason", lambda *a: pytest.fail("the planner reached for a hub"))
    return tmp_path / "models"


@pytest.mark.slow  # a dry run of the 20B denoiser's every placement at 1024x1024
def test_plan_cli_plans_the_readme_command_without_its_files(no_models, capsys):
    # The README's planner line, "python -m diffsynth.plan <before> <the same flags> <after>", with the flags of its
    # budget command.
    line = re.search(r"`python -m diffsynth\.plan (.*) <the same flags> (.*?)`", README.read_text()).groups()
    flags = training_commands()[1][-1]
    assert flags[-2:] == ["--vram_budget", "auto"]
    assert plan_main([*line[0].split(), *flags, *line[1].split()]) == 0
    first, second, *rest = capsys.readouterr().out.splitlines()
    assert first == (f"the files of Qwen/Qwen-Image are not on disk (under {no_models / 'Qwen/Qwen-Image'}): planned "
                     "from the released qwen-image config, the denoiser alone (as when training from a stage-1 cache)")
    assert second.startswith("qwen-image at 1024x1024x1, ")
    assert "| checkpointing | placement |" in rest[1] and rest[-1].startswith("chosen: ")
    assert not no_models.exists()


def test_plan_cli_reads_model_files_on_disk_without_downloading_what_they_lack(base, no_models, capsys):
    import shutil

    # The transformer's weights without its config.json: the trainer would download the config, the planner does not.
    folder = no_models / QWEN_IMAGE_MODEL_ID / "transformer"
    folder.mkdir(parents=True)
    for weights in (base / QWEN_IMAGE_MODEL_ID / "transformer").glob("*.safetensors"):
        shutil.copy(weights, folder)
    assert plan_main(COMMAND + ["--device_profile", "rtx4090-24gb"]) == 2
    assert capsys.readouterr().err.startswith("error: the memory planner found no denoiser")


WAN_SMALL = ["--pipeline", "wan", "--lora_base_model", "dit", "--lora_target_modules", "q,k", "--height", "32",
             "--width", "32", "--num_frames", "5", "--device_profile", "rtx4080-16gb"]


def test_plan_cli_plans_the_release_its_model_ids_name_when_the_files_are_not_on_disk(no_models, capsys):
    ids = "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth"
    assert plan_main(["--model_id_with_origin_paths", ids, *WAN_SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "planned from the released wan2.1-t2v-1.3b config" in out[0]
    assert out[1].startswith("wan2.1-t2v-1.3b at 32x32x5") and out[-1].startswith("chosen: ")
    assert not no_models.exists()


def test_plan_cli_refuses_unknown_model_ids_without_files_in_one_line(no_models, capsys):
    ids = "Wan-AI/Wan2.2-TI2V-5B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.1-T2V-1.3B:Wan2.1_VAE.pth"
    assert plan_main(["--model_id_with_origin_paths", ids, *WAN_SMALL]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("error: --model_id_with_origin_paths: the files of Wan-AI/Wan2.2-TI2V-5B, "
                                   "Wan-AI/Wan2.1-T2V-1.3B are not on disk")
    assert "pass --architecture with one of wan2.1-flf2v-14b, " in captured.err
    assert "wan2.1-t2v-1.3b, wan2.1-t2v-14b, wan2.1-vace-1.3b" in captured.err


def test_plan_cli_refuses_a_release_of_another_family_named_by_the_model_ids(no_models, capsys):
    ids = "Wan-AI/Wan2.1-T2V-1.3B:diffusion_pytorch_model*.safetensors"
    assert plan_main(["--model_id_with_origin_paths", ids, "--lora_base_model", "dit", "--lora_target_modules", "q",
                      "--device_profile", "rtx4080-16gb"]) == 2  # for --pipeline qwen-image, the default
    assert capsys.readouterr().err == ("error: --model_id_with_origin_paths names the release wan2.1-t2v-1.3b, which "
                                       "is not a qwen-image model; for --pipeline qwen-image choose one of qwen-image, "
                                       "or pass the --pipeline of wan2.1-t2v-1.3b\n")


@pytest.mark.parametrize("ids, architecture", [
    (["Qwen/Qwen-Image-2512", "Qwen/Qwen-Image"], "qwen-image"),
    (["Qwen/Qwen-Image-Edit-2509"], "qwen-image"),
    (["Wan-AI/Wan2.1-T2V-14B"], "wan2.1-t2v-14b"),
    (["wan-ai/wan2.1-t2v-1.3b"], "wan2.1-t2v-1.3b"),  # ids are matched ignoring case
    (["Tongyi-MAI/Z-Image", "Tongyi-MAI/Z-Image-Turbo"], "z-image"),
    (["black-forest-labs/FLUX.2-klein-base-9B", "black-forest-labs/FLUX.2-klein-9B"], "flux.2-klein-9b"),
    (["black-forest-labs/FLUX.2-klein-4B"], "flux.2-klein-4b"),
    (["black-forest-labs/FLUX.1-Kontext-dev", "black-forest-labs/FLUX.1-dev"], "flux.1-dev"),
    (["black-forest-labs/FLUX.1-Krea-dev"], "flux.1-dev"),
    (["Tongyi-MAI/Z-Image-Omni-Base"], None),  # its transformer takes SigLIP features: no released entry
    (["Wan-AI/Wan2.2-TI2V-5B", "Wan-AI/Wan2.1-T2V-1.3B"], None),  # one id unknown
    (["Qwen/Qwen-Image", "Wan-AI/Wan2.1-T2V-14B"], None),  # two denoisers
])
def test_model_ids_name_their_released_architecture(ids, architecture):
    assert released_architecture(ids) == architecture


def test_missing_repo_files_are_found_without_downloading(base, no_models):
    args = parse_args(COMMAND[:1] + [f"{QWEN},{TEXT_ENCODER}"] + COMMAND[2:])
    assert [config.model_id for config in repo_files_missing(args.model)] == [QWEN_IMAGE_MODEL_ID] * 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(resolve.BASE_PATH_ENV, str(base))  # the tiny repos
        assert repo_files_missing(args.model) == []


def test_plan_cli_for_wan_video_and_a_budget_nothing_fits(base, capsys):
    wan = ["--pipeline", "wan", "--model_id_with_origin_paths", f"{WAN_MODEL_ID}:{WAN_PATTERNS['dit']}",
           "--lora_base_model", "dit", "--lora_target_modules", "q,k", "--height", "32", "--width", "32",
           "--num_frames", "5", "--device_profile", "rtx4080-16gb"]
    assert plan_main(wan) == 0
    assert plan_main(wan + ["--vram_budget", "0.000001"]) == 1
    assert "no placement fits" in capsys.readouterr().out


@pytest.mark.slow  # a dry run of a 6B / 9B denoiser's every placement
@pytest.mark.parametrize("pipeline, architecture, flags", [
    ("z-image", "z-image", ["--lora_base_model", "dit", "--lora_target_modules", "to_q,to_k,to_v,to_out.0,w1,w2,w3"]),
    ("flux2-klein", "flux.2-klein-9b", ["--trainable_models", "dit"]),
])
def test_plan_cli_plans_the_released_z_image_and_flux2_denoisers(capsys, pipeline, architecture, flags):
    assert plan_main(["--pipeline", pipeline, "--architecture", architecture, *flags, "--height", "256", "--width",
                      "256", "--use_gradient_checkpointing", "--device_profile", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{architecture} at 256x256x1") and "chosen: " in out


def test_plan_cli_refuses_an_architecture_of_another_family(capsys):
    assert plan_main(["--pipeline", "qwen-image", "--architecture", "flux.2-klein-4b", "--trainable_models", "dit",
                      "--device_profile", "h100-80gb"]) == 2
    assert capsys.readouterr().err == ("error: --architecture flux.2-klein-4b is not a qwen-image model; for "
                                       "--pipeline qwen-image choose one of qwen-image, or pass the --pipeline of "
                                       "flux.2-klein-4b\n")


def test_plan_cli_refuses_bad_flags_by_name(capsys):
    assert plan_main(COMMAND + ["--device_profile", "rtx4090-24gb", "--vram_budget", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --vram_budget lots must be a positive size in GB") and len(err.splitlines()) == 1
    with pytest.raises(FlagError, match="--vram_budget lots"):  # --debug: the exception, for its traceback
        plan_main(COMMAND + ["--device_profile", "rtx4090-24gb", "--vram_budget", "lots", "--debug"])


# ---- the trainer -----------------------------------------------------------------------------------------------------

def test_the_trainer_refuses_an_auto_budget_without_cuda_before_loading(base, tmp_path, fresh_accelerate_state,
                                                                       monkeypatch):
    from diffsynth.training import entry as trainer
    from diffsynth.training.startup import dataset as startup_dataset

    monkeypatch.setattr(trainer, "load_pipeline", lambda *a, **k: pytest.fail("models loaded before the refusal"))
    monkeypatch.setattr(startup_dataset, "build_raw_dataset",
                        lambda *a, **k: pytest.fail("dataset read before the refusal"))
    with pytest.raises(FlagError, match=r"--vram_budget auto measures the CUDA device.*--vram_budget 24"):
        trainer.main(QwenImagePipeline, COMMAND + ["--vram_budget", "auto", "--output_path", str(tmp_path)])


TRAIN = ["--model_id_with_origin_paths", ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}"
                                                  for name in ("dit", "text_encoder", "vae")),
         "--lora_base_model", "dit", "--lora_target_modules", "to_q,to_k,to_v,to_out.0", "--lora_rank", "4",
         "--learning_rate", "1e-3", "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "4096",
         "--use_gradient_checkpointing", "--num_epochs", "1"]


def test_the_trainer_trains_with_the_plan_chosen_for_its_budget(base, tmp_path, fresh_accelerate_state, caplog,
                                                                monkeypatch):
    import torch
    from safetensors.torch import load_file

    from diffsynth.core.data.example_dataset import build_example_dataset
    from diffsynth.core.planning.profiles import measure_device
    from diffsynth.training.entry import main
    from diffsynth.training.loop import training_loop
    from tests.conftest import reset_accelerate_state

    build_example_dataset(tmp_path / "data", num_images=2)
    data = ["--dataset_base_path", str(tmp_path / "data"), "--dataset_metadata_path",
            str(tmp_path / "data" / "metadata.csv")]
    args = parse_args(data + TRAIN)
    model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
    workload = build_workload(model, args, others, QwenImagePipeline.lora_target_aliases)
    everything = predict(Plan("on", "device"), workload, measure_device(torch.device("cpu"))).device_bytes
    main(QwenImagePipeline, data + TRAIN + ["--output_path", str(tmp_path / "plain")])
    reset_accelerate_state()
    placements = []
    place_models = training_loop.place_models
    monkeypatch.setattr(training_loop, "place_models", lambda module, device, placement: placements.append(placement)
                        or place_models(module, device, placement))
    with caplog.at_level("INFO", logger="diffsynth.training.placement.planner"):
        main(QwenImagePipeline, data + TRAIN + ["--output_path", str(tmp_path / "planned"),
                                                "--vram_budget", f"{(everything - 1) / GIB:.12f}"])
    chosen = [r.message for r in caplog.records if r.message.startswith("planner: ")]
    assert chosen and "all on the GPU" not in chosen[0], chosen
    # The runner placed the models as planned: the weights stream from host memory.
    assert placements and all(placement.weights_on_host for placement in placements)
    plain, planned = (load_file(str(tmp_path / name / "epoch-0.safetensors")) for name in ("plain", "planned"))
    assert plain.keys() == planned.keys()
    assert max((plain[key] - planned[key]).abs().max().item() for key in plain) < 1e-6


def test_wan_inputs_follow_the_frame_count(base):
    args = parse_args(["--model_id_with_origin_paths", f"{WAN_MODEL_ID}:{WAN_PATTERNS['dit']}", "--lora_base_model",
                       "dit", "--lora_target_modules", "q", "--dataset_metadata_path", "m.csv", "--height", "32",
                       "--width", "32", "--num_frames", "9"], video=True)
    model = denoiser_skeleton(args, WanVideoPipeline)[0]
    workload = build_workload(model, args, (), WanVideoPipeline.lora_target_aliases)
    short = build_workload(denoiser_skeleton(args, WanVideoPipeline)[0],
                           parse_args(["--model_id_with_origin_paths", f"{WAN_MODEL_ID}:{WAN_PATTERNS['dit']}",
                                       "--lora_base_model", "dit", "--lora_target_modules", "q",
                                       "--dataset_metadata_path", "m.csv", "--height", "32", "--width", "32",
                                       "--num_frames", "5"], video=True), (), WanVideoPipeline.lora_target_aliases)
    # 9 frames are 3 latent frames, 5 are 2: half again as many tokens, so more saved and more FLOPs.
    assert workload.footprint(False).saved_bytes > short.footprint(False).saved_bytes
    assert workload.footprint(False).flops > short.footprint(False).flops


def test_fp8_models_halve_the_frozen_linear_weights_the_plan_holds_and_moves(base):
    plain_args = parse_args(COMMAND)
    fp8_args = parse_args(COMMAND + ["--fp8_models", QWEN])
    model, others, fp8 = denoiser_skeleton(fp8_args, QwenImagePipeline)
    assert fp8 and not denoiser_skeleton(plain_args, QwenImagePipeline)[2]
    stored = build_workload(model, fp8_args, others, QwenImagePipeline.lora_target_aliases, fp8=True)
    full = build_workload(denoiser_skeleton(plain_args, QwenImagePipeline)[0], plain_args, (),
                          QwenImagePipeline.lora_target_aliases)
    assert stored.trainable_bytes == full.trainable_bytes  # the LoRA stays float32
    assert stored.model_bytes < 0.75 * full.model_bytes
    plan = Plan("on", "offload")
    assert predict(plan, stored, PROFILE).parts["moving weights"] < predict(plan, full, PROFILE).parts["moving weights"]


def test_a_batch_saves_and_computes_more_per_step(base):
    single = parse_args(COMMAND)
    model = denoiser_skeleton(single, QwenImagePipeline)[0]
    one = build_workload(model, single, (), QwenImagePipeline.lora_target_aliases).footprint(False)
    batched = parse_args(COMMAND + ["--batch_size", "3"])
    three = build_workload(denoiser_skeleton(batched, QwenImagePipeline)[0], batched, (),
                           QwenImagePipeline.lora_target_aliases).footprint(False)
    # Activations grow with the batch (weights saved for backward do not); the work grows in proportion.
    assert three.saved_bytes > 2 * one.saved_bytes
    assert three.flops == pytest.approx(3 * one.flops, rel=0.05)


# ---- several processes on one machine ------------------------------------------------------------------------------

def frozen_bytes(module, prefix=""):
    """The frozen parameters under ``prefix``, each at the 64-byte aligned size the shared copy lays it out at."""
    return sum(-(-p.numel() * p.element_size() // 64) * 64 for name, p in module.named_parameters()
               if not p.requires_grad and name.startswith(prefix))


@pytest.mark.parametrize("plan", [Plan("on", "offload"), Plan("on", "classic", 1), Plan("on", "h2d", 2, ring_size=1)],
                         ids=["offload", "classic", "h2d"])
def test_processes_sharing_host_weights_hold_the_frozen_masters_once(base, plan):
    args = parse_args(COMMAND + ["--task", "sft"])
    workloads = {}
    for key, processes, sharing in (("one", 1, "auto"), ("four", 4, "auto"), ("four off", 4, "off")):
        model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
        workloads[key] = build_workload(model, parse_args(COMMAND + ["--shared_host_weights", sharing]), others,
                                        QwenImagePipeline.lora_target_aliases, local_processes=processes)
    one, four, apart = (predict(plan, workloads[key], PROFILE) for key in ("one", "four", "four off"))
    # Without sharing the machine holds four of everything; with it, the frozen masters of the policy once.
    assert apart.host_bytes == 4 * one.host_bytes and one.shared_host_bytes == apart.shared_host_bytes == 0
    dit = workloads["four"].model
    held = {"offload": frozen_bytes(dit), "classic": frozen_bytes(dit, "transformer_blocks.1."),
            "h2d": frozen_bytes(dit, "transformer_blocks.0.") + frozen_bytes(dit, "transformer_blocks.1.")}[plan.policy]
    if plan.policy == "offload":  # the text encoder and VAE the stage runs are offloaded and shared too
        held += sum(-(-size // 64) * 64 for size in workloads["four"].other_model_sizes)
    assert four.shared_host_bytes == held
    assert four.host_bytes < apart.host_bytes and (four.host_bytes - four.shared_host_bytes) % 4 == 0
    assert four.device_bytes == apart.device_bytes and four.step_seconds == apart.step_seconds


def test_the_device_plan_shares_nothing_and_plans_each_process(base):
    args = parse_args(COMMAND + ["--task", "sft"])
    model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
    four = predict(Plan("on", "device"), build_workload(model, args, others, QwenImagePipeline.lora_target_aliases,
                                                        local_processes=4), PROFILE)
    model, others, _ = denoiser_skeleton(args, QwenImagePipeline)
    one = predict(Plan("on", "device"), build_workload(model, args, others, QwenImagePipeline.lora_target_aliases),
                  PROFILE)
    assert four.shared_host_bytes == 0 and four.host_bytes == 4 * one.host_bytes


def test_plan_cli_plans_the_host_memory_of_every_process_on_the_machine(base, capsys):
    flags = COMMAND + ["--device_profile", "rtx4090-24gb", "--enable_model_cpu_offload"]

    def host_gib(extra):
        assert plan_main(flags + extra) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if "model offload" in line)
        return float(row.split("|")[4])

    one, shared, apart = host_gib([]), host_gib(["--processes_per_machine", "8"]), host_gib(
        ["--processes_per_machine", "8", "--shared_host_weights", "off"])
    # The tiny model's weights vanish in the table's rounding; the copy shared or not is checked in bytes above.
    assert apart == pytest.approx(8 * one, abs=0.1) and one < shared <= apart
    assert plan_main(flags + ["--processes_per_machine", "0"]) == 2
    assert "--processes_per_machine 0 must be at least 1" in capsys.readouterr().err
