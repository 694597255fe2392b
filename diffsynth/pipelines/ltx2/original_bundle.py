"""An LTX-2 release holding every component in one file: Lightricks' ``ltx-2-19b-dev.safetensors`` /
``ltx-2.3-22b-dev.safetensors`` layout, which ``jd-opensource/JoyAI-Echo:JoyAI-Echo-release.safetensors`` (an LTX-2.3
fine-tune the reference recognises by that key set) keeps.

The file loads as its transformer; the other components it holds are that model's ``OriginalModel.others``, each
read by its own map from its keys (``model.diffusion_model.*_embeddings_connector`` and ``text_embedding_projection``:
the text connectors; ``vae.``, ``audio_vae.``: both halves of each VAE, joined; ``vocoder.``), so a pipeline given the
file once gets every model it has a slot for (``core.loader.load_components``). That is what the reference's scripts
do: both stages name the file alone (with Gemma for stage 1), and each stage uses what it needs. LTX-2.3's vocoder
with bandwidth extension (``vocoder.vocoder.*``, ``vocoder.bwe_generator.*``, ``vocoder.mel_stft.*``) loads as
diffusers' ``LTX2VocoderWithBWE``, as from the Repackage's ``audio_vocoder`` file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...core.loader.original_layout import OriginalModel
from ...core.loader.state_dict import CheckpointEntry
from .original import _PROJECTION, _is_connector, _metadata_section, component_model
from .original_audio import audio_vae_model, vocoder_model
from .original_vae import video_vae_model

# The components after the transformer, by the prefix of their keys, with their reader and metadata section.
_READERS = {"vae.": ("vae", video_vae_model), "audio_vae.": ("audio_vae", audio_vae_model),
            "vocoder.": ("vocoder", vocoder_model)}


def _group(key: str) -> str:
    """Which component a key of the file belongs to: ``dit``, ``connectors`` or a ``_READERS`` prefix."""
    if key.startswith(_PROJECTION) or _is_connector(key):
        return "connectors"
    return next((prefix for prefix in _READERS if key.startswith(prefix)), "dit")


def single_file_model(file: Path, entries: dict[str, CheckpointEntry]) -> OriginalModel:
    """The transformer of a file holding every LTX-2 component, the others in its ``others``; a key no component
    takes is left with the transformer's, for loading to report.

    Raises:
        ModelLoadError: A component lacks a tensor its structure needs (the message names the file and the key).
    """
    groups: dict[str, dict[str, CheckpointEntry]] = {}
    for key, entry in entries.items():
        groups.setdefault(_group(key), {})[key] = entry
    others = []
    if "connectors" in groups:
        others.append(component_model(file, groups["connectors"], "connectors"))
    for prefix, (section, read) in _READERS.items():
        if prefix not in groups:
            continue
        others.append(read(file, groups[prefix], _metadata_section(file, section)))
    return dataclasses.replace(component_model(file, groups["dit"], "dit"), others=tuple(others))
