import logging

import pytest

from diffsynth.training.config.errors import FlagError
from diffsynth.training.placement.deepspeed import match_gradient_clipping

pytest.importorskip("deepspeed")


def accelerate_fill(config: dict) -> dict:
    """The config as accelerate hands it to DeepSpeed at ``prepare``: its ``auto`` values filled (clipping 1.0)."""
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, **config})
    plugin.deepspeed_config_process(must_match=False, gradient_clipping=1.0)
    return plugin.deepspeed_config


def test_the_flags_norm_replaces_auto_and_accelerate_keeps_it():
    config = {"gradient_clipping": "auto"}
    match_gradient_clipping(config, 0.25)
    assert accelerate_fill(config)["gradient_clipping"] == 0.25


def test_without_the_flag_auto_stays_the_references_one_and_is_said(caplog):
    config = {"gradient_clipping": "auto"}
    with caplog.at_level(logging.INFO):
        match_gradient_clipping(config, None)
    assert accelerate_fill(config)["gradient_clipping"] == 1.0
    assert "clips gradients at norm 1.0" in caplog.text and "--max_grad_norm" in caplog.text


def test_a_config_number_that_disagrees_with_the_flag_is_refused_by_name():
    with pytest.raises(FlagError) as error:
        match_gradient_clipping({"gradient_clipping": 1.0}, 0.5)
    assert "--max_grad_norm 0.5" in str(error.value) and "gradient_clipping 1.0" in str(error.value)
    match_gradient_clipping({"gradient_clipping": 0.5}, 0.5)  # the same norm twice is no conflict
