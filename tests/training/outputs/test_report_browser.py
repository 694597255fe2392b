"""The run report page in a real browser (headless Chromium from the system packages, driven by Selenium): it opens
from file:// without a console error or a request outside file://, its script draws the chart from run-data, every
sample image loads, and the numbers it shows are those of metrics.csv.

Skipped, saying why, where chromium, chromedriver or selenium is missing (``make setup`` installs them). With
``DIFFSYNTH_UPDATE_SCREENSHOT=1`` it also writes the docs' screenshot ``docs/en/images/run_report.png``.
"""

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image, ImageDraw

from diffsynth.training.loop.live_report import LiveReport
from diffsynth.training.outputs.logger import ModelLogger
from diffsynth.training.outputs.run_report import REPORT_FILE, format_number, read_report, series_from_metrics

REPO = Path(__file__).resolve().parents[3]
SCREENSHOT = REPO / "docs" / "en" / "images" / "run_report.png"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or \
    "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is missing: pip install -e '.[dev]'")
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip("chromium / chromedriver is missing: apt-get install chromium chromium-driver (make setup does it as "
                "root)", allow_module_level=True)
PROMPTS = ["a red circle on white", "a blue square on the left", "a green triangle at dusk"]
STEPS = 60


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def sample_image(step: int, index: int) -> Image.Image:
    image = Image.new("RGB", (128, 128), (245, 245, 240))
    draw = ImageDraw.Draw(image)
    colour = [(200, 40, 40), (40, 80, 200), (40, 160, 70)][index]
    size = 20 + step // 2
    shape = [draw.ellipse, draw.rectangle, lambda box, fill: draw.polygon(
        [(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=fill)][index]
    shape((64 - size // 2, 64 - size // 2, 64 + size // 2, 64 + size // 2), fill=colour)
    return image


def make_run(folder: Path, status: str) -> Path:
    """A run's outputs as the trainer writes them: metrics.csv through the logger, samples, config.yaml, the page."""
    config = {"model_id_with_origin_paths": "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors",
              "output_path": "./models/train/Qwen-Image_lora", "learning_rate": 1e-4, "lora_rank": 32, "lora_base_model": "dit",
              "num_epochs": 1, "max_train_steps": 100, "validation_prompts": "prompts.txt", "seed": 3}
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    clock = Clock()
    generator = torch.Generator().manual_seed(0)
    with ModelLogger(folder, enable_csv_log=True) as logger:
        report = LiveReport(folder, 100, 30.0, logger.logged_series, prompts=PROMPTS, clock=clock)
        for step in range(1, STEPS + 1):
            loss = 0.12 + 0.25 * math.exp(-step / 15) + 0.08 * torch.rand((), generator=generator).item()
            metrics = {"val_loss": 0.11 + 0.2 * math.exp(-step / 15)} if step == 1 or step % 20 == 0 else {}
            logger.on_step_end(step, loss, 1e-4 * min(1.0, step / 10), dict, metrics)
            if step % 20 == 0:
                for index in range(len(PROMPTS)):
                    path = folder / "samples" / f"step-{step}" / f"{index:02d}.png"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    sample_image(step, index).save(path)
            clock.now += 1.5
            report.update(step, force=step % 20 == 0)
        if status != "running":
            report.end(status, "CUDA out of memory" if status == "failed" else None)
    return folder / REPORT_FILE


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1900", "--hide-scrollbars"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def wait_for_images(driver) -> list[dict]:
    """Opens every <details> and scrolls each image into view (they load lazily), then their load state."""
    driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true);"
                          "document.querySelectorAll('img').forEach(i => i.scrollIntoView());")
    from selenium.webdriver.support.ui import WebDriverWait

    state = "return Array.from(document.images).map(i => ({src: i.src, done: i.complete, width: i.naturalWidth}))"
    WebDriverWait(driver, 20).until(lambda d: all(image["done"] for image in d.execute_script(state)))
    return driver.execute_script(state)


def test_the_page_opens_from_file_and_shows_the_run_as_metrics_csv_has_it(browser, tmp_path):
    page = make_run(tmp_path / "run", "finished")
    browser.get_log("performance"), browser.get_log("browser")  # start clean
    browser.get(page.as_uri())
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    data, _ = read_report(page)
    metrics = series_from_metrics((page.parent / "metrics.csv").read_text())
    assert [data["loss"], data["val_loss"], data["lr"]] == [metrics["loss"], metrics["val_loss"], metrics["lr"]]
    # The chart is drawn by the page's script from run-data: one point per loss entry, a dot per val_loss entry.
    d = browser.find_element("css selector", '#loss-chart path[data-series="loss"]').get_attribute("d")
    assert len(re.findall(r"[ML]", d)) == len(metrics["loss"]) == STEPS
    assert len(browser.find_elements("css selector", "#loss-chart circle")) == len(metrics["val_loss"]) == 4
    lr_path = browser.find_element("css selector", '#lr-chart path[data-series="lr"]').get_attribute("d")
    assert len(re.findall(r"[ML]", lr_path)) == STEPS
    # The numbers shown are the last rows of metrics.csv.
    shown = {ident: browser.find_element("id", ident) for ident in ("step", "loss", "val-loss", "lr", "status")}
    assert shown["step"].text == f"{STEPS} / 100" and shown["status"].text == "finished"
    for ident, name in (("loss", "loss"), ("val-loss", "val_loss"), ("lr", "lr")):
        step, value = metrics[name][-1]
        assert float(shown[ident].get_attribute("data-value")) == value
        assert shown[ident].text == format_number(value)
    # Every sample image loaded, from the run's samples folder.
    images = wait_for_images(browser)
    assert len(images) == len(data["samples"]) == 9
    assert all(image["width"] == 128 and image["src"].startswith("file://") for image in images)
    urls = requested_urls(browser)
    assert urls and all(url.startswith(("file://", "data:")) for url in urls), urls
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def test_a_failed_page_shows_the_message_and_fits_a_phone(browser, tmp_path):
    page = make_run(tmp_path / "run", "failed")
    browser.set_window_size(390, 844)
    try:
        browser.get(page.as_uri())
        assert browser.find_element("id", "error-message").text == "CUDA out of memory"
        assert browser.find_element("id", "status").text == "failed"
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
    finally:
        browser.set_window_size(1280, 1900)


def test_a_running_page_reloads_itself(browser, tmp_path):
    page = make_run(tmp_path / "run", "running")
    browser.get(page.as_uri())
    browser.execute_script("window.notReloaded = true")
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 15, poll_frequency=0.5).until(
        lambda d: d.execute_script("return window.notReloaded === undefined"))
    if os.environ.get("DIFFSYNTH_UPDATE_SCREENSHOT"):
        wait_for_images(browser)
        browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = false); scrollTo(0, 0)")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.set_window_size(1100, 1330)
        browser.save_screenshot(str(SCREENSHOT))
        browser.set_window_size(1280, 1900)
