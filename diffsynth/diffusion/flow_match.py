"""Flow-matching noise schedule, shared by training and inference.

A sample at noise level ``sigma`` is ``x_t = (1 - sigma) * x_0 + sigma * noise``; the model predicts the velocity
``noise - x_0``; the timestep the model sees is ``sigma * num_train_timesteps``. Models differ only in how a linear
sigma grid is bent ("shifted") towards high noise: a plain static ``shift``; a resolution-dependent exponential
shift (``dynamic_shift``, ``mu`` interpolated linearly in the image sequence length, optionally stretched to end at
``shift_terminal``); or an exponential shift with a ``mu`` the pipeline computes and passes. Each family declares its
settings as named presets in its spec (``FamilySpec.scheduler_presets``; ``pipelines.common.scheduler_from_preset``
builds one). Where output parity with a diffusers pipeline needs diffusers' own scheduler (UniPC for the diffusers Wan
repos), :class:`DiffusersScheduler` wraps it behind the same inference interface.

Training samples timesteps from a 1000-step grid bent with the same shift (dynamic presets use a fixed
``training_mu``, since one run mixes resolutions) and weights the loss with a Gaussian bump over timesteps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

class FlowMatchScheduler:
    """Sigma/timestep schedule with an Euler sampler and the flow-matching training helpers.

    Args:
        shift: Static shift ``s`` (``sigma -> s * sigma / (1 + (s - 1) * sigma)``); ignored when ``dynamic_shift``.
        dynamic_shift: Use the exponential shift ``e^mu / (e^mu + 1/sigma - 1)`` with ``mu`` from the sequence length.
        base_shift: ``mu`` at ``base_image_seq_len`` tokens.
        max_shift: ``mu`` at ``max_image_seq_len`` tokens (the line extends past both ends).
        base_image_seq_len: See ``base_shift``.
        max_image_seq_len: See ``max_shift``.
        shift_terminal: If set, the shifted schedule is stretched so its last sigma equals this value.
        training_mu: ``mu`` for the training grid when ``dynamic_shift`` (0.8, DiffSynth-Studio's choice).
        training_shift: A static shift for the training grid instead (of ``shift`` or ``training_mu``): FLUX.1
            samples with the resolution shift but the reference trains it on shift 3.
        num_train_timesteps: Timestep scale and size of the training grid.
    """

    def __init__(
        self, shift: float = 1.0, *, dynamic_shift: bool = False, base_shift: float = 0.5, max_shift: float = 0.9,
        base_image_seq_len: int = 256, max_image_seq_len: int = 8192, shift_terminal: float | None = None,
        training_mu: float = 0.8, training_shift: float | None = None, num_train_timesteps: int = 1000,
    ) -> None:
        if shift <= 0 or (training_shift is not None and training_shift <= 0):
            raise ValueError(f"shift={shift}, training_shift={training_shift} must be positive; use 1.0 for no shift")
        if shift_terminal is not None and not 0 <= shift_terminal < 1:
            raise ValueError(f"shift_terminal={shift_terminal} must lie in [0, 1); use None to keep the schedule's end")
        if max_image_seq_len <= base_image_seq_len:
            raise ValueError(
                f"max_image_seq_len={max_image_seq_len} must exceed base_image_seq_len={base_image_seq_len}"
            )
        if num_train_timesteps < 2:
            raise ValueError(f"num_train_timesteps={num_train_timesteps} must be at least 2")
        self.shift, self.dynamic_shift, self.shift_terminal = float(shift), dynamic_shift, shift_terminal
        self.base_shift, self.max_shift = float(base_shift), float(max_shift)
        self.base_image_seq_len, self.max_image_seq_len = base_image_seq_len, max_image_seq_len
        self.training_mu, self.num_train_timesteps = float(training_mu), num_train_timesteps
        self.sigmas = torch.empty(0)
        self.timesteps = torch.empty(0)
        grid = torch.linspace(1.0, 0.0, num_train_timesteps + 1, dtype=torch.float64)[:-1]
        if training_shift is not None:
            _, self.training_timesteps = self._bend(grid, None, shift=training_shift)
        else:
            _, self.training_timesteps = self._bend(grid, training_mu if dynamic_shift else None)
        # Normalising on the grid itself makes the expected weight of a uniformly drawn grid index exactly 1.
        self._weight_norm = self._gaussian(self.training_timesteps).mean()

    @classmethod
    def from_diffusers_config(cls, config: Mapping[str, Any]) -> FlowMatchScheduler:
        """Builds the schedule from a diffusers ``FlowMatchEulerDiscreteScheduler`` config (``scheduler_config.json``).

        Raises:
            ValueError: The config names another scheduler class or an option this class does not implement.
        """
        name = config.get("_class_name", "FlowMatchEulerDiscreteScheduler")
        if name != "FlowMatchEulerDiscreteScheduler":
            raise ValueError(f"scheduler _class_name={name!r} is not flow-match Euler; wrap it in DiffusersScheduler")
        extras = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas")
        unsupported = [key for key in (*extras, "stochastic_sampling") if config.get(key)]
        if config.get("time_shift_type", "exponential") != "exponential":
            unsupported.append(f"time_shift_type={config['time_shift_type']!r}")
        if unsupported:
            raise ValueError(f"scheduler config sets {unsupported}, not implemented here; use DiffusersScheduler")
        return cls(
            shift=config.get("shift", 1.0), dynamic_shift=bool(config.get("use_dynamic_shifting", False)),
            base_shift=config.get("base_shift", 0.5), max_shift=config.get("max_shift", 1.15),
            base_image_seq_len=config.get("base_image_seq_len", 256),
            max_image_seq_len=config.get("max_image_seq_len", 4096),
            shift_terminal=config.get("shift_terminal") or None,
            num_train_timesteps=config.get("num_train_timesteps", 1000),
        )

    def compute_mu(self, image_seq_len: int) -> float:
        """The exponential-shift ``mu`` for ``image_seq_len`` latent tokens (Qwen-Image: ``height * width / 256``)."""
        slope = (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len)
        return self.base_shift + slope * (image_seq_len - self.base_image_seq_len)

    def _bend(self, sigmas: torch.Tensor, mu: float | None, shift: float | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shifts float64 ``sigmas`` (no zeros) by ``mu``, else by the static ``shift`` (default ``self.shift``), and
        returns float32 ``(sigmas, timesteps)``."""
        if mu is not None:
            sigmas = math.exp(mu) / (math.exp(mu) + (1.0 / sigmas - 1.0))
        else:
            shift = self.shift if shift is None else shift
            sigmas = shift * sigmas / (1.0 + (shift - 1.0) * sigmas)
        # A schedule that is just [1.0] has nothing to stretch (and would divide by zero).
        if self.shift_terminal is not None and sigmas[-1] < 1.0:
            one_minus = 1.0 - sigmas
            sigmas = 1.0 - one_minus * ((1.0 - self.shift_terminal) / one_minus[-1])
        sigmas = sigmas.to(torch.float32)
        return sigmas, sigmas * self.num_train_timesteps

    def set_timesteps(
        self, num_inference_steps: int, denoising_strength: float = 1.0, *, image_seq_len: int | None = None,
        mu: float | None = None,
    ) -> None:
        """Builds the inference schedule into ``self.sigmas`` and ``self.timesteps`` (float32, ``num_inference_steps``).

        Args:
            num_inference_steps: Number of Euler steps.
            denoising_strength: Start noise level in (0, 1]; below 1 starts from a partly noised input (image-to-image).
            image_seq_len: Latent token count, for ``dynamic_shift`` schedules.
            mu: Exponential-shift ``mu``; overrides ``image_seq_len``.
        """
        if num_inference_steps < 1:
            raise ValueError(f"num_inference_steps={num_inference_steps} must be at least 1")
        if not 0 < denoising_strength <= 1:
            raise ValueError(f"denoising_strength={denoising_strength} must lie in (0, 1]")
        if self.dynamic_shift and mu is None:
            if image_seq_len is None:
                raise ValueError("this schedule shifts by resolution: pass image_seq_len=height * width // 256")
            mu = self.compute_mu(image_seq_len)
        grid = torch.linspace(denoising_strength, 0.0, num_inference_steps + 1, dtype=torch.float64)[:-1]
        self.sigmas, self.timesteps = self._bend(grid, mu if self.dynamic_shift else None)

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor) -> torch.Tensor:
        """One Euler step from ``timestep`` (a value of ``self.timesteps``) to the next sigma, 0 after the last.

        Computed in float32 (diffusers upcasts only ``sample``) and returned in ``model_output``'s dtype.
        """
        if len(self.timesteps) == 0:
            raise RuntimeError("step() needs a schedule: call set_timesteps() first")
        if isinstance(timestep, int) or (isinstance(timestep, torch.Tensor) and not timestep.is_floating_point()):
            raise ValueError(f"timestep={timestep!r} is an integer; pass a value of scheduler.timesteps, not an index")
        values = torch.as_tensor(timestep, dtype=torch.float32).detach().cpu().reshape(-1)
        if values.numel() == 0 or not torch.all(values == values[0]):
            raise ValueError(f"timestep={timestep!r} must hold one value for the whole batch")
        index = int(torch.argmin((self.timesteps - values[0]).abs()))
        sigma = self.sigmas[index]
        sigma_next = self.sigmas[index + 1] if index + 1 < len(self.sigmas) else torch.zeros(())
        prev = sample.to(torch.float32) + (sigma_next - sigma).to(sample.device) * model_output.to(torch.float32)
        return prev.to(model_output.dtype)

    def _sigma(self, timestep: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
        """``timestep / num_train_timesteps`` as float32, shaped to broadcast over ``like`` (one value per sample)."""
        sigma = torch.as_tensor(timestep, dtype=torch.float32, device=like.device) / self.num_train_timesteps
        if sigma.numel() == 1:
            return sigma.reshape(())
        if sigma.dim() != 1 or sigma.shape[0] != like.shape[0]:
            raise ValueError(f"timestep shape {tuple(sigma.shape)} must be () or (batch={like.shape[0]},)")
        return sigma.reshape(-1, *([1] * (like.dim() - 1)))

    def add_noise(self, original: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor | float) -> torch.Tensor:
        """``(1 - sigma) * original + sigma * noise`` with ``sigma = timestep / num_train_timesteps``.

        The timestep is read as a value, not looked up on a grid, so keep it in float32 (bf16 rounds 987 to 988).
        """
        sigma = self._sigma(timestep, original)
        return ((1 - sigma) * original.to(torch.float32) + sigma * noise.to(torch.float32)).to(original.dtype)

    def training_target(
        self, sample: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor | float | None = None
    ) -> torch.Tensor:
        """The velocity the model learns, ``noise - sample`` (the same at every timestep)."""
        return noise - sample

    def training_index_range(self, min_boundary: float = 0.0, max_boundary: float = 1.0) -> tuple[int, int]:
        """The index range ``[int(min * N), int(max * N))`` of ``training_timesteps`` the boundaries select.

        Raises:
            ValueError: The boundaries are not ``0 <= min < max <= 1`` or select no grid entry.
        """
        count = len(self.training_timesteps)
        low, high = int(min_boundary * count), int(max_boundary * count)
        if not 0.0 <= min_boundary < max_boundary <= 1.0 or high <= low:
            raise ValueError(
                f"min_boundary={min_boundary}, max_boundary={max_boundary}: need 0 <= min < max <= 1 spanning at least "
                f"one of {count} training timesteps"
            )
        return low, high

    def sample_training_timestep(
        self, generator: torch.Generator | None = None, min_boundary: float = 0.0, max_boundary: float = 1.0,
        batch_size: int = 1,
    ) -> torch.Tensor:
        """Draws timesteps uniformly by index from ``training_timesteps[int(min * N):int(max * N)]``.

        The grid runs from high noise to low, so ``max_boundary=0.5`` keeps the noisier half. Returns float32, shape
        ``(batch_size,)``, on the generator's device (CPU without one).
        """
        low, high = self.training_index_range(min_boundary, max_boundary)
        device = generator.device if generator is not None else torch.device("cpu")
        index = torch.randint(low, high, (batch_size,), generator=generator, device=device)
        return self.training_timesteps.to(device)[index]

    def _gaussian(self, timesteps: torch.Tensor) -> torch.Tensor:
        half = self.num_train_timesteps / 2
        return torch.exp(-2.0 * ((timesteps.to(torch.float32) - half) / self.num_train_timesteps) ** 2)

    def training_weight(self, timestep: torch.Tensor | float) -> torch.Tensor:
        """Loss weight: a Gaussian bump peaking at the middle timestep, scaled to mean 1 over ``training_timesteps``.

        Unlike DiffSynth-Studio, the minimum is not subtracted first, so every weight stays positive (about 0.61 of
        the peak at the ends) and no timestep is ignored.
        """
        timestep = torch.as_tensor(timestep, dtype=torch.float32)
        return self._gaussian(timestep) / self._weight_norm.to(timestep.device)


class DiffusersScheduler:
    """Runs a diffusers scheduler behind :class:`FlowMatchScheduler`'s inference interface.

    Use it where output parity with a diffusers pipeline matters more than one shared schedule, e.g. Wan's
    ``UniPCMultistepScheduler``. Training helpers are not provided: train with :class:`FlowMatchScheduler`.

    Args:
        scheduler: Any diffusers scheduler (``set_timesteps``, ``step``, ``timesteps``).
    """

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.timesteps = torch.empty(0)

    def set_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, **kwargs: Any) -> None:
        """Calls the scheduler's ``set_timesteps`` (``kwargs`` such as ``sigmas``, ``mu`` or ``device`` pass through).

        A ``denoising_strength`` below 1 drops the first steps the way diffusers' image-to-image pipelines do.
        """
        if not 0 < denoising_strength <= 1:
            raise ValueError(f"denoising_strength={denoising_strength} must lie in (0, 1]")
        self.scheduler.set_timesteps(num_inference_steps, **kwargs)
        kept = min(int(num_inference_steps * denoising_strength), num_inference_steps)
        start = (num_inference_steps - kept) * getattr(self.scheduler, "order", 1)
        if hasattr(self.scheduler, "set_begin_index"):
            self.scheduler.set_begin_index(start)
        self.timesteps = self.scheduler.timesteps[start:]

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor) -> torch.Tensor:
        """The scheduler's ``step``, returning the tensor only."""
        return self.scheduler.step(model_output, timestep, sample, return_dict=False)[0]

    def add_noise(self, original: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor | float) -> torch.Tensor:
        """Noises ``original`` to ``timestep`` the scheduler's way (image- and video-to-video starts).

        Raises:
            NotImplementedError: The scheduler has neither ``scale_noise`` (flow-match Euler) nor ``add_noise``.
        """
        timestep = torch.as_tensor(timestep, device=original.device).reshape(1)
        if hasattr(self.scheduler, "scale_noise"):
            return self.scheduler.scale_noise(original, timestep, noise)
        if hasattr(self.scheduler, "add_noise"):
            return self.scheduler.add_noise(original, noise, timestep)
        raise NotImplementedError(f"{type(self.scheduler).__name__} cannot noise an input; use FlowMatchScheduler for "
                                  "image- or video-to-video")
