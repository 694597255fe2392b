"""``logs/loss.png``: drawn after every save, a PNG of the chart's size with the loss, its average and the LR."""

import math

import numpy as np
import pytest
from PIL import Image

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main
from diffsynth.training.outputs import logger as logger_module
from diffsynth.training.outputs.logger import METRICS_FILE, ModelLogger
from diffsynth.training.outputs.loss_chart import (
    _COLOURS,
    CHART_SIZE,
    LOSS_CHART_FILE,
    LossHistory,
    average_window,
    draw_loss_chart,
    moving_average,
    nice_ticks,
)
from tests.training.test_trainer import COMMON, raw


def pixels_of(image, colour):
    return int((np.asarray(image) == np.array(colour, dtype=np.uint8)).all(axis=-1).sum())


def history(losses, lr=1e-4):
    steps = LossHistory()
    for step, loss in enumerate(losses, start=1):
        steps.add(step, loss, lr * step / len(losses))
    return steps


def test_the_chart_is_a_png_of_its_size_with_the_three_curves(tmp_path):
    losses = [1.0 / (1 + step / 20) + 0.2 * math.sin(step) for step in range(200)]
    path = draw_loss_chart(history(losses), tmp_path / "logs" / "loss.png")
    assert path == tmp_path / "logs" / "loss.png"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert (image.format, image.size) == ("PNG", CHART_SIZE)
        rgb = image.convert("RGB")
    for name in ("loss", "average", "lr"):
        assert pixels_of(rgb, _COLOURS[name]) > 100, name
    assert pixels_of(rgb, _COLOURS["nonfinite"]) == 0
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["loss.png"]  # no temporary file left


def test_non_finite_steps_are_marked_and_break_the_line(tmp_path):
    losses = [0.5, 0.4, float("nan"), 0.45, float("inf"), 0.3]
    with Image.open(draw_loss_chart(history(losses), tmp_path / "loss.png")) as image:
        assert pixels_of(image.convert("RGB"), _COLOURS["nonfinite"]) > 20


def test_a_single_step_and_an_empty_history():
    with pytest.raises(ValueError, match="at least one step"):
        draw_loss_chart(LossHistory(), "unused.png")


def test_a_single_step_is_drawn(tmp_path):
    with Image.open(draw_loss_chart(history([0.5]), tmp_path / "loss.png")) as image:
        assert image.size == CHART_SIZE and pixels_of(image.convert("RGB"), _COLOURS["average"]) > 0


def test_moving_average_skips_non_finite_values():
    nan = float("nan")
    averaged = moving_average([1.0, 2.0, 3.0, nan, 5.0, nan, nan], 2)
    assert averaged[:5] == [1.0, 1.5, 2.5, 3.0, 5.0] and averaged[5] == 5.0 and math.isnan(averaged[6])
    assert [average_window(n) for n in (1, 30, 500, 10_000)] == [1, 3, 50, 100]


def test_ticks_are_round_and_inside_the_range():
    assert nice_ticks(0.23, 1.17) == pytest.approx([0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(0, 1000, count=4) == pytest.approx([0, 500, 1000])
    assert nice_ticks(9e-5, 1.1e-4, count=4) == pytest.approx([9e-5, 9.5e-5, 1e-4, 1.05e-4, 1.1e-4])
    assert nice_ticks(3.0, 3.0) == [3.0]


def test_history_from_the_metrics_csv(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss,lr,nonfinite_steps\n1,0.5,0.0001,0\n2,nan,0.0001,1\nx,1,1,0\n3,0.25,0.0002,1\n"
                    "4,0.1,0.0002,1\n")
    loaded = LossHistory.from_metrics_csv(path, up_to_step=3)
    assert loaded.steps == [1, 2, 3] and loaded.losses[0] == 0.5 and math.isnan(loaded.losses[1])
    assert loaded.learning_rates == [1e-4, 1e-4, 2e-4]
    assert LossHistory.from_metrics_csv(tmp_path / "missing.csv", 3).steps == []


def test_a_resumed_logger_charts_the_steps_before_its_checkpoint(tmp_path):
    with ModelLogger(tmp_path, remove_prefix_in_ckpt="", enable_csv_log=True) as first:
        for step in range(1, 6):
            first.on_step_end(step, 1.0 / step, 1e-4, dict)
    with ModelLogger(tmp_path, remove_prefix_in_ckpt="", enable_csv_log=True, resume_step=3) as resumed:
        assert resumed.loss_history.steps == [1, 2, 3]
        resumed.on_step_end(4, 0.2, 1e-4, dict)
        assert resumed.loss_history.steps == [1, 2, 3, 4]
    assert (tmp_path / METRICS_FILE).is_file()
    assert ModelLogger(tmp_path / "other", is_main_process=False).loss_history.steps == []


def test_the_trainer_redraws_the_chart_after_every_save(dataset, tmp_path, base, fresh_accelerate_state,
                                                        monkeypatch):
    drawn = []

    def record(chart_history, path, title):
        drawn.append(list(chart_history.steps))
        return draw_loss_chart(chart_history, path, title)

    monkeypatch.setattr(logger_module, "draw_loss_chart", record)
    output = tmp_path / "out"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--dataset_repeat", "2",
                             "--max_train_steps", "5", "--save_steps", "2"])
    # Saves at steps 2 and 4 (--save_steps) and at the end of the run (step 5).
    assert drawn == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]]
    with Image.open(output / LOSS_CHART_FILE) as image:
        assert (image.format, image.size) == ("PNG", CHART_SIZE)
