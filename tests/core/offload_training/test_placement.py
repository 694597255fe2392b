import torch
from torch import nn

from diffsynth.core.offload_training import plan_units

from .models import make_model


class Codec(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.decoder = nn.Linear(4, 4)
        self.bias = nn.Parameter(torch.zeros(4))

    def encode(self, x):
        return self.encoder(x) + self.bias

    def decode(self, x):
        return self.decoder(x)


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.table = nn.ParameterList([nn.Parameter(torch.zeros(4))])
        self.codec = Codec()

    def forward(self, x):
        return x


def names(placement):
    return {u.name: sorted(n for n, p in u.module.named_parameters(recurse=True) if any(p is q for q in u.params))
            for u in placement.units}


def test_default_is_one_unit_per_leaf_plus_orphan_holders():
    model = make_model()
    placement = plan_units(model)
    units = {u.name: u for u in placement.units}
    assert {"embed", "head", "blocks.0.norm", "blocks.0.linear", "blocks.0.bn", "blocks.0", ""} <= set(units)
    assert [p is model.blocks[0].scale for p in units["blocks.0"].params] == [True]
    assert {id(p) for p in units[""].params} == {id(model.temperature)}
    assert units[""].buffers == [(model, "logit_bias")]
    assert units["head"].params[0] is units["embed"].params[0]  # tied: both units name the same tensor
    assert not placement.resident.params and not placement.resident.buffers


def test_threshold_keeps_small_modules_whole_and_splits_large_ones():
    model = make_model()
    block_bytes = sum(t.numel() * t.element_size() for t in model.blocks[0].state_dict().values())
    placement = plan_units(model, split_threshold_bytes=block_bytes)
    units = {u.name: u for u in placement.units}
    assert set(units) == {"", "embed", "head", "blocks.0", "blocks.1", "blocks.2"}
    assert len(units["blocks.1"].params) == len(list(model.blocks[1].parameters()))
    assert len(units["blocks.1"].buffers) == len(list(model.blocks[1].buffers()))
    whole = plan_units(model, split_threshold_bytes=10**9)
    assert [u.name for u in whole.units] == [""]


def test_containers_and_codecs_are_always_split_and_their_orphans_go_to_a_callable_owner():
    model = Holder()
    placement = plan_units(model, split_threshold_bytes=10**9)
    units = {u.name: u for u in placement.units}
    # Holder is callable and small, so it is one unit: containers and codecs inside it are part of it.
    assert list(units) == [""]
    codec_only = plan_units(model.codec, split_threshold_bytes=10**9)
    assert {u.name for u in codec_only.units} == {"encoder", "decoder"}
    assert [p is model.codec.bias for p in codec_only.resident.params] == [True]
    default = plan_units(model)
    units = {u.name: u for u in default.units}
    assert "layers" not in units and "table" not in units and "codec" not in units
    assert {"layers.0", "layers.1", "codec.encoder.0", "codec.encoder.1", "codec.decoder"} <= set(units)
    holder_params = {id(p) for p in units[""].params}
    assert {id(model.table[0]), id(model.codec.bias)} == holder_params


def test_a_module_registered_twice_is_planned_once():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    placement = plan_units(model)
    assert [u.name for u in placement.units] == ["0"]


def test_clip_text_embeddings_are_one_unit_so_their_forward_can_read_the_position_table():
    from transformers import CLIPTextConfig, CLIPTextModel

    from diffsynth.core.offload_training import OffloadTrainingManager

    torch.manual_seed(0)
    model = CLIPTextModel(CLIPTextConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=8, bos_token_id=0,
                                         eos_token_id=1)).eval()
    units = {u.name: u for u in plan_units(model).units}
    assert len(units["embeddings"].params) == len(list(model.embeddings.parameters())) == 2
    assert "embeddings.position_embedding" not in units
    tokens = torch.randint(0, 50, (1, 8))
    expected = model(tokens).pooler_output
    manager = OffloadTrainingManager(model, target_device="cpu")
    # CLIPTextEmbeddings checks the prompt length against position_embedding.weight before embedding: with the table
    # a unit of its own it would read the offloaded placeholder and refuse every prompt.
    assert torch.equal(model(tokens).pooler_output, expected)
    manager.remove()
