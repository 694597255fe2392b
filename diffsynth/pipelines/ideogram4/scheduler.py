"""Ideogram 4's logit-normal flow-match schedule (diffusers' ``Ideogram4Pipeline`` and the reference's
``set_timesteps_ideogram4``), on the house's ``FlowMatchScheduler`` (Euler steps, training helpers)."""

from __future__ import annotations

import math

import torch

from ...diffusion.flow_match import FlowMatchScheduler

# The schedule's log-SNR range and the resolution its mean refers to.
LOGSNR_MIN, LOGSNR_MAX = -15.0, 18.0
BASE_PIXELS = 512 * 512
PIXELS_PER_TOKEN = 16 * 16
DEFAULT_STD = 1.5
# The training grid's resolution (1024 x 1024, in tokens).
TRAINING_TOKENS = 64 * 64


def logit_normal_sigmas(num_inference_steps: int, mu: float, std: float, denoising_strength: float = 1.0
                        ) -> torch.Tensor:
    """``num_inference_steps`` decreasing sigmas (float64): ``sigmoid(mu + std * ndtri(s))`` for ``s`` from
    ``denoising_strength`` down to ``1 / N`` of it, clamped to the log-SNR range."""
    quantiles = torch.linspace(0.0, denoising_strength, num_inference_steps + 1, dtype=torch.float64)
    data_time = 1.0 - torch.special.expit(mu + std * torch.special.ndtri(quantiles))
    data_time = data_time.clamp(1.0 / (1.0 + math.exp(0.5 * LOGSNR_MAX)), 1.0 / (1.0 + math.exp(0.5 * LOGSNR_MIN)))
    return (1.0 - data_time).flip(0)[:-1]


def resolution_mu(mu: float, image_seq_len: int) -> float:
    """The schedule's mean for ``image_seq_len`` image tokens: ``mu`` at 512 x 512, shifted by half the log of the
    pixel ratio."""
    return mu + 0.5 * math.log(image_seq_len * PIXELS_PER_TOKEN / BASE_PIXELS)


class Ideogram4Scheduler(FlowMatchScheduler):
    """``FlowMatchScheduler`` with Ideogram 4's resolution-aware logit-normal sigmas; training draws from the same
    schedule at 1024 x 1024 with 1000 steps."""

    def __init__(self) -> None:
        super().__init__()
        sigmas = logit_normal_sigmas(self.num_train_timesteps, resolution_mu(0.0, TRAINING_TOKENS), DEFAULT_STD)
        self.training_timesteps = sigmas.to(torch.float32) * self.num_train_timesteps
        self._weight_norm = self._gaussian(self.training_timesteps).mean()

    def set_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                      image_seq_len: int | None = None, mu: float | None = None, std: float = DEFAULT_STD) -> None:
        """Builds the inference schedule for ``image_seq_len`` image tokens (default 1024 x 1024's).

        Args:
            num_inference_steps: Number of Euler steps.
            denoising_strength: Start quantile in (0, 1]; below 1 starts from a partly noised input.
            image_seq_len: Image tokens (pixels / 256); the mean shifts with it.
            mu: The mean at 512 x 512 (default 0).
            std: The logit-normal standard deviation.
        """
        if num_inference_steps < 1:
            raise ValueError(f"num_inference_steps={num_inference_steps} must be at least 1")
        if not 0 < denoising_strength <= 1:
            raise ValueError(f"denoising_strength={denoising_strength} must lie in (0, 1]")
        if std <= 0:
            raise ValueError(f"std={std} must be positive; Ideogram 4 samples with 1.5")
        mean = resolution_mu(mu or 0.0, image_seq_len or TRAINING_TOKENS)
        self.sigmas = logit_normal_sigmas(num_inference_steps, mean, std, denoising_strength).to(torch.float32)
        self.timesteps = self.sigmas * self.num_train_timesteps
