"""Resolution under DIFFSYNTH_MODEL_BASE_PATH: present files need no network; missing ones download or fail at once.

The downloaders are replaced by fakes that copy files from a tiny repo into the target folder: these tests check the
control flow (when a download happens, with what arguments, what follows), not a download.
"""

import shutil
import sys
import types
from pathlib import Path

import pytest

from diffsynth.core.loader import ModelConfig, ModelConfigError, ModelFilesNotFoundError, resolve, resolve_files

from .conftest import QWEN

DIT = "transformer/diffusion_pytorch_model*.safetensors"


class FakeDownloader:
    """Records calls and, like snapshot_download(local_dir=...), writes the matching files of ``source`` there."""

    def __init__(self, source_repo: Path | None):
        self.source_repo = source_repo
        self.calls = []

    def __call__(self, model_id, local_dir, allow_patterns):
        self.calls.append((model_id, Path(local_dir), list(allow_patterns)))
        if self.source_repo is None:
            return
        for pattern in allow_patterns:
            for file in self.source_repo.glob(pattern):
                if file.is_file():
                    target = Path(local_dir) / file.relative_to(self.source_repo)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(file, target)


@pytest.fixture
def fakes(tiny_root, monkeypatch):
    modelscope = FakeDownloader(tiny_root / QWEN)
    huggingface = FakeDownloader(tiny_root / QWEN)
    monkeypatch.setattr(resolve, "download_from_modelscope", modelscope)
    monkeypatch.setattr(resolve, "download_from_huggingface", huggingface)
    return types.SimpleNamespace(modelscope=modelscope, huggingface=huggingface)


def test_present_files_resolve_without_any_download(base, fakes):
    files = resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))
    assert [f.name for f in files] == [f"diffusion_pytorch_model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert all(f.parent == base / QWEN / "transformer" for f in files)
    tokenizer = resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern="tokenizer/"))
    assert tokenizer == [base / QWEN / "tokenizer"]
    assert fakes.modelscope.calls == [] and fakes.huggingface.calls == []


@pytest.mark.parametrize("pattern", ["flux1-dev.safetensors", "ae.safetensors"])
def test_a_released_single_file_needs_no_config_json(base, fakes, pattern):
    from diffsynth.testing.tiny_flux import FLUX1_DEV_MODEL_ID

    # BFL ships these at the repository root, beside model_index.json only: on disk they are complete.
    [file] = resolve_files(ModelConfig(model_id=FLUX1_DEV_MODEL_ID, origin_file_pattern=pattern))
    assert file == base / FLUX1_DEV_MODEL_ID / pattern and not (file.parent / "config.json").exists()
    assert fakes.modelscope.calls == [] and fakes.huggingface.calls == []


def test_missing_files_download_once_then_resolve_locally(scratch_base, fakes):
    config = ModelConfig(model_id=QWEN, origin_file_pattern=DIT)
    files = resolve_files(config)
    folder = scratch_base.root / QWEN
    assert fakes.modelscope.calls == [
        (QWEN, folder, [DIT, "transformer/config.json", "transformer/*.safetensors.index.json"])
    ]
    assert len(files) == 4 and (folder / "transformer" / "config.json").is_file()
    assert resolve_files(config) == files
    assert len(fakes.modelscope.calls) == 1 and fakes.huggingface.calls == []


def test_an_incomplete_sharded_checkpoint_is_downloaded_again(scratch_base, fakes):
    folder = scratch_base(QWEN, "transformer")
    (folder / "diffusion_pytorch_model-00003-of-00004.safetensors").unlink()
    assert len(resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))) == 4
    assert len(fakes.modelscope.calls) == 1


def test_huggingface_source_switches_the_downloader(scratch_base, fakes, monkeypatch):
    monkeypatch.setenv(resolve.DOWNLOAD_SOURCE_ENV, "huggingface")
    resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern="tokenizer/"))
    assert fakes.modelscope.calls == []
    assert fakes.huggingface.calls == [(QWEN, scratch_base.root / QWEN, ["tokenizer/*"])]


def test_config_download_source_overrides_the_environment(scratch_base, fakes, monkeypatch):
    monkeypatch.setenv(resolve.DOWNLOAD_SOURCE_ENV, "huggingface")
    resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern="tokenizer/", download_source="modelscope"))
    assert len(fakes.modelscope.calls) == 1 and fakes.huggingface.calls == []


@pytest.mark.parametrize("how", ["env", "config"])
def test_skip_download_fails_at_once_with_an_actionable_message(scratch_base, fakes, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv(resolve.SKIP_DOWNLOAD_ENV, "true")
    config = ModelConfig(model_id=QWEN, origin_file_pattern=DIT, skip_download=True if how == "config" else None)
    with pytest.raises(ModelFilesNotFoundError) as info:
        resolve_files(config)
    message = str(info.value)
    for expected in (QWEN, DIT, str((scratch_base.root / QWEN).resolve()), "DIFFSYNTH_SKIP_DOWNLOAD", "--model_paths"):
        assert expected in message
    assert fakes.modelscope.calls == [] and fakes.huggingface.calls == []


def test_skip_download_names_the_missing_shard(scratch_base, monkeypatch):
    monkeypatch.setenv(resolve.SKIP_DOWNLOAD_ENV, "1")
    folder = scratch_base(QWEN, "transformer")
    (folder / "diffusion_pytorch_model-00002-of-00004.safetensors").unlink()
    with pytest.raises(ModelFilesNotFoundError, match="00002-of-00004.safetensors"):
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))


def test_a_failing_download_becomes_one_clear_error(scratch_base, monkeypatch):
    def offline(model_id, local_dir, allow_patterns):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(resolve, "download_from_modelscope", offline)
    with pytest.raises(ModelFilesNotFoundError) as info:
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))
    message = str(info.value)
    assert "ConnectionError: Name or service not known" in message and QWEN in message and DIT in message
    assert "DIFFSYNTH_DOWNLOAD_SOURCE" in message
    assert isinstance(info.value.__cause__, ConnectionError)


def test_a_pattern_the_repository_lacks_fails_after_the_download(scratch_base, fakes):
    with pytest.raises(ModelFilesNotFoundError, match="after downloading from modelscope: the pattern matches no file"):
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern="transformer/nothing-*.safetensors"))
    assert len(fakes.modelscope.calls) == 1


@pytest.mark.parametrize(("name", "value"), [("SKIP_DOWNLOAD_ENV", "maybe"), ("DOWNLOAD_SOURCE_ENV", "s3")])
def test_bad_environment_values_are_errors(scratch_base, monkeypatch, name, value):
    monkeypatch.setenv(getattr(resolve, name), value)
    with pytest.raises(ModelConfigError, match=getattr(resolve, name)):
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))


def test_base_path_defaults_to_models(monkeypatch):
    monkeypatch.delenv(resolve.BASE_PATH_ENV, raising=False)
    assert resolve.model_base_path() == Path("./models")


def test_local_paths_are_checked_and_never_downloaded(base, fakes, tmp_path):
    shard = base / QWEN / "vae" / "diffusion_pytorch_model.safetensors"
    assert resolve_files(ModelConfig(path=str(shard))) == [shard]
    with pytest.raises(ModelFilesNotFoundError, match="--model_paths"):
        resolve_files(ModelConfig(path=[str(shard), str(tmp_path / "absent.safetensors")]))
    assert fakes.modelscope.calls == []


def test_the_real_downloaders_pass_the_folder_and_patterns(monkeypatch, tmp_path):
    """The thin wrappers hand our arguments to each hub client (replaced here by recorders; no network)."""
    monkeypatch.undo()  # restore the real wrappers the autouse guard replaced
    calls = {}
    fake_modelscope = types.ModuleType("modelscope")
    fake_modelscope.snapshot_download = lambda model_id, **kwargs: calls.setdefault("modelscope", (model_id, kwargs))
    monkeypatch.setitem(sys.modules, "modelscope", fake_modelscope)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: calls.setdefault("huggingface", kwargs))
    resolve.download_from_modelscope("a/b", tmp_path, ["vae/*"])
    resolve.download_from_huggingface("a/b", tmp_path, ["vae/*"])
    assert calls["modelscope"] == ("a/b", {"local_dir": str(tmp_path), "allow_patterns": ["vae/*"]})
    assert calls["huggingface"] == {"repo_id": "a/b", "local_dir": str(tmp_path), "allow_patterns": ["vae/*"]}


def test_a_missing_config_json_is_fetched_but_not_required(scratch_base, fakes, monkeypatch):
    """Shards without their config.json trigger a download; files that need none (LoRA) still resolve offline."""
    folder = scratch_base(QWEN, "vae")
    (folder / "config.json").unlink()
    config = ModelConfig(model_id=QWEN, origin_file_pattern="vae/*.safetensors")
    monkeypatch.setenv(resolve.SKIP_DOWNLOAD_ENV, "true")
    assert resolve_files(config) == [folder / "diffusion_pytorch_model.safetensors"]
    assert fakes.modelscope.calls == []
    monkeypatch.setenv(resolve.SKIP_DOWNLOAD_ENV, "false")
    resolve_files(config)
    assert len(fakes.modelscope.calls) == 1 and (folder / "config.json").is_file()


@pytest.mark.parametrize("source", ["modelscope", "huggingface"])
def test_an_unreachable_hub_fails_at_once_without_a_download_or_a_folder(scratch_base, monkeypatch, source):
    """The real check against a local port nobody listens on: what a machine without network sees, in milliseconds."""
    from diffsynth.core.loader import reachability

    from .test_reachability import closed_port

    monkeypatch.setattr(resolve, "unreachable_reason", reachability.unreachable_reason)
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT" if source == "modelscope" else "HF_ENDPOINT", endpoint)
    monkeypatch.setenv(resolve.DOWNLOAD_SOURCE_ENV, source)
    with pytest.raises(ModelFilesNotFoundError) as info:  # the autouse guard's downloaders would raise otherwise
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))
    assert f"The download failed: {source} ({endpoint}) cannot be reached: cannot connect to " in str(info.value)
    assert list(scratch_base.root.iterdir()) == []


def test_the_hugging_face_offline_switch_is_obeyed(scratch_base, fakes, monkeypatch):
    monkeypatch.setenv(resolve.DOWNLOAD_SOURCE_ENV, "huggingface")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelFilesNotFoundError, match="huggingface .* cannot be reached: HF_HUB_OFFLINE=1 forbids it"):
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))
    assert fakes.huggingface.calls == []


def test_a_failed_download_removes_the_folders_it_created(scratch_base, monkeypatch):
    def fails_midway(model_id, local_dir, allow_patterns):
        (Path(local_dir) / "transformer").mkdir(parents=True)  # as a client does before its first file arrives
        raise ConnectionError("connection reset")

    monkeypatch.setattr(resolve, "download_from_modelscope", fails_midway)
    (scratch_base.root / "Qwen").mkdir()
    (scratch_base.root / "Qwen" / "notes.txt").write_text("mine")
    with pytest.raises(ModelFilesNotFoundError, match="ConnectionError: connection reset"):
        resolve_files(ModelConfig(model_id=QWEN, origin_file_pattern=DIT))
    # The repository folder it made is gone; the folder that was there before stays, with its file.
    assert sorted(path.name for path in scratch_base.root.rglob("*")) == ["Qwen", "notes.txt"]
