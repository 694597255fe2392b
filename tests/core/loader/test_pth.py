"""``.pth`` state dicts are read only by PyTorch's restricted loader, memory-mapped, and must hold only tensors."""

import pickle

import pytest
import torch

from diffsynth.core.loader import ModelLoadError
from diffsynth.core.loader.pth import PthCheckpoint, read_pth_state_dict


def test_a_flat_state_dict_reads_back_equal(tmp_path):
    state = {"a.weight": torch.randn(3, 4), "b": torch.arange(5)}
    torch.save(state, tmp_path / "model.pth")
    loaded = read_pth_state_dict(tmp_path / "model.pth")
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[key], value) for key, value in state.items())
    with PthCheckpoint(tmp_path / "model.pth") as checkpoint:
        assert checkpoint.keys() == ["a.weight", "b"] and checkpoint.shape("a.weight") == (3, 4)


class _Payload:
    """Unpickling this object would write a file: the proof that a loader ran code from the checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "code_ran"
    with open(tmp_path / "evil.pth", "wb") as handle:
        pickle.dump({"weight": _Payload(marker)}, handle)
    torch.save({"weight": torch.ones(1), "module": torch.nn.Linear(1, 1)}, tmp_path / "module.pth")
    for name in ("evil.pth", "module.pth"):
        with pytest.raises(ModelLoadError) as error:
            read_pth_state_dict(tmp_path / name)
        assert name in str(error.value)
    assert not marker.exists()


def test_a_truncated_file_names_itself_and_the_fix(tmp_path):
    torch.save({"weight": torch.randn(64, 64)}, tmp_path / "whole.pth")
    data = (tmp_path / "whole.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.pth.*truncated.*re-download"):
        read_pth_state_dict(tmp_path / "cut.pth")


@pytest.mark.parametrize(("payload", "message"), [
    ({"weight": torch.ones(2), "step": 3}, r"holds a int under key 'step'"),
    ([torch.ones(2)], r"holds a list, not a state dict"),
    ({"inner": {"weight": torch.ones(2)}}, r"holds a dict under key 'inner'"),
])  # fmt: skip
def test_anything_but_a_flat_dict_of_tensors_is_refused(tmp_path, payload, message):
    torch.save(payload, tmp_path / "other.pth")
    with pytest.raises(ModelLoadError, match=r"other\.pth " + message):
        read_pth_state_dict(tmp_path / "other.pth")


def test_files_that_cannot_be_memory_mapped_are_refused(tmp_path):
    # The old (pre-1.6) format loads without mmap; refusing it shows the reader maps files and never reads them whole.
    torch.save({"weight": torch.ones(2)}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    (tmp_path / "text.pth").write_text("not a checkpoint")
    for name in ("legacy.pth", "text.pth"):
        with pytest.raises(ModelLoadError, match=name.replace(".", r"\.") + r".*memory-mapped"):
            read_pth_state_dict(tmp_path / name)
    with pytest.raises(ModelLoadError, match="does not exist"):
        read_pth_state_dict(tmp_path / "missing.pth")
