"""``ModelConfig``: which files make one model, and the parsers of the two model flags.

A model is named either by local paths (``--model_paths``) or by a repository id and a file pattern inside it
(``--model_id_with_origin_paths``), e.g. ``Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors``. The
second form is resolved under ``DIFFSYNTH_MODEL_BASE_PATH`` and downloaded only when missing (see ``resolve.py``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from .errors import ModelConfigError

MODEL_ID_FLAG = "--model_id_with_origin_paths"
MODEL_PATHS_FLAG = "--model_paths"
DOWNLOAD_SOURCES = ("modelscope", "huggingface")

_MODEL_ID_EXAMPLE = "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors"
_MODEL_PATHS_EXAMPLE = '\'["models/vae.safetensors", ["models/dit-1.safetensors", "models/dit-2.safetensors"]]\''


def _check_relative(value: str, what: str) -> None:
    """Rejects absolute paths and ``..`` so a repository id or pattern cannot escape the model folder."""
    posix = PurePosixPath(value.replace("\\", "/"))
    if posix.is_absolute() or ".." in posix.parts or re.match(r"^[A-Za-z]:/", value.replace("\\", "/")):
        raise ModelConfigError(
            f"{what}={value!r} must be relative to its repository folder (no leading '/', no drive, no '..'); "
            "pass local files with --model_paths instead"
        )


@dataclass
class ModelConfig:
    """The files of one model (or tokenizer), by local path or by repository id and file pattern.

    Exactly one of the two forms must be given.

    Attributes:
        path: A file or folder, or a list of shard files, on local disk. Never downloaded.
        model_id: A ModelScope / Hugging Face repository id such as ``"Qwen/Qwen-Image"``.
        origin_file_pattern: A glob inside that repository, e.g. ``"transformer/diffusion_pytorch_model*.safetensors"``
            for a sharded model or ``"tokenizer/"`` for a whole folder.
        skip_download: Never download, even when files are missing. None reads ``DIFFSYNTH_SKIP_DOWNLOAD``.
        download_source: ``"modelscope"`` or ``"huggingface"``. None reads ``DIFFSYNTH_DOWNLOAD_SOURCE``
            (default ``"modelscope"``).
    """

    path: str | list[str] | None = None
    model_id: str | None = None
    origin_file_pattern: str | None = None
    skip_download: bool | None = None
    download_source: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None and self.model_id is not None:
            raise ModelConfigError(
                f"ModelConfig got both path={self.path!r} and model_id={self.model_id!r}; give local paths "
                f"({MODEL_PATHS_FLAG}) or a repository id with a pattern ({MODEL_ID_FLAG}), not both"
            )
        if self.path is None and self.model_id is None and self.origin_file_pattern is None:
            raise ModelConfigError(
                "ModelConfig needs path=... (a local file, folder or list of shards) or model_id=... together with "
                f"origin_file_pattern=... (e.g. {_MODEL_ID_EXAMPLE!r})"
            )
        if self.path is not None:
            self.path = self._normalise_path(self.path)
        else:
            self._check_model_id()
        if self.skip_download is not None and not isinstance(self.skip_download, bool):
            raise ModelConfigError(f"skip_download={self.skip_download!r} must be True, False or None (read the env)")
        if self.download_source is not None and self.download_source not in DOWNLOAD_SOURCES:
            raise ModelConfigError(
                f"download_source={self.download_source!r} is not supported; use one of {DOWNLOAD_SOURCES}"
            )

    @staticmethod
    def _normalise_path(path: object) -> str | list[str]:
        if isinstance(path, (str, os.PathLike)):
            if not str(path):
                raise ModelConfigError("ModelConfig path='' is empty; give a file, a folder or a list of shards")
            return os.fspath(path)
        if isinstance(path, (list, tuple)):
            if not path or not all(isinstance(p, (str, os.PathLike)) and str(p) for p in path):
                raise ModelConfigError(
                    f"ModelConfig path={path!r} must be a non-empty list of file paths (the shards of one model)"
                )
            return [os.fspath(p) for p in path]
        raise ModelConfigError(f"ModelConfig path={path!r} must be a string or a list of strings")

    def _check_model_id(self) -> None:
        if not self.model_id or not self.origin_file_pattern:
            raise ModelConfigError(
                f"ModelConfig needs both model_id and origin_file_pattern, got model_id={self.model_id!r} and "
                f"origin_file_pattern={self.origin_file_pattern!r} (e.g. {_MODEL_ID_EXAMPLE!r})"
            )
        for name in ("model_id", "origin_file_pattern"):
            value = getattr(self, name)
            if not isinstance(value, str) or value != value.strip() or any(c.isspace() for c in value):
                raise ModelConfigError(f"{name}={value!r} must be a string without whitespace")
            _check_relative(value, name)

    @property
    def is_local(self) -> bool:
        """Whether the model is given by local paths (never downloaded)."""
        return self.path is not None

    def describe(self) -> str:
        """A short human-readable name for logs and error messages."""
        if self.path is not None:
            return repr(self.path)
        return f"{self.model_id}:{self.origin_file_pattern}"


def parse_model_id_with_origin_paths(value: str) -> list[ModelConfig]:
    """Parses ``--model_id_with_origin_paths``: comma-separated ``model_id:origin_file_pattern`` entries.

    Each entry is split at its last colon, so the pattern itself holds no colon. Empty entries (a trailing comma) are
    ignored.

    Args:
        value: The flag's value, e.g. ``"Qwen/Qwen-Image:transformer/*.safetensors,Qwen/Qwen-Image:vae/*.safetensors"``.

    Returns:
        One ``ModelConfig`` per entry, in order.

    Raises:
        ModelConfigError: An entry is not of the form ``model_id:pattern``, or the flag holds no entry.
    """
    if not isinstance(value, str):
        raise ModelConfigError(f"{MODEL_ID_FLAG} must be a string, got {type(value).__name__}")
    configs = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        model_id, colon, pattern = entry.rpartition(":")
        if not colon or not model_id or not pattern:
            raise ModelConfigError(
                f"{MODEL_ID_FLAG}: entry {entry!r} is not of the form model_id:origin_file_pattern "
                f"(e.g. {_MODEL_ID_EXAMPLE!r}); separate entries with commas"
            )
        try:
            configs.append(ModelConfig(model_id=model_id, origin_file_pattern=pattern))
        except ModelConfigError as error:
            raise ModelConfigError(f"{MODEL_ID_FLAG}: entry {entry!r}: {error}") from None
    if not configs:
        raise ModelConfigError(f"{MODEL_ID_FLAG}={value!r} names no model; expected e.g. {_MODEL_ID_EXAMPLE!r}")
    return configs


def parse_model_paths(value: str) -> list[ModelConfig]:
    """Parses ``--model_paths``: a JSON list whose entries are a path or a list of shard paths.

    Args:
        value: The flag's value, e.g. ``'["vae.safetensors", ["dit-1.safetensors", "dit-2.safetensors"]]'``.

    Returns:
        One local ``ModelConfig`` per entry, in order.

    Raises:
        ModelConfigError: The value is not JSON, not a list, or an entry is neither a string nor a list of strings.
    """
    try:
        entries = json.loads(value)
    except (TypeError, json.JSONDecodeError) as error:
        raise ModelConfigError(
            f"{MODEL_PATHS_FLAG}={value!r} is not valid JSON ({error}); expected a JSON list such as "
            f"{_MODEL_PATHS_EXAMPLE} (mind the shell quoting)"
        ) from None
    if not isinstance(entries, list) or not entries:
        raise ModelConfigError(
            f"{MODEL_PATHS_FLAG}={value!r} must be a non-empty JSON list such as {_MODEL_PATHS_EXAMPLE}"
        )
    configs = []
    for index, entry in enumerate(entries):
        valid_list = isinstance(entry, list) and entry and all(isinstance(p, str) and p for p in entry)
        if not (isinstance(entry, str) and entry) and not valid_list:
            raise ModelConfigError(
                f"{MODEL_PATHS_FLAG}: entry {index} ({json.dumps(entry)}) must be a path or a non-empty list of "
                f"shard paths, as in {_MODEL_PATHS_EXAMPLE}"
            )
        configs.append(ModelConfig(path=entry))
    return configs


def parse_model_configs(
    model_paths: str | None = None, model_id_with_origin_paths: str | None = None
) -> list[ModelConfig]:
    """Combines both model flags into one list: local paths first, then repository entries.

    Raises:
        ModelConfigError: Neither flag is given, or one of them is malformed.
    """
    configs: list[ModelConfig] = []
    if model_paths:
        configs += parse_model_paths(model_paths)
    if model_id_with_origin_paths:
        configs += parse_model_id_with_origin_paths(model_id_with_origin_paths)
    if not configs:
        raise ModelConfigError(
            f"no model given: pass {MODEL_PATHS_FLAG} (local files) and/or {MODEL_ID_FLAG} (e.g. {_MODEL_ID_EXAMPLE!r})"
        )
    return configs
