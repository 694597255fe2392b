"""What the family kit and the per-family pipeline tests share: our pipeline and diffusers' own on a family's tiny repo,
rendered the same way and compared."""

from __future__ import annotations

import pytest
import torch

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.registry import family
from diffsynth.testing.families import TinyFamily, tiny_family
from diffsynth.training import entry
from diffsynth.training.config.parsers import HELP_HINT

PROMPT = "a red cube on a blue table"
STEPS = 3


def model_configs(entries) -> list[ModelConfig]:
    """``ModelConfig`` of each ``"model_id:pattern"`` entry."""
    return [ModelConfig(model_id=entry.split(":", 1)[0], origin_file_pattern=entry.split(":", 1)[1])
            for entry in entries]


def load_ours(tiny_root, tiny: TinyFamily | str, entries=None):
    """The family's pipeline (a ``TinyFamily`` row or a family name) on the tiny repos (float32, CPU), with the
    models of ``entries`` (``"model_id:pattern"``; by default every model of the family's row)."""
    tiny = tiny_family(tiny) if isinstance(tiny, str) else tiny
    entries = list(tiny.models.values()) if entries is None else entries
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return family(tiny.name).pipeline_class().from_pretrained(torch.float32, "cpu", model_configs(entries))


def load_theirs(tiny_root, reference_class, model_id: str):
    """Diffusers' ``reference_class`` on the tiny repo ``model_id``, float32, without a progress bar."""
    pipe = reference_class.from_pretrained(str(tiny_root / model_id), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def render_ours(pipe, seed=7, prompt=PROMPT, **kwargs):
    return pipe(prompt, seed=seed, num_inference_steps=kwargs.pop("num_inference_steps", STEPS), output_type="pt",
                progress_bar=False, **kwargs)


def render_theirs(pipe, seed=7, prompt=PROMPT, output="images", **kwargs):
    return getattr(pipe(prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type="pt",
                        num_inference_steps=kwargs.pop("num_inference_steps", STEPS), **kwargs), output)


def assert_same_output(ours, reference, render_other, shape=None, tolerance=1e-4):
    """Our output equals diffusers' within ``tolerance``, and the check has teeth: ``render_other()`` (another seed)
    moves it far beyond."""
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    if shape is not None:
        assert tuple(ours.shape) == shape
    assert (ours - reference).abs().max() < tolerance
    assert (render_other() - reference).abs().max() > 1e-2


def refused_before_loading(pipeline_class, argv, workdir, capsys, video=False) -> str:
    """Runs the trainer on ``argv`` (``--output_path out`` added), expects it to stop with exit status 2 before
    loading anything, after one problem line and the parser's hint; returns that line."""
    with pytest.raises(SystemExit) as stopped:
        entry.main(pipeline_class, ["--output_path", "out", *argv], video=video)
    assert stopped.value.code == 2
    *problems, hint = capsys.readouterr().err.split("error:", 1)[1].strip().splitlines()
    assert hint.endswith(HELP_HINT), hint
    assert len(problems) == 1, problems
    assert not (workdir / "out").exists()
    return problems[0]
