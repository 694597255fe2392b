"""bitsandbytes' 4-bit layout read as it is stored: which keys are statistics, which fused weights split in packed
form, and what is refused. (Loading a whole release: ``tests/pipelines/test_ideogram4.py``.)"""

from pathlib import Path

import pytest
import torch

from diffsynth.core.loader.errors import ModelLoadError
from diffsynth.core.loader.nf4_layout import PackedWeight, check_split, is_statistic, linear4bit_shells


def test_statistics_are_told_from_weights():
    assert all(map(is_statistic, ["a.weight.absmax", "a.weight.quant_map", "a.weight.nested_absmax",
                                  "a.weight.quant_state.bitsandbytes__nf4", "b.0.weight.quant_state.bitsandbytes__fp4"]))
    assert not any(map(is_statistic, ["a.weight", "a.bias", "weight.absmax", "a.weight_scale", "a.weight.other"]))


def test_a_fused_weight_splits_only_into_whole_blocks():
    state = {"quant_type": "nf4", "blocksize": 64, "dtype": "float32"}
    check_split(PackedWeight(Path("f"), "qkv.weight", (3 * 4, 16), 64, state), 3)  # 64 values a part
    with pytest.raises(ModelLoadError, match="qkv.weight \\[12, 8\\] does not split into 3 parts of whole 64-value"):
        check_split(PackedWeight(Path("f"), "qkv.weight", (3 * 4, 8), 64, state), 3)
    with pytest.raises(ModelLoadError, match="does not split"):
        check_split(PackedWeight(Path("f"), "qkv.weight", (3 * 4 + 1, 64), 64, state), 3)


def test_a_packed_tensor_that_is_no_linear_weight_is_refused():
    pytest.importorskip("bitsandbytes")
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.LayerNorm(8))
    linear4bit_shells(model, ["0.weight"], torch.float32)
    assert type(model[0]).__name__ == "Linear4bit" and model[0].weight.shape == (256, 1)
    with pytest.raises(ModelLoadError, match="'1.weight' is not the weight of a Linear layer of Sequential"):
        linear4bit_shells(model, ["1.weight"], torch.float32)
