"""The family test kit, the planner's part (``test_family_kit.py`` has the rest): for every registered family, the
planner's table of its tiny files and of each kind of release without its files."""

import pytest

from diffsynth.plan import main as plan_main


@pytest.mark.slow  # a dry run of the tiny denoiser: seconds each
def test_the_planner_plans_the_tiny_files(spec, tiny, tiny_root, monkeypatch, capsys):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    frames = ["--num_frames", "5"] if spec.video else []
    assert plan_main(["--pipeline", spec.plan_name, "--model_id_with_origin_paths", tiny.model_flag,
                      "--lora_base_model", tiny.denoiser, "--lora_target_modules", tiny.lora_targets, "--height", "32",
                      "--width", "32", *frames, *tiny.train_flags, "--device_profile", "rtx4090-24gb"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{spec.denoiser_class} at 32x32x{5 if spec.video else 1}"), out[0]
    assert out[-1].startswith("chosen: ")


def first_of_each_class(releases):
    """The first release of each denoiser class: the dry run's blocks and inputs are the class's. (A dry run of a
    released denoiser takes seconds; the other releases' configs and inputs are their family's own tests'.)"""
    classes = {}
    for release in releases:
        classes.setdefault(release.denoiser_class, release)
    return list(classes.values())


@pytest.mark.slow  # a shallow dry run of each kind of released denoiser
def test_the_planner_plans_each_kind_of_release_without_its_files(spec, tiny, tmp_path, monkeypatch, capsys):
    from diffsynth.core.loader import resolve
    from diffsynth.pipelines.registry import released_architecture

    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path / "models"))
    frames = ["--num_frames", "5"] if spec.video else []
    for release in spec.releases:
        assert released_architecture([release.model_ids[0].rstrip("*")]) == release.architecture
    for release in first_of_each_class(spec.releases):
        model_id = release.model_ids[0].rstrip("*")
        assert plan_main(["--pipeline", spec.plan_name, "--model_id_with_origin_paths",
                          f"{model_id}:{tiny.diffusers_denoiser}/*.safetensors", "--trainable_models", tiny.denoiser,
                          "--height", "128",
                          "--width", "128", *frames, "--use_gradient_checkpointing", "--customized_optimizer",
                          "bitsandbytes.optim.AdamW8bit", "--device_profile", "h200-141gb"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert f"planned from the released {release.architecture} config" in out[0]
        assert out[1].startswith(f"{release.architecture} at 128x128x{5 if frames else 1}")
        assert out[-1].startswith("chosen: ") and not (tmp_path / "models").exists()
