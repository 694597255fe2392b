"""Turns a ``ModelConfig`` into files on disk, downloading only what is missing.

Repository files live under ``$DIFFSYNTH_MODEL_BASE_PATH/<model_id>/<pattern>`` (default base ``./models``). Files
already there are used without any network call: ModelScope's ``snapshot_download`` retries for about 20 seconds
offline even when the files are present, so the local check comes first and the downloader is called only when the
pattern matches nothing or a sharded checkpoint is incomplete. Before it is called, one connection checks that the
hub can be reached (``reachability``), so an offline run fails within seconds with one message instead of after the
client's retries; a failed download removes the folders it created, so no empty ``<model_id>/`` is left behind.

Environment:
    DIFFSYNTH_MODEL_BASE_PATH: the folder holding ``<model_id>/`` repositories (default ``./models``).
    DIFFSYNTH_SKIP_DOWNLOAD: ``true`` never downloads; missing files fail at once.
    DIFFSYNTH_DOWNLOAD_SOURCE: ``modelscope`` (default) or ``huggingface``.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

from ..file_memo import read_json
from ..files import missing_folders, remove_empty_folders
from .config import DOWNLOAD_SOURCES, ModelConfig
from .errors import ModelConfigError, ModelFilesNotFoundError
from .reachability import hub_endpoint, offline_by_environment, unreachable_reason

logger = logging.getLogger(__name__)

BASE_PATH_ENV = "DIFFSYNTH_MODEL_BASE_PATH"
SKIP_DOWNLOAD_ENV = "DIFFSYNTH_SKIP_DOWNLOAD"
DOWNLOAD_SOURCE_ENV = "DIFFSYNTH_DOWNLOAD_SOURCE"
DEFAULT_BASE_PATH = "./models"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def model_base_path() -> Path:
    """The folder holding downloaded repositories: ``$DIFFSYNTH_MODEL_BASE_PATH`` or ``./models``."""
    return Path(os.environ.get(BASE_PATH_ENV) or DEFAULT_BASE_PATH)


def skip_download_from_env() -> bool:
    """Reads ``DIFFSYNTH_SKIP_DOWNLOAD``; an unrecognised value is an error rather than a silent default."""
    raw = os.environ.get(SKIP_DOWNLOAD_ENV, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ModelConfigError(f"{SKIP_DOWNLOAD_ENV}={raw!r} is not a boolean; use 'true' or 'false'")


def download_source_from_env() -> str:
    """Reads ``DIFFSYNTH_DOWNLOAD_SOURCE`` (default ``modelscope``)."""
    raw = os.environ.get(DOWNLOAD_SOURCE_ENV, "").strip().lower() or "modelscope"
    if raw not in DOWNLOAD_SOURCES:
        raise ModelConfigError(f"{DOWNLOAD_SOURCE_ENV}={raw!r} is not supported; use one of {DOWNLOAD_SOURCES}")
    return raw


def local_repo_dir(config: ModelConfig) -> Path:
    """The folder a repository config resolves in: ``<base path>/<model_id>``."""
    if config.model_id is None:
        raise ModelConfigError(f"local_repo_dir needs a repository config, got path={config.path!r}")
    return model_base_path() / config.model_id


def download_from_modelscope(model_id: str, local_dir: Path, allow_patterns: list[str]) -> None:
    """Downloads the files of ``model_id`` matching ``allow_patterns`` into ``local_dir`` from ModelScope."""
    from modelscope import snapshot_download  # imported lazily: it is slow and only needed to download

    snapshot_download(model_id, local_dir=str(local_dir), allow_patterns=allow_patterns)


def download_from_huggingface(model_id: str, local_dir: Path, allow_patterns: list[str]) -> None:
    """Downloads the files of ``model_id`` matching ``allow_patterns`` into ``local_dir`` from the Hugging Face Hub."""
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=model_id, local_dir=str(local_dir), allow_patterns=allow_patterns)


def _glob(folder: Path, pattern: str) -> list[Path]:
    """Files (or, for a pattern ending in '/', the folder) matching ``pattern`` under ``folder``."""
    # The folder itself may hold glob characters (a user's path); only the pattern is a glob.
    root = glob.escape(str(folder))
    if pattern.endswith("/"):
        matches = [Path(p) for p in glob.glob(os.path.join(root, pattern.rstrip("/")))]
        return sorted(p for p in matches if p.is_dir() and any(p.iterdir()))
    return sorted(Path(p) for p in glob.glob(os.path.join(root, pattern), recursive=True) if Path(p).is_file())


def incomplete_reason(files: list[Path], need_config: bool = True) -> str | None:
    """Why a set of matched files cannot be loaded as it stands, or None when it looks complete.

    A safetensors match needs every shard its folder's index lists (an interrupted download leaves some out, and so
    does a pattern or a list of paths that names only some), and, with ``need_config``, its folder's ``config.json``,
    unless it is one of the single files a release ships without one (FLUX.1's ``flux1-dev.safetensors``,
    ``ae.safetensors``).
    """
    if not files:
        return "the pattern matches no file"
    for folder in sorted({f.parent for f in files if f.name.endswith(".safetensors")}):
        if need_config and not (folder / "config.json").is_file() and not _is_single_file_release(
                [f for f in files if f.parent == folder]):
            return f"{folder / 'config.json'} is missing"
        matched = {f.name for f in files if f.parent == folder}
        for index_file in sorted(folder.glob("*.safetensors.index.json")):
            try:
                shards = set(read_json(index_file)["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError) as error:
                return f"{index_file} is unreadable ({error})"
            if shards & matched:
                missing = sorted(shards - matched)
                if missing:
                    return f"shard(s) {missing} listed in {index_file.name} are missing (or left out by the pattern)"
    return None


def _is_single_file_release(files: list[Path]) -> bool:
    """Whether ``files`` are one safetensors file in a release's single-file layout, which carries no config."""
    from ..model_traits import identify_original
    from .errors import ModelLoadError

    if len(files) != 1 or not files[0].is_file():
        return False
    try:
        return identify_original(files) is not None
    except (ModelLoadError, OSError, ValueError):
        return False  # loading names the problem; here the file only counts as not a complete release file


# The pattern of a repository's root folder: the reference's empty pattern (``--tokenizer_path
# "Qwen/Qwen3-VL-4B-Instruct:"``, a tokenizer beside the weights at the root).
REPOSITORY_ROOT = "./"


def _allow_patterns(pattern: str) -> list[str]:
    """The download patterns: the user's, plus the folder's config and shard index, which loading needs."""
    if pattern == REPOSITORY_ROOT:
        return ["*"]
    if pattern.endswith("/"):
        return [pattern + "*"]
    folder = os.path.dirname(pattern)
    prefix = f"{folder}/" if folder else ""
    return [pattern, f"{prefix}config.json", f"{prefix}*.safetensors.index.json"]


def _missing_error(config: ModelConfig, folder: Path, reason: str, skip: bool, cause: str | None = None) -> str:
    lines = [
        f"model {config.model_id!r}, pattern {config.origin_file_pattern!r}: no usable files in {folder.resolve()} "
        f"({reason}).",
    ]
    if cause:
        lines.append(f"The download failed: {cause}.")
    lines.append("Fix: put the repository's files under that folder")
    lines.append(f"  (or set {BASE_PATH_ENV} to the folder that holds '{config.model_id}/'),")
    if skip:
        lines.append(f"  or unset {SKIP_DOWNLOAD_ENV} (or pass skip_download=False) to let it download,")
    else:
        lines.append(
            f"  or check the network and the id/pattern, or switch {DOWNLOAD_SOURCE_ENV} between "
            "'modelscope' and 'huggingface',"
        )
    lines.append("  or pass local files with --model_paths.")
    return "\n".join(lines)


def _resolve_local(config: ModelConfig) -> list[Path]:
    paths = [config.path] if isinstance(config.path, str) else list(config.path)
    resolved = []
    for path in map(Path, paths):
        if not path.exists():
            raise ModelFilesNotFoundError(
                f"--model_paths: {str(path)!r} does not exist (resolved to {path.resolve()}); check the path, or "
                "use --model_id_with_origin_paths to download the model"
            )
        resolved.append(path)
    return resolved


def resolve_files(config: ModelConfig) -> list[Path]:
    """Returns the files (or folder) a config names, downloading them first only when they are missing.

    Local ``path`` configs are checked and returned as they are. Repository configs are globbed under
    ``<base path>/<model_id>``; when that already gives a complete set, no network call is made at all.

    Args:
        config: The model to resolve.

    Returns:
        Sorted matching files; a single folder for a pattern ending in ``/`` (e.g. ``"tokenizer/"``).

    Raises:
        ModelFilesNotFoundError: Files are missing and downloading is disabled, fails, or does not produce them.
    """
    if config.is_local:
        return _resolve_local(config)
    folder = local_repo_dir(config)
    files = _glob(folder, config.origin_file_pattern)
    reason = incomplete_reason(files)
    if reason is None:
        return files
    skip = config.skip_download if config.skip_download is not None else skip_download_from_env()
    if skip:
        # Without a config.json the files are still usable for what needs none (a LoRA file); the model loader
        # reports the missing config itself when it needs one.
        if incomplete_reason(files, need_config=False) is None:
            return files
        raise ModelFilesNotFoundError(_missing_error(config, folder, reason, skip=True))
    source = config.download_source or download_source_from_env()
    offline = offline_by_environment(source)
    unreachable = f"{offline} forbids it" if offline else unreachable_reason(hub_endpoint(source))
    if unreachable:
        cause = f"{source} ({hub_endpoint(source)}) cannot be reached: {unreachable}"
        raise ModelFilesNotFoundError(_missing_error(config, folder, reason, skip=False, cause=cause))
    patterns = _allow_patterns(config.origin_file_pattern)
    logger.info("downloading %s (%s) from %s into %s", config.model_id, patterns, source, folder)
    downloader = download_from_huggingface if source == "huggingface" else download_from_modelscope
    created = missing_folders(folder)
    try:
        downloader(config.model_id, folder, patterns)
    except Exception as error:  # noqa: BLE001 - any network/hub failure becomes one actionable message
        remove_empty_folders(created)
        cause = f"{source}: {type(error).__name__}: {error}"
        raise ModelFilesNotFoundError(_missing_error(config, folder, reason, skip=False, cause=cause)) from error
    files = _glob(folder, config.origin_file_pattern)
    reason = incomplete_reason(files, need_config=False)  # a repository may rightly hold no config.json (LoRA files)
    if reason is not None:
        remove_empty_folders(created)
        raise ModelFilesNotFoundError(
            _missing_error(config, folder, f"after downloading from {source}: {reason}", skip=False)
        )
    return files
