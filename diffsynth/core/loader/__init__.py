"""Model loading: ``ModelConfig``, the model flags, download-when-missing, and meta-device loading of shards.

Typical use::

    pattern = "transformer/diffusion_pytorch_model*.safetensors"
    dit = load_model(ModelConfig(model_id="Qwen/Qwen-Image", origin_file_pattern=pattern), torch.bfloat16, "cpu")

The original Wan release layouts (``Wan-AI/Wan2.1-T2V-1.3B`` and the like: a ``WanModel`` config, ``.pth`` encoders
and VAEs) load into the same diffusers / transformers classes (``pipelines/wan_video/original.py``, a reader the family registers); ``.pth`` files are read only with
PyTorch's restricted loader (``pth.py``).

The tiny-model builders live in ``diffsynth.testing.tiny_models`` (imported on demand: tests and scripts only).
"""

from .config import ModelConfig, parse_model_configs, parse_model_id_with_origin_paths, parse_model_paths
from .errors import ModelConfigError, ModelFilesNotFoundError, ModelLoadError
from .loading import (
    load_component,
    load_components,
    load_model,
    load_model_from_files,
    load_skeleton,
    load_tokenizer,
    model_class_name,
)
from .resolve import model_base_path, resolve_files
from .shared_loading import SharedLoad

__all__ = [
    "ModelConfig",
    "ModelConfigError",
    "ModelFilesNotFoundError",
    "ModelLoadError",
    "SharedLoad",
    "load_component",
    "load_components",
    "load_model",
    "load_model_from_files",
    "load_skeleton",
    "load_tokenizer",
    "model_base_path",
    "model_class_name",
    "parse_model_configs",
    "parse_model_id_with_origin_paths",
    "parse_model_paths",
    "resolve_files",
]
