"""``--masked_loss`` through the trainer on the tiny Qwen-Image (images) and Wan (videos).

Same seed and data in every run, so the LoRA files compare exactly: an all-white mask (or ``--unmasked_weight 1``)
trains what no mask trains, an all-black one with weight 0 leaves the LoRA at its start (``lora_B`` zero) with finite
losses, a half mask trains something else again; the split run gives the one-stage LoRA; bad mask files stop the run
before training, naming row and file, with no LoRA or checkpoint written.
"""

import csv

import pytest
import torch
from PIL import Image

from diffsynth.core.data.errors import DataFileNotFoundError, DatasetError
from diffsynth.core.data.example_dataset import (
    VIDEO_SIZE,
    build_example_dataset,
    build_example_video_dataset,
    write_gif,
)
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, WAN_MODEL_ID, WAN_PATTERNS
from diffsynth.training.entry import main
from tests.conftest import reset_accelerate_state
from tests.training.conftest import lora, max_difference

QWEN = [
    "--model_id_with_origin_paths", ",".join(f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS[name]}"
                                             for name in ("dit", "text_encoder", "vae")),
    "--lora_target_modules", "to_q,to_k,to_v,to_out.0,img_mlp.net.2", "--max_pixels", "4096",
]  # fmt: skip
WAN = [
    "--model_id_with_origin_paths", ",".join(f"{WAN_MODEL_ID}:{WAN_PATTERNS[name]}"
                                             for name in ("dit", "text_encoder", "vae")),
    "--lora_target_modules", "q,k,v,o,ffn.0,ffn.2", "--max_pixels", "4096", "--num_frames", "5",
]  # fmt: skip
COMMON = ["--lora_base_model", "dit", "--lora_rank", "4", "--learning_rate", "1e-3", "--torch_dtype", "float32",
          "--seed", "5", "--num_epochs", "2"]
MASKED = ["--masked_loss", "--data_file_keys", "image,video,mask"]


def mask_image(size, kind: str) -> Image.Image:
    """A grayscale mask: ``white``, ``black``, or ``half`` (the left half white)."""
    mask = Image.new("L", size, 0 if kind == "black" else 255)
    if kind == "half":
        mask.paste(0, (size[0] // 2, 0, size[0], size[1]))
    return mask


def add_masks(folder, column: str, kinds, name: str) -> str:
    """Writes ``<name>.csv``: the example metadata with a mask per row (``kinds[i]``: a kind of ``mask_image``, a
    callable writing the file and returning its name, or "" for none); returns its file name."""
    with open(folder / "metadata.csv", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    lines = [[*header, "mask"]]
    for index, (row, kind) in enumerate(zip(rows, kinds)):
        if callable(kind):
            cell = kind(folder, row[header.index(column)])
        elif kind:
            size = VIDEO_SIZE if column == "video" else Image.open(folder / row[header.index(column)]).size
            cell = f"{name}_{index}.png"
            mask_image(size, kind).save(folder / cell)
        else:
            cell = ""
        lines.append([*row, cell])
    with open(folder / f"{name}.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(lines)
    return f"{name}.csv"


def half_mask_video(folder, clip: str) -> str:
    """A mask video for ``clip``: its frames' size, its frame count, the white part growing frame by frame."""
    with Image.open(folder / clip) as video:
        size, frames = video.size, video.n_frames
    masks = []
    for index in range(frames):
        mask = Image.new("L", size, 0)
        mask.paste(255, (0, 0, size[0] * (index + 1) // (frames + 1), size[1]))
        masks.append(mask)
    write_gif(folder / "mask_video.gif", masks)
    return "mask_video.gif"


class Runs:
    """One family's trainer runs on one dataset, each run once; ``output(name)`` is a run's folder."""

    def __init__(self, pipeline, family_flags, data, folder, tiny_root, video=False):
        self.pipeline, self.family_flags, self.data, self.folder = pipeline, family_flags, data, folder
        self.tiny_root, self.video, self.results = tiny_root, video, {}

    def argv(self, output, metadata, *extra):
        dataset = ["--dataset_base_path", str(self.data)]
        if metadata is not None:
            dataset += ["--dataset_metadata_path", str(self.data / metadata)]
        return [*dataset, *self.family_flags, *COMMON, "--output_path", str(output), *extra]

    def run(self, name, metadata, *extra):
        """Trains once as ``name`` (a later call returns the first result); returns ``(output, result)``."""
        output = self.folder / name
        if name not in self.results:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(self.tiny_root))
                try:
                    self.results[name] = main(self.pipeline, self.argv(output, metadata, *extra), video=self.video)
                finally:
                    reset_accelerate_state()
        return output, self.results[name]

    def lora(self, name, metadata="metadata.csv", *extra):
        output, result = self.run(name, metadata, *extra)
        assert result["global_step"] > 0 and all(torch.isfinite(torch.tensor(result["losses"])))
        return lora(output)


def assert_untrained(weights, result):
    """The LoRA is still its start: every ``lora_B`` is exactly zero; every loss was 0 and finite."""
    ups = [value for key, value in weights.items() if "lora_B" in key]
    assert ups and all(torch.equal(value, torch.zeros_like(value)) for value in ups)
    assert result["losses"] and all(loss == 0.0 for loss in result["losses"])


def assert_same(first, second):
    assert first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


# ---- Qwen-Image ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("masked_images")
    build_example_dataset(folder, num_images=3)
    for kind in ("white", "black"):
        add_masks(folder, "image", [kind] * 3, kind)
    add_masks(folder, "image", ["half", "", "half"], "half")  # row 2 trains unmasked
    return folder


@pytest.fixture(scope="module")
def qwen(images, tmp_path_factory, tiny_root):
    return Runs(QwenImagePipeline, QWEN, images, tmp_path_factory.mktemp("masked_qwen"), tiny_root)


def test_a_white_mask_or_a_weight_of_one_trains_the_unmasked_lora(qwen):
    plain = qwen.lora("plain")
    assert_same(qwen.lora("white", "white.csv", *MASKED), plain)
    assert_same(qwen.lora("half_weight_1", "half.csv", *MASKED, "--unmasked_weight", "1.0"), plain)


def test_a_black_mask_with_weight_zero_learns_nothing(qwen):
    weights = qwen.lora("black", "black.csv", *MASKED)
    assert_untrained(weights, qwen.results["black"])


def test_a_half_mask_trains_something_else_and_the_weight_moves_it(qwen):
    half, plain = qwen.lora("half", "half.csv", *MASKED), qwen.lora("plain")
    assert max_difference(half, plain) > 1e-4
    assert max(value.abs().max().item() for key, value in half.items() if "lora_B" in key) > 1e-4
    weighted = qwen.lora("half_weight", "half.csv", *MASKED, "--unmasked_weight", "0.3")
    assert max_difference(weighted, half) > 1e-5 and max_difference(weighted, plain) > 1e-5


def test_a_batch_mixes_masked_and_unmasked_rows(qwen):
    _, result = qwen.run("batched", "half.csv", *MASKED, "--batch_size", "3", "--height", "32", "--width",
                              "32")
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))


def test_split_training_applies_the_cached_masks(qwen):
    cache = qwen.folder / "half_cache"
    models = QWEN[1].split(",")
    stage_one = ["--model_id_with_origin_paths", ",".join(models[1:])]  # the encoders only
    qwen.run("half_cache", "half.csv", *MASKED, "--task", "sft:data_process", *stage_one)
    stage_two = ["--model_id_with_origin_paths", models[0], "--lora_target_modules", QWEN[3]]
    output, _ = qwen.run("half_split", None, "--dataset_base_path", str(cache), "--task", "sft:train",
                         "--masked_loss", *stage_two)
    assert max_difference(lora(output), qwen.lora("half", "half.csv", *MASKED)) < 1e-6
    # A masked cache refuses a run without --masked_loss.
    with pytest.raises(ValueError, match="masked_loss"):
        qwen.run("half_split_unmasked", None, "--dataset_base_path", str(cache), "--task", "sft:train", *stage_two)


def test_masks_with_regularization_images_and_a_loha_train_together(qwen, tmp_path_factory):
    """Issue 47's options in one run: masked rows, regularization images without a mask column (they train
    unmasked), --prior_loss_weight and a LoHa."""
    reg = tmp_path_factory.mktemp("masked_reg")
    build_example_dataset(reg, num_images=2, seed=3)
    output, result = qwen.run("with_reg", "half.csv", *MASKED, "--reg_dataset_metadata_path",
                              str(reg / "metadata.csv"), "--reg_dataset_base_path", str(reg), "--prior_loss_weight",
                              "0.5", "--lora_type", "loha", "--enable_csv_log")
    # Kohya's proportion: 3 training draws and as many regularization draws an epoch, for 2 epochs.
    assert result["global_step"] == 2 * (3 + 3) and all(torch.isfinite(torch.tensor(result["losses"])))
    weights = lora(output)
    assert any(key.endswith("hada_w1_a") for key in weights) and not any("lora_B" in key for key in weights)
    with open(output / "logs" / "metrics.csv", newline="", encoding="utf-8") as handle:
        priors = [row["loss_prior"] for row in csv.DictReader(handle) if row["loss_prior"]]
    assert priors and all(float(value) >= 0 for value in priors)


def broken(folder, image):
    (folder / "broken.png").write_bytes(b"\x89PNG but nothing else")
    return "broken.png"


def tall(folder, image):
    width, height = Image.open(folder / image).size
    mask_image((width + 16, height), "white").save(folder / "wrong_size.png")
    return "wrong_size.png"


@pytest.mark.parametrize(("writer", "file", "said"), [
    (lambda folder, image: "gone.png", "gone.png", "does not exist"),
    (broken, "broken.png", "is not an image"),
    (tall, "wrong_size.png", "a mask must have the size of what it masks"),
], ids=["missing", "unreadable", "wrong_size"])
def test_a_bad_mask_stops_the_run_before_training_naming_row_and_file(qwen, monkeypatch, writer, file, said):
    from diffsynth.core.loader import loading

    name = add_masks(qwen.data, "image", ["white", writer, "white"], f"bad_{file.split('.')[0]}")
    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("a model was loaded"))
    output = qwen.folder / f"bad_{file}"
    with pytest.raises((DatasetError, DataFileNotFoundError)) as error:
        qwen.run(f"bad_{file}", name, *MASKED)
    message = str(error.value)
    assert "row 2 column 'mask'" in message and file in message and said in message
    assert not output.exists()  # no LoRA, no checkpoint, no folder


# ---- Wan -----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("masked_videos")
    build_example_video_dataset(folder, num_videos=2, num_frames=6)
    for kind in ("white", "black"):
        add_masks(folder, "video", [kind] * 2, kind)  # one mask image for every frame
    add_masks(folder, "video", ["half", half_mask_video], "half")  # an image for the mp4, a mask video for the gif
    return folder


@pytest.fixture(scope="module")
def wan(videos, tmp_path_factory, tiny_root):
    return Runs(WanVideoPipeline, WAN, videos, tmp_path_factory.mktemp("masked_wan"), tiny_root, video=True)


def test_wan_white_black_and_half_masks(wan):
    plain = wan.lora("plain")
    assert_same(wan.lora("white", "white.csv", *MASKED), plain)
    assert_untrained(wan.lora("black", "black.csv", *MASKED), wan.results["black"])
    half = wan.lora("half", "half.csv", *MASKED)
    assert max_difference(half, plain) > 1e-5
    assert max(value.abs().max().item() for key, value in half.items() if "lora_B" in key) > 1e-5
