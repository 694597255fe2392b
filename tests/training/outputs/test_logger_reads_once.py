"""The logger's start-up reads done once: ``metrics.csv`` on resume, the base skeleton on the first LoRA save."""

import builtins
import functools
import io

from diffsynth.training.outputs.logger import METRICS_FILE, ModelLogger
from tests.lora.test_tools import RANK, lora_model


def count_openings(monkeypatch, path) -> list:
    """Records the mode of every ``open`` of ``path`` (``Path.read_bytes`` and ``read_text`` open through io)."""
    modes, real_open = [], builtins.open

    def counting_open(file, mode="r", *args, **kwargs):
        if str(file) == str(path):
            modes.append(mode)
        return real_open(file, mode, *args, **kwargs)

    for module in (builtins, io):
        monkeypatch.setattr(module, "open", counting_open)
    return modes


def test_a_resume_reads_metrics_csv_once(tmp_path, monkeypatch):
    csv_path = tmp_path / METRICS_FILE
    csv_path.parent.mkdir()
    csv_path.write_text("step,loss,lr\n1,0.25,0.0001\n2,0.5,0.0001\n3,0.75,0.0001\n4,0.7")  # killed mid-row
    modes = count_openings(monkeypatch, csv_path)
    with ModelLogger(tmp_path, enable_csv_log=True, resume_step=2) as resumed:
        assert resumed.loss_history.steps == [1, 2]
        resumed.log_metrics(3, {"loss": 0.125, "lr": 2e-4})
    assert [mode for mode in modes if "r" in mode or "+" in mode] == ["rb"]  # the chart and the CSV share one read
    assert csv_path.read_text() == "step,loss,lr\n1,0.25,0.0001\n2,0.5,0.0001\n3,0.125,0.0002\n"


def test_the_first_save_builds_the_base_skeleton_once(tiny_root, tmp_path, monkeypatch):
    """A layout diffusers cannot take gets a twin, and the twin is checked too: both checks use one skeleton."""
    from diffusers import WanTransformer3DModel

    from diffsynth.testing.tiny_models import WAN_I2V_MODEL_ID

    base, model = lora_model(WanTransformer3DModel, tiny_root / WAN_I2V_MODEL_ID / "transformer",
                             ["add_k_proj", "to_q"])
    state = {"pipe.dit." + key: value for key, value in model.named_parameters() if ".lora_" in key}
    config = {key: value for key, value in dict(base.config).items() if not key.startswith("_")}
    builds, real_init = [], WanTransformer3DModel.__init__

    @functools.wraps(real_init)
    def counting_init(self, *args, **kwargs):
        builds.append(type(self).__name__)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(WanTransformer3DModel, "__init__", counting_init)
    logger = ModelLogger(tmp_path, lora_metadata={"lora_rank": RANK, "lora_alpha": 4, "base_model_class":
                                                  "WanTransformer3DModel", "base_model_config": config})
    logger.save_lora(state, "epoch-0")
    assert (tmp_path / "epoch-0.diffusers.safetensors").is_file()  # the twin was written and checked
    logger.save_lora(state, "epoch-1")
    assert len(builds) == 1
