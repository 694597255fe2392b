"""The docs' figure of the timestep rules is drawn by a script that keeps working and gives the same file each time."""

import importlib.util
from pathlib import Path

from PIL import Image

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_timestep_sampling.py"


def test_the_figure_has_a_panel_per_rule_and_is_reproducible(tmp_path):
    spec = importlib.util.spec_from_file_location("plot_timestep_sampling", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    first = script.main(["--output", str(tmp_path / "a.png"), "--draws", "300"])
    second = script.main(["--output", str(tmp_path / "b.png"), "--draws", "300"])
    panels = len(script.RULES) + 1  # and the loss weights
    with Image.open(first) as image:
        assert image.size == (script.PANEL[0] * 5, script.PANEL[1] * ((panels + 4) // 5))
    assert first.read_bytes() == second.read_bytes()
    assert (Path(script.REPO) / "docs" / "images" / "timestep_sampling.png").is_file()
