"""The libraries' notices that say nothing about a run are kept out of the console, and ``--debug`` shows them
(``core.library_notices.LIBRARY_NOTICES``); every other record of the same loggers passes."""

import logging
import os
import subprocess
import sys

import pytest
import torch
from diffusers import AutoencoderKL

from diffsynth.core.library_notices import LIBRARY_NOTICES, quiet_library_notices
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.training.entry import main

# Each notice as its library logs it (the calls of the installed versions), by the logger that logs it.
NOTICES = {
    "bitsandbytes.backends.cpu.ops": (
        ("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already `pip install "
         "kernels` and the kernels >= 0.11.1"), ModuleNotFoundError("No module named 'kernels'")),
    "DeepSpeed": ("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.",),
    "diffusers.models.modeling_utils": (
        ("There are modules in QwenImageTransformer2DModel that should be kept in float32: []. Casting directly with "
         "`to()` can lead to inconsistent results; set `torch_dtype` in `from_pretrained()` instead to keep these "
         "modules in float32."),),
    "accelerate.commands.launch": (
        ("The following values were not passed to `accelerate launch` and had defaults used instead:\n\t"
         "`--num_processes` was set to a value of `1`\n\t`--num_machines` was set to a value of `1`\nTo avoid this "
         "warning pass in values for each of the problematic parameters or run `accelerate config`."),),
}


@pytest.fixture
def records(monkeypatch):
    """The messages each notice's logger passes on, by logger name; the loggers' filters are restored after."""
    monkeypatch.delenv("DIFFSYNTH_DEBUG", raising=False)
    passed = {name: [] for name in LIBRARY_NOTICES}
    handlers = {}
    for name in LIBRARY_NOTICES:
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "filters", list(logger.filters))  # a trainer run in this process left its own
        handlers[name] = logging.Handler(logging.WARNING)
        handlers[name].emit = lambda record, name=name: passed[name].append(record.getMessage())
        logger.addHandler(handlers[name])  # on the logger itself: DeepSpeed's does not propagate
    yield passed
    for name, handler in handlers.items():
        logging.getLogger(name).removeHandler(handler)


def log_every_notice() -> None:
    for name, arguments in NOTICES.items():
        logging.getLogger(name).warning(*arguments)
        logging.getLogger(name).warning("a record of %s that is no such notice", name)


def test_the_notices_are_kept_out_and_the_other_records_pass(records):
    assert set(NOTICES) == set(LIBRARY_NOTICES)
    quiet_library_notices()
    quiet_library_notices()  # a second call (a second run in one process) changes nothing
    log_every_notice()
    assert records == {name: [f"a record of {name} that is no such notice"] for name in NOTICES}


def test_debug_lets_them_through(records):
    quiet_library_notices()
    quiet_library_notices(debug=True)
    log_every_notice()
    assert all(len(messages) == 2 for messages in records.values()), records


def test_the_launcher_notice_is_kept_when_it_turned_on_several_processes(records):
    quiet_library_notices()
    several = ("The following values were not passed to `accelerate launch` and had defaults used instead:\n"
               "\t`--num_processes` was set to a value of `8`\n\t\tMore than one GPU was found, enabling multi-GPU "
               "training.\n\t\tIf this was unintended please pass in `--num_processes=1`.")
    logging.getLogger("accelerate.commands.launch").warning(several)
    assert records["accelerate.commands.launch"] == [several]


def test_diffusers_casts_no_longer_print_its_float32_notice(records):
    model = AutoencoderKL(block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",), layers_per_block=1,
                          up_block_types=("UpDecoderBlock2D",), norm_num_groups=8, latent_channels=4)
    quiet_library_notices()
    model.to(torch.float32)  # diffusers' own call: its wording must still match the filter
    assert records["diffusers.models.modeling_utils"] == []
    quiet_library_notices(debug=True)
    model.to(torch.float32)
    [notice] = records["diffusers.models.modeling_utils"]
    assert notice.startswith("There are modules in AutoencoderKL that should be kept in float32")


def test_the_trainer_quiets_them_at_its_start_unless_debug(records, capsys):
    for flags, quiet in (([], True), (["--debug"], False), ([], True)):
        with pytest.raises(SystemExit):  # the bad flag stops it once the notices are set
            main(QwenImagePipeline, ["--lora_rank", "0", *flags])
        assert [notice in logging.getLogger(name).filters for name, notice in LIBRARY_NOTICES.items()] == \
            [quiet] * len(LIBRARY_NOTICES)
    capsys.readouterr()


def test_importing_the_package_keeps_the_import_time_notice_out():
    code = ("import logging, diffsynth; logger = logging.getLogger('bitsandbytes.backends.cpu.ops'); "
            "print(any(not f.filter(logging.makeLogRecord({'msg': 'Failed to load CPU gemm_4bit_forward from "
            "kernels-community: x'})) for f in logger.filters))")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "DIFFSYNTH_DEBUG": "0"})
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "DIFFSYNTH_DEBUG": "1"})
    assert (quiet.stdout.strip(), loud.stdout.strip()) == ("True", "False")
