"""Each model file read once at start-up: openings counted per file, and what is reused stays true to the files."""

import builtins
import collections
import io
import os
import shutil
import time
from pathlib import Path

import pytest
import safetensors
import torch

from diffsynth.core import file_memo
from diffsynth.core.file_memo import read_json
from diffsynth.core.loader import ModelConfig, load_model, load_skeleton, resolve
from diffsynth.core.loader.loading import find_model_class, model_class_name, read_config
from diffsynth.testing.tiny_models import QWEN_IMAGE_PATTERNS
from diffsynth.testing.tiny_wan import WAN_ORIGINAL_MODEL_ID, WAN_ORIGINAL_PATTERNS

from .conftest import QWEN

AN_HOUR_AGO = time.time() - 3600


class Reads(collections.Counter):
    """Openings for reading per file under ``root``: ``open`` (also behind ``Path.read_text`` and ``torch.load``) and
    ``safe_open``; ``unpickled`` counts ``torch.load`` calls apart."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.unpickled = collections.Counter()

    def name(self, file: object) -> str | None:
        if isinstance(file, (str, os.PathLike)):
            name = os.path.relpath(os.fspath(file), self.root)
            return None if name.startswith("..") else name
        return None

    def count(self, file: object, counter: collections.Counter | None = None) -> None:
        name = self.name(file)
        if name is not None:
            (self if counter is None else counter)[name] += 1


@pytest.fixture
def old_copy(tiny_root, tmp_path, monkeypatch):
    """``old_copy(model_id)`` copies a tiny repo into a private base folder with files last changed an hour ago (as
    a downloaded repository's are), and forgets what earlier tests read."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path))
    file_memo.forget()

    def copy(model_id: str) -> Path:
        target = tmp_path / model_id
        shutil.copytree(tiny_root / model_id, target)
        for path in target.rglob("*"):
            os.utime(path, (AN_HOUR_AGO, AN_HOUR_AGO))
        return target

    yield copy
    file_memo.forget()


@pytest.fixture
def reads(tmp_path, monkeypatch) -> Reads:
    counter = Reads(tmp_path)
    real_open, real_safe_open, real_load = builtins.open, safetensors.safe_open, torch.load

    def counting_open(file, mode="r", *args, **kwargs):
        if "r" in mode:
            counter.count(file)
        return real_open(file, mode, *args, **kwargs)

    def counting_safe_open(file, *args, **kwargs):
        counter.count(file)
        return real_safe_open(file, *args, **kwargs)

    def counting_load(file, *args, **kwargs):
        counter.count(file, counter.unpickled)
        return real_load(file, *args, **kwargs)

    for module in (builtins, io):
        monkeypatch.setattr(module, "open", counting_open)
    monkeypatch.setattr(safetensors, "safe_open", counting_safe_open)
    monkeypatch.setattr(torch, "load", counting_load)
    return counter


def test_a_pipeline_start_up_reads_each_model_file_once(old_copy, reads):
    """The trainer's start-up phases, then the load: every config and index once, every shard opened once."""
    from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

    repo = old_copy(QWEN)
    configs = [ModelConfig(model_id=QWEN, origin_file_pattern=QWEN_IMAGE_PATTERNS[name])
               for name in ("dit", "text_encoder", "vae")]
    assert [model_class_name(config) for config in configs] == [
        "QwenImageTransformer2DModel", "Qwen2_5_VLForConditionalGeneration", "AutoencoderKLQwenImage"]
    QwenImagePipeline.companion_configs(configs)
    load_skeleton(configs[0], torch.float32)  # the LoRA target check
    pipe = QwenImagePipeline.from_pretrained(torch.float32, model_configs=configs)
    assert pipe.dit is not None and pipe.text_encoder is not None and pipe.vae is not None

    shards = sorted(str(path.relative_to(repo.parent.parent)) for component in ("transformer", "text_encoder")
                    for path in (repo / component).glob("*.safetensors"))
    assert len(shards) > 2
    once = [f"{QWEN}/{component}/config.json" for component in ("transformer", "text_encoder", "vae")]
    once += [str(path.relative_to(repo.parent.parent)) for path in repo.glob("*/*.safetensors.index.json")]
    once += shards  # their headers and tensors come from one opening in the load
    assert {name: reads[name] for name in once} == dict.fromkeys(once, 1)
    # the single file: its header at the first class lookup (is it FLUX.1's original layout?), its tensors in the load
    assert reads[f"{QWEN}/vae/diffusion_pytorch_model.safetensors"] == 2


def test_the_t5_pth_is_unpickled_once_for_its_load_and_the_lookups_after(old_copy, reads):
    old_copy(WAN_ORIGINAL_MODEL_ID)
    config = ModelConfig(model_id=WAN_ORIGINAL_MODEL_ID, origin_file_pattern=WAN_ORIGINAL_PATTERNS["text_encoder"])
    model = load_model(config, torch.float32)
    assert type(model).__name__ == model_class_name(config) == "UMT5EncoderModel"
    name = f"{WAN_ORIGINAL_MODEL_ID}/{WAN_ORIGINAL_PATTERNS['text_encoder']}"
    assert reads.unpickled[name] == reads[name] == 1


@pytest.mark.parametrize("component", ["transformer", "text_encoder", "vae"])
def test_the_config_handed_to_the_library_is_the_one_it_reads_itself(old_copy, component):
    """The parsed config.json goes to diffusers' from_config / the transformers config class instead of letting them
    read the folder again; the model's config must equal the one the library makes from the folder."""
    from transformers import AutoConfig

    folder = old_copy(QWEN) / component
    model = load_model(ModelConfig(path=str(folder)), torch.float32)
    library, cls = find_model_class(read_config(folder), folder / "config.json")
    if library == "transformers":
        reference = AutoConfig.from_pretrained(str(folder))
        reference.dtype = torch.float32
        assert type(model.config) is type(reference)
        assert model.config.to_dict() == reference.to_dict()
    else:
        assert dict(model.config) == dict(cls.from_config(cls.load_config(str(folder))).config)


def test_what_was_read_stays_true_to_the_file(tmp_path, reads):
    """Callers own their copies; a file rewritten (even to the same size, with its old time put back) or written just
    now is read again."""
    file_memo.forget()
    path = tmp_path / "config.json"
    path.write_text('{"layers": 1}')
    os.utime(path, (AN_HOUR_AGO, AN_HOUR_AGO))
    first = read_json(path)
    first["layers"] = 9
    assert read_json(path) == {"layers": 1}
    assert reads["config.json"] == 1

    mtime_ns = path.stat().st_mtime_ns
    with open(path, "r+") as handle:  # in place: same inode, same size
        handle.write('{"layers": 2}')
    os.utime(path, ns=(mtime_ns, mtime_ns))
    assert read_json(path) == {"layers": 2}
    assert reads["config.json"] == 3  # the rewrite's own "r+" opening, then the read

    recent = tmp_path / "recent.json"
    recent.write_text("[1]")
    assert read_json(recent) == read_json(recent) == [1]
    assert reads["recent.json"] == 2
