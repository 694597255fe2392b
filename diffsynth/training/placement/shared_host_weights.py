"""Which models a run loads once per machine into host memory its processes share (``--shared_host_weights``).

With several processes on a machine, the frozen weights that offload or block swap stream from host memory would
otherwise be loaded, and pinned, once per process: a 20B Qwen-Image DiT in bf16 is about 41 GB, so eight GPUs would need
300 GB of RAM before anything trains. Here the run decides, per model, what goes into the machine's one shared copy
(``core/loader/shared_loading.py`` loads it; offload and block swap then stream from it in place):

- ``--enable_model_cpu_offload``: every model loaded with weights, the stage-1 models (text encoder, VAE) included;
- ``--blocks_to_swap``: the blocks block swap keeps in host memory, of each denoiser (the rest goes to the GPU);
- models trained in full (``--trainable_models``) never: their weights, gradients and optimizer state stay per
  process, as do LoRA weights, which are made after loading;
- ``--fp8_models``: the shared copy of those models is the fp8 one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...core.loader import ModelConfig, ModelLoadError, SharedLoad, model_class_name, parse_model_id_with_origin_paths
from ...core.offload_training.block_swap import host_parameters
from ...core.shared_weights import LocalGroup

if TYPE_CHECKING:
    from ...diffusion.base_pipeline import BasePipeline
    from ..config.model import ModelSection
    from ..config.placement import PlacementConfig
    from ..config.training import TrainingSection


SharedLoads = Callable[[ModelConfig], SharedLoad | None]
"""What ``BasePipeline.from_pretrained`` asks of each model it loads: how to share it, or None for a private copy."""


def shared_loads(placement: PlacementConfig, model: ModelSection, training: TrainingSection,
                 pipeline_class: type[BasePipeline], configs: Sequence[ModelConfig],
                 num_processes: int) -> SharedLoads | None:
    """How each of ``configs`` loads, or None when nothing is shared (one process, ``--shared_host_weights off``, or
    weights that stay on the GPU).

    With sharing, every process of the run must call it (it finds the processes of each machine) and then load the
    same models in the same order; a machine with one process of the run then loads as usual.
    """
    if not placement.shares_host_weights(num_processes):
        return None
    group = LocalGroup.of_this_process()
    trained = set(training.trainable)
    fp8 = parse_model_id_with_origin_paths(model.fp8_models) if model.fp8_models else []
    slots = pipeline_class.slots_of([_class_name(config) for config in configs])
    swap_select = host_parameters(placement.block_swap) if placement.blocks_to_swap else None

    def how(config: ModelConfig) -> SharedLoad | None:
        slot = next((slot for each, slot in zip(configs, slots) if each is config), None)
        if slot is None or slot in trained:
            return None
        if placement.enable_model_cpu_offload:
            return SharedLoad(group, fp8=config in fp8)
        if slot in pipeline_class.denoising_model_names:  # the models block swap swaps
            return SharedLoad(group, select=swap_select, fp8=config in fp8)
        return None

    return how


def _class_name(config: ModelConfig) -> str | None:
    try:
        return model_class_name(config)
    except ModelLoadError:
        return None  # reported by the load itself
