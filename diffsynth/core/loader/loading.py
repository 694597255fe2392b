"""Builds the diffusers / transformers class a folder's ``config.json`` names and loads its safetensors shards.

Original (non-diffusers) release layouts load into the same classes: the readers the families register
(``core.model_traits``) say which class and config they make and where each tensor comes from.

The model is built with its parameters on the meta device (``accelerate.init_empty_weights``), so building costs no
memory, then every shard is assigned into it in the requested dtype and on the requested device: the weights are
allocated once, where they will live. Buffers computed in ``__init__`` (rotary tables) are built for real, under the
requested default dtype, exactly as ``from_pretrained`` of both libraries builds them, so a model loaded here equals
the one the libraries load.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..device import resolve_device
from ..file_memo import one_load, read_json
from ..model_traits import identify_original, model_modules
from .config import ModelConfig
from .errors import ModelLoadError
from .nf4_layout import linear4bit_shells
from .original_layout import OriginalModel, leave_out
from .pth import PTH_SUFFIX
from .resolve import incomplete_reason, resolve_files
from .shared_loading import SharedLoad, load_shared
from .state_dict import assign_shards, meta_tensor_names, plan_keys, read_headers, transformers_key_renamer

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spiece.model", "tokenizer.model")
_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


def resolve_dtype(torch_dtype: torch.dtype | str, name: str = "torch_dtype") -> torch.dtype:
    """Parses a floating dtype given as a ``torch.dtype`` or a name such as ``"bfloat16"``."""
    dtype = _DTYPE_NAMES.get(torch_dtype.lower()) if isinstance(torch_dtype, str) else torch_dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{name}={torch_dtype!r} is not a floating dtype; use one of {sorted(set(_DTYPE_NAMES))}")
    return dtype


def weight_files(files: list[Path]) -> list[Path]:
    """The weight files among ``files``: safetensors (a folder contributes every ``*.safetensors`` directly inside
    it), and ``.pth`` files, which only the original-Wan route reads (with PyTorch's restricted loader)."""
    found: list[Path] = []
    for path in files:
        if path.is_dir():
            found += sorted(path.glob("*.safetensors"))
        elif path.name.endswith(".safetensors") or path.suffix == PTH_SUFFIX:
            found.append(path)
        elif path.suffix in (".bin", ".pt", ".ckpt"):
            raise ModelLoadError(
                f"{path} is a pickle checkpoint; only safetensors files are loaded (pickles can run code). Convert it "
                "with safetensors.torch.save_file, or use the repository's .safetensors files"
            )
    return found


def read_config(folder: Path) -> dict[str, Any]:
    """Reads ``folder/config.json`` (once while it is unchanged: ``file_memo``), with an error that names the file."""
    path = folder / "config.json"
    try:
        return read_json(path)
    except FileNotFoundError:
        raise ModelLoadError(
            f"{path} is missing: it names the model class to build; copy the repository's config.json next to the "
            "weights (or include it in the download pattern's folder)"
        ) from None
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{path} is not valid JSON ({error}); restore the repository's config.json") from None


def find_model_class(model_config: dict[str, Any], config_path: Path) -> tuple[str, type[torch.nn.Module]]:
    """Looks up the class a ``config.json`` names: ``_class_name`` in diffusers, ``architectures[0]`` in transformers.

    Returns:
        ``("diffusers" | "transformers", class)``.

    Raises:
        ModelLoadError: The config names no class, or a class the installed library lacks.
    """
    if "_class_name" in model_config:
        library, name = "diffusers", model_config["_class_name"]
    elif model_config.get("architectures"):
        library, name = "transformers", model_config["architectures"][0]
    else:
        raise ModelLoadError(
            f"{config_path} names no class: a diffusers config has '_class_name', a transformers config has "
            "'architectures'; use the config.json of a diffusers or transformers repository"
        )
    return library, library_class(library, name, config_path)


def library_class(library: str, name: object, where: object) -> type[torch.nn.Module]:
    """The model class ``name`` of ``diffusers`` or ``transformers``: at the library's top level, else in a module
    registered with ``model_traits.register_model_module``.

    Raises:
        ModelLoadError: The installed library has no such model class; the message names ``where`` it was asked for.
    """
    module = __import__(library)
    cls = getattr(module, str(name), None) if isinstance(name, str) else None
    if cls is None and isinstance(name, str):  # a model class kept in a pipeline's package, which a room registered
        cls = next((getattr(found, name) for found in map(importlib.import_module, model_modules(library))
                    if hasattr(found, name)), None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ModelLoadError(
            f"{where} names {library} class {name!r}, which {library} {module.__version__} does not provide; "
            f"check the class name, or upgrade {library}"
        )
    return cls


def build_empty_model(library: str, cls: type[torch.nn.Module], folder: Path, dtype: torch.dtype,
                      config: dict[str, Any] | None = None) -> torch.nn.Module:
    """Builds ``cls`` from ``folder/config.json`` (or from ``config``) with every parameter on the meta device.

    The config is parsed here (``read_config``) and handed to the library, which would otherwise read the file again:
    diffusers' ``from_config`` takes what its ``load_config`` would have read, and a transformers config is made by
    the class's own config class, as its ``from_pretrained`` makes it.

    Only parameters go to meta: buffers and plain tensors computed in ``__init__`` (RoPE frequencies) are small and
    are not in the checkpoint, so they are built for real, under ``dtype`` as the default dtype like
    ``from_pretrained`` does.

    Args:
        library: ``"diffusers"`` or ``"transformers"``.
        cls: The model class.
        folder: The folder holding ``config.json``; with ``config``, only named in messages.
        dtype: The default dtype while building.
        config: The class's config as a dict, for checkpoints that ship none of the library's own (original
            layouts): ``from_config`` arguments for diffusers, the config class's arguments for transformers.
    """
    from accelerate import init_empty_weights

    where = folder / "config.json" if config is None else folder
    folder_config = read_config(folder) if config is None else None
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with init_empty_weights(include_buffers=False):
            if library == "diffusers":
                return cls.from_config(config if config is not None else folder_config)
            if config is not None:
                model_config = cls.config_class(**config)
            else:
                model_config = _transformers_config(cls, folder, folder_config)
            model_config.dtype = dtype
            return cls(model_config)
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - a config the class rejects
        raise ModelLoadError(
            f"cannot build {cls.__name__} from {where} ({type(error).__name__}: {error}); the config does not fit "
            f"the installed {library}"
        ) from error
    finally:
        torch.set_default_dtype(previous)


def _transformers_config(cls: type[torch.nn.Module], folder: Path, folder_config: dict[str, Any]):
    """The config ``cls.from_pretrained(folder)`` would build, from the already parsed ``folder/config.json``."""
    config_class = cls.config_class
    if getattr(config_class, "model_type", None) == folder_config.get("model_type"):
        return config_class.from_dict(folder_config, name_or_path=str(folder))
    from transformers import AutoConfig  # a config of another type (its class maps it): transformers decides

    return AutoConfig.from_pretrained(str(folder))


def _blueprint(shards: list[Path]) -> tuple[str, type[torch.nn.Module], Path, OriginalModel | None]:
    """``(library, class, folder, original)`` for a model's weight files: an original layout (``original`` set) or
    the class the folder's ``config.json`` names."""
    original = identify_original(shards)
    if original is not None:
        return original.library, library_class(original.library, original.class_name, original.source), \
            original.source, original
    folder = shards[0].parent
    library, cls = find_model_class(read_config(folder), folder / "config.json")
    return library, cls, folder, None


def _empty_model(shards: list[Path], dtype: torch.dtype,
                 original: OriginalModel | None = None) -> tuple[str, torch.nn.Module, Path, OriginalModel | None]:
    if original is not None:  # one of the further models of a file (``OriginalModel.others``)
        library, cls, folder = original.library, library_class(original.library, original.class_name,
                                                               original.source), original.source
    else:
        library, cls, folder, original = _blueprint(shards)
    model = build_empty_model(library, cls, folder, dtype, config=original.config if original else None)
    if original is not None and original.absent:  # a part the files do not hold: no weights planned for it
        leave_out(model, original.absent)
    if original is not None and original.packed:  # weights that stay 4-bit: their layers become Linear4bit
        linear4bit_shells(model, original.packed, dtype)
    return library, model, folder, original


def _fp32_modules(library: str, model: torch.nn.Module, dtype: torch.dtype) -> tuple[str, ...]:
    """Modules each library keeps in float32 at ``dtype``, following its own ``from_pretrained`` rule."""
    if dtype == torch.float32:
        return ()
    if library == "diffusers":  # diffusers keeps them in float32 for any requested dtype
        return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    modules = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:  # transformers: the non-strict list guards only fp16 overflow
        modules |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    return tuple(sorted(modules))


def _tie_weights(model: torch.nn.Module, missing: set[str]) -> None:
    tie = getattr(model, "tie_weights", None)
    if tie is None:
        return
    # transformers 5 ties symmetrically when told which keys the checkpoint lacked, and refuses to tie two tensors
    # that are both present but differ; older versions take no argument
    if "missing_keys" in inspect.signature(tie).parameters:
        tie(missing_keys=missing)
    else:
        tie()


def _load_shared_part(model: torch.nn.Module, plan: dict, dtype: torch.dtype, fp32_modules: tuple[str, ...],
                      shared: SharedLoad, original: OriginalModel | None) -> dict:
    """``load_shared`` of the plan but its packed 4-bit weights; returns what is left for this process to load."""
    # A packed weight is a Params4bit with its statistics beside the data; the shared copy holds plain tensors.
    packed = original.packed if original is not None else frozenset()
    remaining = load_shared(model, {key: entry for key, entry in plan.items() if key not in packed}, dtype,
                            fp32_modules, shared)
    return {**remaining, **{key: plan[key] for key in packed}}


def load_model_from_files(
    files: list[Path], torch_dtype: torch.dtype | str = torch.bfloat16, device: str | torch.device = "cpu",
    shared: SharedLoad | None = None, original: OriginalModel | None = None,
) -> torch.nn.Module:
    """Loads one model from its safetensors shards and the ``config.json`` beside them.

    Args:
        files: Shard files, or a folder holding them.
        torch_dtype: Floating dtype of the weights (modules the class keeps in float32 stay float32).
        device: Where the weights are allocated; they are cast on the CPU first, so the device holds only the
            final copy.
        shared: Load the weights it selects once per machine into host memory the run's processes there share
            (``shared_loading.py``; every process of the run must then load the same models in the same order);
            the rest goes to ``device``. None: this process loads its own copy.
        original: Load this model the files hold (one of a file's ``OriginalModel.others``) rather than the one
            their reader names first.

    Returns:
        The model, in eval mode, with no tensor left on the meta device.

    Raises:
        ModelLoadError: No safetensors file, a missing shard or config, an unknown class, a corrupt file, or
            missing / unexpected / mis-shaped weights.
    """
    dtype = resolve_dtype(torch_dtype)
    target = resolve_device(device, name="device")
    started = time.perf_counter()
    shards = weight_files([Path(f) for f in files])
    if not shards:
        raise ModelLoadError(
            f"no .safetensors file among {[str(f) for f in files]}; check the pattern (e.g. "
            "'transformer/diffusion_pytorch_model*.safetensors'), or load a tokenizer folder with load_tokenizer"
        )
    folders = sorted({s.parent for s in shards})
    if len(folders) > 1:
        raise ModelLoadError(
            f"the files come from several folders {[str(f) for f in folders]}; one model is one folder, give "
            "each model its own entry"
        )
    folder = folders[0]
    # a missing config.json is reported by _blueprint, which knows whether the files need one (single files do not)
    reason = incomplete_reason(shards, need_config=False)
    if reason is not None:
        raise ModelLoadError(f"cannot load {folder}: {reason}; download or copy the missing files")
    with one_load():  # each shard is opened once, for its header and its tensors
        library, model, folder, original = _empty_model(shards, dtype, original)
        cls = type(model)
        expected = model.state_dict()
        if original is not None:  # already under the model's names
            plan = plan_keys(original.entries, expected)
        else:
            rename = transformers_key_renamer(model) if library == "transformers" else None
            ignore = tuple(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
            plan = plan_keys(read_headers(shards), expected, rename=rename, ignore_unexpected=ignore)
        fp32_modules = _fp32_modules(library, model, dtype)
        remaining = plan if shared is None else _load_shared_part(model, plan, dtype, fp32_modules, shared, original)
        assign_shards(model, remaining, dtype, target, fp32_modules=fp32_modules)
    if library == "transformers":
        _tie_weights(model, set(expected) - set(plan))
    missing = meta_tensor_names(model)
    if missing:
        shown = ", ".join(repr(k) for k in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ModelLoadError(
            f"{cls.__name__} from {folder}: {len(missing)} weight(s) missing from the checkpoint: {shown}{more}; the "
            "pattern may leave shards out, or the weights belong to a different config"
        )
    model.to(target)  # the parameters are already there (shared ones stay in host memory); this moves the buffers
    if library == "transformers" and hasattr(model, "config"):
        model.config.dtype = dtype
    model.eval()
    logger.info(
        "loaded %s from %d shard(s) in %s (%s on %s) in %.2f s",
        cls.__name__, len(shards), folder, dtype, target, time.perf_counter() - started,
    )  # fmt: skip
    return model


def load_model(
    config: ModelConfig, torch_dtype: torch.dtype | str = torch.bfloat16, device: str | torch.device = "cpu",
    shared: SharedLoad | None = None,
) -> torch.nn.Module:
    """Resolves a ``ModelConfig`` (downloading only missing files) and loads the model it names.

    Args:
        config: The model's files, e.g. ``ModelConfig(model_id="Qwen/Qwen-Image",
            origin_file_pattern="transformer/diffusion_pytorch_model*.safetensors")``.
        torch_dtype: Floating dtype of the weights.
        device: Where the weights are allocated.
        shared: Load (part of) the weights once per machine into shared host memory; see
            ``load_model_from_files``.

    Returns:
        The diffusers / transformers model named by the folder's ``config.json``.
    """
    return load_model_from_files(resolve_files(config), torch_dtype=torch_dtype, device=device, shared=shared)


def load_skeleton(config: ModelConfig, torch_dtype: torch.dtype | str = torch.bfloat16) -> torch.nn.Module:
    """Builds the model a config names with its parameters on the meta device: no weights are read.

    For models a stage holds but never computes with (``--offload_models``): the pipeline keeps the slot, its config
    and its module names (so a LoRA can be described), at no memory cost.
    """
    dtype = resolve_dtype(torch_dtype)
    shards = weight_files(resolve_files(config))
    if not shards:
        raise ModelLoadError(f"{config.describe()} holds no .safetensors file, so it names no model to build")
    return _empty_model(shards, dtype)[1].eval()


def model_class_name(config: ModelConfig) -> str | None:
    """The class name a config's model folder declares in its ``config.json``, without building anything; None for a
    folder without weights (a tokenizer).

    Raises:
        ModelLoadError: As ``find_model_class``, or an unknown ``.pth`` file.
    """
    shards = weight_files(resolve_files(config))
    if not shards:
        return None
    return _blueprint(shards)[1].__name__


def _tokenizer_folder(files: list[Path]) -> Path | None:
    for path in files:
        folder = path if path.is_dir() else path.parent
        if any((folder / name).is_file() for name in TOKENIZER_FILES):
            return folder
    return None


def load_tokenizer(config: ModelConfig):
    """Resolves a tokenizer folder (e.g. pattern ``"tokenizer/"``) and loads it with ``AutoTokenizer``.

    Raises:
        ModelLoadError: The folder holds no tokenizer files, or transformers cannot read them.
    """
    files = resolve_files(config)
    folder = _tokenizer_folder(files)
    if folder is None:
        raise ModelLoadError(
            f"{config.describe()} resolved to {[str(f) for f in files]}, which hold none of {TOKENIZER_FILES}; point "
            "the pattern at the tokenizer folder, e.g. 'tokenizer/'"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as error:  # noqa: BLE001 - tokenizer errors come in many types
        raise ModelLoadError(
            f"cannot load the tokenizer in {folder} ({type(error).__name__}: {error}); restore the repository's "
            "tokenizer files"
        ) from error


def load_components(
    config: ModelConfig, torch_dtype: torch.dtype | str = torch.bfloat16, device: str | torch.device = "cpu",
    shared: SharedLoad | None = None, wanted: Callable[[str], bool] = lambda class_name: True,
) -> list:
    """Everything a config's files hold: ``load_component``'s model (or tokenizer), then each further model of a
    file holding several (``OriginalModel.others``) whose class ``wanted`` accepts (the classes a pipeline has
    slots for). ``shared`` applies to the first model only."""
    first = load_component(config, torch_dtype=torch_dtype, device=device, shared=shared)
    shards = weight_files(resolve_files(config))
    original = identify_original(shards) if shards else None
    others = [other for other in (original.others if original is not None else ()) if wanted(other.class_name)]
    return [first, *(load_model_from_files(shards, torch_dtype, device, original=other) for other in others)]


def load_component(
    config: ModelConfig, torch_dtype: torch.dtype | str = torch.bfloat16, device: str | torch.device = "cpu",
    shared: SharedLoad | None = None,
):
    """Loads whatever a config names: a model when its files hold safetensors weights (``shared``: see
    ``load_model_from_files``), else a tokenizer."""
    files = resolve_files(config)
    if weight_files(files):
        return load_model_from_files(files, torch_dtype=torch_dtype, device=device, shared=shared)
    return load_tokenizer(config)
