"""Samples while training: the pipeline renders the validation prompts with the LoRA as it trains, on the main process.

When: after every ``--validation_steps`` optimizer steps and/or at the end of every ``--validation_epochs`` epochs
(once per step when both fall on it). Where: ``<output_path>/samples/step-<N>/<NN>.png`` (``.mp4`` for video, at the
entry's frame rate), also logged to TensorBoard / Weights & Biases when they are on. The other processes wait at a
barrier meanwhile.

Where the models are. The denoiser renders where training placed it (on the device, under its offload manager,
block-swapped), with the LoRA as it is now: the live peft layers, not a merged copy. A model training also computes
with (the text encoder and VAE of one-stage training) is used where it is placed. A model training does not compute
with is streamed from host memory one layer at a time by a leaf-offload manager while rendering, and released after:
in a split run's stage 2, whose text encoder and VAE are weightless skeletons (``--offload_models``), their weights
are first loaded from their files into host memory, and dropped again once the samples are written. So rendering
holds at most one such layer next to the denoiser as training places it. One residency meter spans every offload
policy of the run, and each render logs its peak next to training's (and, on CUDA, the allocator's peaks).

Randomness. A render draws its noise from its own generator (the entry's or ``--validation_seed``) inside
``torch.random.fork_rng``, and training draws from per-sample generators, so training continues bit-identically: a
run with samples trains the same weights as one without.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ...core.device import peak_memory_bytes, reset_peak_memory
from ...core.loader import load_component
from ...core.offload_training import OffloadTrainingManager, ResidencyMeter
from ...diffusion.base_pipeline import BasePipeline
from ..config.placement import PlacementConfig
from ..config.validation_prompts import DEFAULT_FPS, ValidationConfig
from ..outputs.logger import SAMPLES_DIR, ModelLogger
from ..outputs.run_report import format_bytes as _size
from ..placement.placers import Placer

logger = logging.getLogger(__name__)



def unknown_input_problems(pipe: BasePipeline, inputs: set[str]) -> list[str]:
    """One problem per prompt-file input the pipeline's call does not take (EliGen's for any model but Qwen-Image)."""
    parameters = inspect.signature(pipe.__call__).parameters
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values()):
        return []
    return [f'"{name}" is not an input of {type(pipe).__name__}; drop it' for name in sorted(inputs)
            if name not in parameters]


def rendering_model_names(pipe: BasePipeline) -> list[str]:
    """The models inference may compute with: every model the pipeline holds (a second expert such as Wan2.2's
    ``dit2`` included)."""
    return pipe.model_names()


def _is_skeleton(model: torch.nn.Module) -> bool:
    return any(param.is_meta for param in model.parameters())


@contextlib.contextmanager
def streamed_models(pipe: BasePipeline, names: Sequence[str], device: torch.device, placement: PlacementConfig,
                    meter: ResidencyMeter) -> Iterator[None]:
    """Streams the named models from host memory under leaf-offload managers while the block runs; a weightless
    skeleton is loaded from its files first and put back afterwards. Every manager counts in ``meter``."""
    streamed: list[tuple[str, torch.nn.Module, OffloadTrainingManager]] = []
    try:
        for name in names:
            original = getattr(pipe, name)
            model = original
            if _is_skeleton(model):
                started = time.perf_counter()
                model = load_component(pipe.model_configs[name], torch_dtype=pipe.torch_dtype, device="cpu")
                logger.info("samples: loaded %s into host memory in %.1f s", name, time.perf_counter() - started)
                setattr(pipe, name, model.requires_grad_(False).eval())
            manager = OffloadTrainingManager(model, device, **placement.offload_options(trains=False))
            manager.meter.attach(meter)
            streamed.append((name, original, manager))
        yield
    finally:
        for name, original, manager in reversed(streamed):
            manager.remove()
            setattr(pipe, name, original)


class SampleRenderer:
    """Renders the validation prompts at the steps ``config`` asks for; see the module docstring.

    Raises:
        ValueError: An entry gives an image input the loaded model cannot take, or lacks one it needs (checked when
            the run starts, before training).

    Args:
        config: The prompts and when to render them.
        pipe: The training module's pipeline (the denoiser with its live LoRA).
        placed: The models training placed (the stage's active models).
        placers: Training's placers (their pass is ended after a render).
        placement: The run's placement, whose offload options the streaming managers take.
        device: The compute device.
        output_path: The run's ``--output_path``.
        model_logger: Logs the samples to TensorBoard / wandb.
        meter: The run-wide residency meter every offload policy counts in.
    """

    def __init__(self, config: ValidationConfig, pipe: BasePipeline, placed: Sequence[str],
                 placers: Sequence[Placer], placement: PlacementConfig, device: torch.device,
                 output_path: str | Path, model_logger: ModelLogger, meter: ResidencyMeter) -> None:
        self.config, self.pipe, self.placers, self.placement = config, pipe, list(placers), placement
        self.device, self.output_path, self.model_logger, self.meter = device, Path(output_path), model_logger, meter
        problems = [f"--validation_prompts entry {number}: {problem}"
                    for number, prompt in enumerate(config.prompts, start=1)
                    for problem in [*unknown_input_problems(pipe, prompt.inputs()),
                                    *pipe.sample_input_problems(prompt.inputs())]]
        if problems:
            raise ValueError("\n".join(problems))
        self.streamed = [name for name in rendering_model_names(pipe) if name not in placed]
        self.training_peak = 0
        self.last_step: int | None = None
        #: Step -> ``(sampling, training)``: the peaks of the run-wide residency meter while rendering at that step
        #: and while training up to it (main process).
        self.peaks: dict[int, tuple[int, int]] = {}

    @classmethod
    def attach_meters(cls, placers: Sequence[Placer]) -> ResidencyMeter:
        """One meter counting what every training placer holds on the device at once."""
        meter = ResidencyMeter()
        for placer in placers:
            placer.meter.attach(meter)
        return meter

    def due(self, step: int, completed_epochs: int | None = None) -> bool:
        """Whether to render after ``step`` (at the end of an epoch: ``completed_epochs``), once per step."""
        return step != self.last_step and self.config.due(step, completed_epochs)

    def render(self, step: int, accelerator: Any) -> list[Path]:
        """Renders every prompt on the main process (the others wait) and returns the files written there."""
        self.last_step = step
        written: list[Path] = []
        if accelerator.is_main_process:
            written = self._render(step)
        accelerator.wait_for_everyone()
        return written

    def _render(self, step: int) -> list[Path]:
        started = time.perf_counter()
        training_device_peak = peak_memory_bytes(self.device)
        self.training_peak = max(self.training_peak, self.meter.peak)
        self.meter.reset_peak()
        reset_peak_memory(self.device)
        folder = self.output_path / SAMPLES_DIR / f"step-{step}"
        written = []
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                streamed_models(self.pipe, self.streamed, self.device, self.placement, self.meter):
            multiple = self.pipe.size_multiple()
            for index, prompt in enumerate(self.config.prompts):
                fps = prompt.fps or DEFAULT_FPS
                arguments = self.config.call_arguments(prompt, multiple)
                if "frame_rate" in self.pipe.input_types:  # a model that renders for a frame rate (LTX-2's sound)
                    arguments["frame_rate"] = fps
                output = self.pipe(**arguments)
                path = self.pipe.save_output(output, folder / f"{index:02d}", fps=fps)
                self.model_logger.log_sample(step, index, output, fps=fps)
                written.append(path)
        for placer in self.placers:
            placer.after_backward(sync_gradients=False)  # ends the inference passes: nothing stays loaded
        sampling_peak = self.meter.peak
        self.meter.reset_peak()
        device_note = ""
        if training_device_peak is not None:
            device_note = (f"; device memory peak {_size(peak_memory_bytes(self.device))} "
                           f"(training {_size(training_device_peak)})")
            reset_peak_memory(self.device)
        logger.info("samples at step %d: %d written to %s in %.1f s; offloaded weights on the device at most %s "
                    "(training %s)%s", step, len(written), folder, time.perf_counter() - started,
                    _size(sampling_peak), _size(self.training_peak), device_note)
        self.peaks[step] = (sampling_peak, self.training_peak)
        return written

