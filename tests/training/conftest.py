"""Fixtures shared by the trainer tests."""

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import reset_accelerate_state

from diffsynth.core.data.example_dataset import build_example_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A three-image example dataset (``metadata.csv`` with image and prompt columns), one per test module."""
    folder = tmp_path_factory.mktemp("dataset")
    build_example_dataset(folder, num_images=3)
    return folder


def lora(output, name="epoch-1"):
    """The tensors of LoRA file ``<output>/<name>.safetensors``."""
    return load_file(str(output / f"{name}.safetensors"))


def max_difference(first, second):
    """The largest absolute difference between two state dicts with the same keys."""
    assert first.keys() == second.keys()
    return max((first[key] - second[key]).abs().max().item() for key in first)


def run_once(tiny_root, folder, train):
    """A module's reference run: ``train(output)`` in this process on the tiny repos, accelerate's state reset after;
    returns ``(output, result)``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        output = folder / "out"
        result = train(output)
    reset_accelerate_state()
    return output, result


def dataset_args(dataset, models: str | None = None) -> list[str]:
    """The flags of the example dataset in folder ``dataset`` (its ``metadata.csv``), and of ``models`` if given."""
    argv = ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv")]
    return argv if models is None else [*argv, "--model_id_with_origin_paths", models]


def assert_trained(result, steps: int) -> None:
    """A run took ``steps`` optimizer steps, every loss finite."""
    assert result["global_step"] == steps and all(torch.isfinite(torch.tensor(result["losses"])))


def reference_lora(reference, steps: int):
    """The ``epoch-0`` LoRA of a module's reference run ``(output, result)``, which took ``steps`` finite steps."""
    output, result = reference
    assert_trained(result, steps)
    return lora(output, "epoch-0")


def quant_cases(dit: str) -> list:
    """``--fp8_models`` and NF4 ``--quant_options`` for the model ``dit`` (NF4 needs bitsandbytes), ids fp8 and nf4."""
    from tests.core.test_quant import needs_bitsandbytes

    return [pytest.param(["--fp8_models", dit], id="fp8"),
            pytest.param(["--quant_options", f"{dit}:bitsandbytes_nf4"], marks=needs_bitsandbytes, id="nf4")]


def assert_samples_while_training(train, tmp_path) -> None:
    """``train(output, *flags)`` with buckets of three samples and a sample rendered every step takes one step and
    writes the sample image under ``output``."""
    (tmp_path / "prompts.txt").write_text("a red square\n")
    result = train(tmp_path / "out", "--batch_size", "3", "--height", "32", "--width", "32", "--validation_prompts",
                   str(tmp_path / "prompts.txt"), "--validation_steps", "1", "--validation_num_inference_steps", "1")
    assert result["global_step"] == 1
    assert list((tmp_path / "out").rglob("*.png"))
