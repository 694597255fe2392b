"""Downloads before loading: every folder a pipeline reads, its companions included, is fetched once per machine,
inside the trainer's barrier, before any process loads."""

import json
import os
import subprocess
import sys

import pytest
from accelerate import Accelerator

from diffsynth.core.loader import ModelConfig, resolve
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
    WAN_I2V_MODEL_ID,
    WAN_I2V_PATTERNS,
)
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.startup import load_pipeline
from tests.core.loader.test_resolve import FakeDownloader
from tests.training.test_trainer import TRAIN_PY

MODELS = ("dit", "text_encoder", "vae", "image_encoder")


@pytest.fixture
def downloader(tiny_root, tmp_path, monkeypatch):
    """An empty model base; downloads copy from the tiny Wan I2V repo and are recorded."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path / "models"))
    fake = FakeDownloader(tiny_root / WAN_I2V_MODEL_ID)
    monkeypatch.setattr(resolve, "download_from_modelscope", fake)
    return fake


def test_companion_folders_are_downloaded_before_the_pipeline_loads(downloader, tmp_path, monkeypatch,
                                                                   fresh_accelerate_state):
    fetched_before_loading = []
    original = WanVideoPipeline.from_pretrained.__func__

    def from_pretrained(cls, **kwargs):
        fetched_before_loading.extend(pattern for _, _, patterns in downloader.calls for pattern in patterns)
        return original(cls, **kwargs)

    monkeypatch.setattr(WanVideoPipeline, "from_pretrained", classmethod(from_pretrained))
    models = ",".join(f"{WAN_I2V_MODEL_ID}:{WAN_I2V_PATTERNS[name]}" for name in MODELS)
    args = parse_args(["--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
                       "q,k", "--dataset_metadata_path", str(tmp_path / "metadata.csv"), "--torch_dtype", "float32",
                       "--output_path", str(tmp_path / "out")], video=True)
    pipe = load_pipeline(args, WanVideoPipeline, Accelerator(cpu=True))
    assert pipe.tokenizer is not None and pipe.image_processor is not None
    assert {"tokenizer/*", "image_processor/*"} <= set(fetched_before_loading)
    assert len(downloader.calls) == len(MODELS) + 2, "a folder was downloaded while the pipeline loaded"


def test_companion_configs_follow_the_slots_the_model_classes_fill(base):
    def qwen(*names):
        return [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[n]) for n in names]

    tokenizer = ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern="tokenizer/")
    assert QwenImagePipeline.companion_configs(qwen("dit", "text_encoder")) == [tokenizer]
    assert QwenImagePipeline.companion_configs(qwen("dit", "vae")) == []
    assert QwenImagePipeline.companion_configs(qwen("text_encoder", "tokenizer")) == []
    own = ModelConfig(path=str(base / QWEN_IMAGE_MODEL_ID / "tokenizer"))
    assert QwenImagePipeline.companion_configs(qwen("text_encoder"), tokenizer_config=own) == [own]


# Runs train.py with every socket connection recorded (one JSON line per attempt), so the test counts the network
# attempts of a run instead of timing it.
COUNTING_RUN = """
import json, runpy, socket, sys
log, train_py = sys.argv[1], sys.argv[2]
connect = socket.socket.connect
def counted(self, address):
    with open(log, "a") as file:
        file.write(json.dumps(list(address) if isinstance(address, tuple) else address) + "\\n")
    return connect(self, address)
socket.socket.connect = counted
sys.argv = sys.argv[2:]
runpy.run_path(train_py, run_name="__main__")
"""


def test_an_offline_run_with_missing_models_fails_at_its_one_hub_check_with_one_message(tmp_path):
    """The README's training section followed from the top on a machine without the models and without a hub in
    reach, run for real in processes of their own: the hubs' addresses point at a local port nobody listens on, so no
    test machine's network is used, and the user's view is the real path up to the hub check. It fails after one
    connection attempt to the hub (refused at once; a silent hub is given up after reachability's timeout), with
    no download tried: counted, not timed, so a busy machine cannot fail it."""
    from diffsynth.core.loader import reachability
    from tests.core.loader.test_reachability import closed_port
    from tests.docs.test_readme import training_commands

    dataset, trainings = training_commands()
    subprocess.run([sys.executable, *dataset[1:]], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    port = closed_port()
    hub = f"http://127.0.0.1:{port}"
    env = {name: value for name, value in os.environ.items()
           if not name.lower().endswith("_proxy") and not name.startswith("DIFFSYNTH_")}
    env.update({"MODELSCOPE_ENDPOINT": hub, "HF_ENDPOINT": hub, "OMP_NUM_THREADS": "1"})
    log = tmp_path.parent / f"{tmp_path.name}-connections.jsonl"
    done = subprocess.run([sys.executable, "-c", COUNTING_RUN, str(log), str(TRAIN_PY), *trainings[0]], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    attempts = [json.loads(line) for line in log.read_text().splitlines()]
    assert attempts == [["127.0.0.1", port]], attempts
    assert reachability.TIMEOUT_SECONDS <= 5  # the bound on that one attempt, were the hub silent
    assert "Traceback" not in done.stderr and done.stderr.count("error: ") == 1, done.stderr
    assert (f"model '{QWEN_IMAGE_MODEL_ID}', pattern '{QWEN_IMAGE_PATTERNS['dit']}': no usable files in "
            in done.stderr)
    assert f"The download failed: modelscope ({hub}) cannot be reached: cannot connect to 127.0.0.1:" in done.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["data"]  # neither models/ nor the output folder is left
