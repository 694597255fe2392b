"""Block swap on tiny real diffusers transformers: LoRA training equal to plain training, the slot schedule, refusals.

The helpers take the device as a parameter; the CPU tests run the sync engine (and the staged one), the GPU tests at
the end rerun the same checks on CUDA with the direct and staged engines.
"""

import copy
import dataclasses
import functools

import pytest
import torch
from diffusers import (
    Flux2Transformer2DModel,
    FluxTransformer2DModel,
    QwenImageTransformer2DModel,
    WanTransformer3DModel,
)
from peft import LoraConfig, inject_adapter_in_model
from torch import nn

from diffsynth.core.offload_training import (
    BlockSwapConfig,
    ClassicBlockSwap,
    H2DOnlyBlockSwap,
    create_offloader,
    streaming_block_indices,
)
from diffsynth.core.offload_training.block_swap import find_block_sequence, host_parameters

from .test_diffusers_models import lora_train

NUM_LAYERS = 4
STEPS = 3


def build_qwen_image():
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=NUM_LAYERS,
                                        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                        guidance_embeds=False, axes_dims_rope=(8, 4, 4))
    inputs = dict(hidden_states=torch.randn(1, 16, 64), encoder_hidden_states=torch.randn(1, 7, 32),
                  encoder_hidden_states_mask=torch.ones(1, 7), timestep=torch.tensor([0.5]),
                  img_shapes=[[(1, 4, 4)]], return_dict=False)
    return model, inputs


def build_wan():
    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                                  out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=NUM_LAYERS,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    inputs = dict(hidden_states=torch.randn(1, 16, 2, 8, 8), encoder_hidden_states=torch.randn(1, 7, 32),
                  timestep=torch.tensor([500]), return_dict=False)
    return model, inputs


def build_flux2():
    """FLUX.2 [klein]: 2 double-stream blocks, then 3 single-stream ones (smaller: one fused projection each)."""
    torch.manual_seed(0)
    model = Flux2Transformer2DModel(in_channels=16, num_layers=2, num_single_layers=3, attention_head_dim=16,
                                    num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 4, 4),
                                    guidance_embeds=False)
    inputs = dict(hidden_states=torch.randn(1, 16, 16), encoder_hidden_states=torch.randn(1, 7, 32),
                  timestep=torch.tensor([0.5]), img_ids=torch.zeros(1, 16, 4), txt_ids=torch.zeros(1, 7, 4),
                  return_dict=False)
    return model, inputs


BUILDERS = {"qwen-image": build_qwen_image, "wan": build_wan}
MODELS = {**BUILDERS, "flux2": build_flux2}
# FLUX.2's single blocks have no to_q / to_k: their LoRA goes on the fused projection, so both lists train.
LORA_TARGETS = {"flux2": ["to_q", "to_k", "add_q_proj", "to_qkv_mlp_proj"]}


pytestmark = pytest.mark.usefixtures("one_thread")


def lora_model(name, checkpointing=True):
    model, inputs = MODELS[name]()
    model.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=LORA_TARGETS.get(name, ["to_q", "to_k"]),
                                       init_lora_weights="gaussian"), model)
    if checkpointing:
        model.enable_gradient_checkpointing()
    return model, inputs


def train(model, inputs, device, steps=STEPS):
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return lora_train(model, inputs, steps).cpu()


def lora_state(model):
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


@functools.lru_cache(maxsize=None)
def reference(name, checkpointing, device):
    model, inputs = lora_model(name, checkpointing)
    losses = train(model.to(device), inputs, device)
    return losses, lora_state(model)


def replay(trace, limit, swapped):
    """Checks a trace: every compute runs on a loaded block and at most ``limit`` swapped blocks are loaded at once."""
    loaded, per_pass = set(), []
    for event in trace:
        if event[0] == "load":
            assert event[1] not in loaded, f"{event} while already loaded"
            loaded.add(event[1])
            assert len(loaded) <= limit, f"{sorted(loaded)} loaded at once, limit {limit}"
            if per_pass:
                per_pass[-1].append(event[1])
        elif event[0] == "evict":
            loaded.remove(event[1])
        elif event[0] in ("compute", "recompute") and event[1] in swapped:
            assert event[1] in loaded, f"{event} while not loaded"
        elif event[0] == "forward":
            per_pass.append([])
    return loaded, per_pass


def check_swap_training(name, config, device, checkpointing=True):
    """Trains the LoRA with block swap and compares losses and LoRA weights with plain training.

    fp32; 1e-6 on the CPU. On CUDA 1e-5: the library may pick other kernels for weights at other addresses.
    """
    atol = 1e-6 if torch.device(device).type == "cpu" else 1e-5
    expected_losses, expected_state = reference(name, checkpointing, device)
    model, inputs = lora_model(name, checkpointing)
    offloader = create_offloader(model, dataclasses.replace(config, record_trace=True), device)
    swapped_ids = {id(p) for p in model.parameters()}
    losses = train(model, inputs, device)
    torch.testing.assert_close(losses, expected_losses, rtol=0, atol=atol)
    assert {id(p) for p in model.parameters()} == swapped_ids
    state = lora_state(model)
    for key, value in expected_state.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=atol)
    offloader.remove()
    return offloader


def check_h2d_schedule(offloader, streamed, ring):
    _, per_pass = replay(offloader.trace, ring, streamed)
    assert offloader.self_heals == 0
    steady = 2 * max(len(streamed) - ring, 0)
    assert [len(loads) for loads in per_pass] == [min(ring, len(streamed)) + steady] + [steady] * (STEPS - 1)
    for loads in per_pass[1:]:
        assert set(loads) <= set(streamed)


# ---- LoRA training equals plain training ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("ring", [1, 2])
@pytest.mark.parametrize("streamed", [1, 2, 3, 4])
def test_h2d_only_lora_training_matches_plain_training(name, ring, streamed):
    config = BlockSwapConfig(blocks_to_swap=streamed, h2d_only=True, ring_size=ring)
    offloader = check_swap_training(name, config, "cpu")
    indices = streaming_block_indices(NUM_LAYERS, streamed)
    check_h2d_schedule(offloader, indices, min(ring, streamed))


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("swapped, checkpointing", [(2, True), (4, True), (2, False)],
                         ids=["2-checkpointing", "4-checkpointing", "2-plain"])
def test_classic_lora_training_matches_plain_training(name, swapped, checkpointing):
    config = BlockSwapConfig(blocks_to_swap=swapped)
    offloader = check_swap_training(name, config, "cpu", checkpointing)
    loaded, per_pass = replay(offloader.trace, swapped if not checkpointing else 2, offloader.swapped)
    assert not loaded
    if checkpointing:
        # Each swapped block is loaded once for the forward and once for recompute plus backward, every step.
        for loads in per_pass:
            assert sorted(loads) == sorted(2 * list(range(NUM_LAYERS - swapped, NUM_LAYERS)))
        assert offloader.peak_swapped_bytes <= 2 * max(offloader._nbytes.values())


def test_staged_engine_runs_the_same_training_on_the_cpu():
    config = BlockSwapConfig(blocks_to_swap=3, h2d_only=True, ring_size=2, engine="staged", num_staging_buffers=2)
    offloader = check_swap_training("wan", config, "cpu")
    assert offloader.engine_name == "staged"


# ---- the schedule --------------------------------------------------------------------------------------------------

def test_h2d_slot_trace_two_of_four_blocks_ring_one():
    model, inputs = lora_model("wan")
    offloader = create_offloader(model, BlockSwapConfig(2, h2d_only=True, ring_size=1, record_trace=True), "cpu")
    assert offloader.stream_indices == [1, 3]
    train(model, inputs, "cpu", steps=2)
    forward_tail = [("compute", 0), ("compute", 1), ("evict", 1, 0), ("load", 3, 0), ("compute", 2), ("compute", 3)]
    # Backward: block 3 is still in the slot from the forward; once its backward is done block 1 is loaded, and
    # stays for the next forward.
    backward = [("recompute", 3), ("evict", 3, 0), ("load", 1, 0), ("recompute", 2), ("recompute", 1),
                ("recompute", 0)]
    first = [("forward",), ("load", 1, 0)] + forward_tail + backward
    assert offloader.trace == first + [("forward",)] + forward_tail + backward


def test_h2d_inference_wraps_around_to_the_first_streamed_block():
    model, inputs = lora_model("wan", checkpointing=False)
    plain = copy.deepcopy(model)
    offloader = create_offloader(model, BlockSwapConfig(2, h2d_only=True, ring_size=1, record_trace=True), "cpu")
    with torch.no_grad():
        outputs = [model(**inputs)[0] for _ in range(2)]
        expected = plain(**inputs)[0]
    for output in outputs:
        torch.testing.assert_close(output, expected, rtol=0, atol=0)
    one_pass = [("compute", 0), ("compute", 1), ("evict", 1, 0), ("load", 3, 0), ("compute", 2), ("compute", 3),
                ("evict", 3, 0), ("load", 1, 0)]
    assert offloader.trace == [("forward",), ("load", 1, 0)] + one_pass + [("forward",)] + one_pass
    assert offloader.self_heals == 0


def test_blocks_called_out_of_order_self_heal():
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(4)).requires_grad_(False)
    plain = copy.deepcopy(blocks)
    offloader = create_offloader(blocks, BlockSwapConfig(2, h2d_only=True, ring_size=1, record_trace=True), "cpu")
    x = torch.randn(2, 8)
    # Block 3 first: never prefetched, so it is loaded on demand; after it (the last streamed block, inference) the
    # ring wraps around to block 1, so the second call of block 3 heals again and the call of block 1 does not.
    for index in (3, 3, 1):
        torch.testing.assert_close(blocks[index](x), plain[index](x), rtol=0, atol=0)
    assert offloader.self_heals == 2
    assert [e for e in offloader.trace if e[0] == "self_heal"] == [("self_heal", 3), ("self_heal", 3)]
    replay(offloader.trace, 1, [1, 3])


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_explicit_module_list_with_checkpointing_trains_like_plain(reentrant):
    def make():
        torch.manual_seed(0)
        blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4))
        blocks.requires_grad_(False)
        for block in blocks:
            inject_adapter_in_model(LoraConfig(r=2, target_modules=["0"], init_lora_weights="gaussian"), block)
        return blocks

    def run(blocks):
        optimizer = torch.optim.AdamW([p for p in blocks.parameters() if p.requires_grad], lr=1e-2)
        for step in range(2):
            x = torch.randn(3, 8, generator=torch.Generator().manual_seed(step)).requires_grad_()
            for block in blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
            x.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return lora_state(blocks)

    expected = run(make())
    blocks = make()
    offloader = create_offloader(blocks, BlockSwapConfig(3, h2d_only=True, ring_size=2, record_trace=True), "cpu")
    for key, value in run(blocks).items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=1e-6)
    replay(offloader.trace, 2, offloader.stream_indices)
    # Reentrant checkpointing runs the forward without grad, so it looks like inference: the ring wraps around at
    # the end of the forward and the backward reloads its first blocks on demand. Correct, a little slower.
    assert (offloader.self_heals > 0) == reentrant


def test_remove_restores_the_model():
    model, inputs = lora_model("qwen-image")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    for config in (BlockSwapConfig(2), BlockSwapConfig(3, h2d_only=True)):
        offloader = create_offloader(model, config, "cpu")
        train(model, inputs, "cpu", steps=1)
        offloader.remove()
        assert dict(model.named_parameters()).keys() == params.keys()
        assert all(p is params[n] for n, p in model.named_parameters())
        assert all(not block._forward_pre_hooks and not block._forward_hooks for block in model.transformer_blocks)
        assert not model._forward_pre_hooks
        state = model.state_dict()
        for key, value in before.items():
            if "lora_" not in key:
                assert torch.equal(state[key], value), key
            # An ordinary tensor again: it owns its storage instead of viewing a host master.
            assert state[key].untyped_storage().nbytes() == state[key].numel() * state[key].element_size()


def test_debug_timing_report_lists_every_streamed_block():
    model, inputs = lora_model("wan")
    offloader = create_offloader(model, BlockSwapConfig(2, h2d_only=True, debug_timing=True), "cpu")
    train(model, inputs, "cpu", steps=2)
    report = offloader.report()
    assert "engine sync" in report and "stall ms" in report
    rows = {line.split()[0]: line.split() for line in report.splitlines()[2:]}
    assert set(rows) == {"1", "3", "total"}
    assert int(rows["total"][1]) == 2  # ring of 2 holds both streamed blocks: loaded once, never again
    assert "timing is off" in create_offloader(lora_model("wan")[0], BlockSwapConfig(1), "cpu").report()


# ---- refusals --------------------------------------------------------------------------------------------------------

def test_bad_configurations_are_refused_with_the_flag_and_the_fix():
    with pytest.raises(ValueError, match=r"ring_size=0 \(--block_swap_ring_size\) must be at least 1"):
        BlockSwapConfig(2, h2d_only=True, ring_size=0)
    with pytest.raises(ValueError, match=r"blocks_to_swap=-1 \(--blocks_to_swap\)"):
        BlockSwapConfig(-1)
    with pytest.raises(ValueError, match="engine='fast'"):
        BlockSwapConfig(1, engine="fast")
    with pytest.raises(ValueError, match="Add --use_gradient_checkpointing"):
        BlockSwapConfig(2, h2d_only=True, gradient_checkpointing=False)
    model, _ = lora_model("wan")
    with pytest.raises(ValueError, match=r"blocks_to_swap=5 .* WanTransformer3DModel.blocks has only 4 blocks"):
        create_offloader(model, BlockSwapConfig(5), "cpu")
    with pytest.raises(ValueError, match="no block list on Linear"):
        create_offloader(nn.Linear(2, 2), BlockSwapConfig(1), "cpu")
    with pytest.raises(ValueError, match="'direct' block swap transfer engine needs a CUDA device"):
        create_offloader(model, BlockSwapConfig(1, engine="direct"), "cpu")
    assert create_offloader(model, BlockSwapConfig(0), "cpu") is None


def test_trainable_streamed_weight_is_refused_by_name():
    model, _ = BUILDERS["qwen-image"]()
    model.requires_grad_(False)
    weight = model.transformer_blocks[2].attn.to_q.weight.requires_grad_(True)
    pointer = weight.data_ptr()
    with pytest.raises(ValueError, match=r"transformer_blocks\.2\.attn\.to_q\.weight requires grad.*LoRA"):
        create_offloader(model, BlockSwapConfig(1, h2d_only=True), "cpu")
    assert weight.data_ptr() == pointer and not model.transformer_blocks[2]._forward_pre_hooks


def test_h2d_only_training_without_checkpointing_is_refused_at_forward():
    model, inputs = lora_model("qwen-image", checkpointing=False)
    create_offloader(model, BlockSwapConfig(2, h2d_only=True), "cpu")
    with pytest.raises(RuntimeError, match=r"transformer_blocks\.1 \(QwenImageTransformerBlock\).*"
                                           "Add --use_gradient_checkpointing"):
        model(**inputs)


def test_streaming_blocks_are_spread_evenly():
    assert [streaming_block_indices(4, s) for s in (1, 2, 3, 4)] == [[2], [1, 3], [0, 2, 3], [0, 1, 2, 3]]
    assert streaming_block_indices(60, 6) == [5, 15, 25, 35, 45, 55]


def test_modes_are_chosen_by_the_config():
    model, _ = lora_model("wan")
    classic = create_offloader(model, BlockSwapConfig(1), "cpu")
    assert isinstance(classic, ClassicBlockSwap)
    classic.remove()
    assert isinstance(create_offloader(model, BlockSwapConfig(1, h2d_only=True), "cpu"), H2DOnlyBlockSwap)


# ---- several block lists: FLUX.2's double blocks, then its single blocks -------------------------------------------

FLUX2_NAMES = [f"transformer_blocks.{i}" for i in range(2)] + [f"single_transformer_blocks.{i}" for i in range(3)]


def test_flux_block_lists_are_one_sequence_in_execution_order():
    model = build_flux2()[0]
    flux2 = find_block_sequence(model)
    assert list(flux2.names) == FLUX2_NAMES and flux2.label == "transformer_blocks + single_transformer_blocks"
    assert list(flux2) == [*model.transformer_blocks, *model.single_transformer_blocks]
    flux1 = FluxTransformer2DModel(num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                                   joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
    assert list(find_block_sequence(flux1).names) == ["transformer_blocks.0", "single_transformer_blocks.0",
                                                      "single_transformer_blocks.1"]
    qwen = find_block_sequence(build_qwen_image()[0])
    assert qwen.list_names == ("transformer_blocks",) and len(qwen) == NUM_LAYERS
    # Wan VACE runs every VACE block (the hints) before the main blocks.
    from diffsynth.testing.tiny_wan_vace import tiny_wan_vace_transformer

    vace = tiny_wan_vace_transformer(0)
    assert list(find_block_sequence(vace).names) == ["vace_blocks.0", "vace_blocks.1", "blocks.0", "blocks.1"]


@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointing", "plain"])
def test_flux2_classic_swap_over_both_lists_matches_plain_training(checkpointing):
    offloader = check_swap_training("flux2", BlockSwapConfig(blocks_to_swap=4), "cpu", checkpointing)
    # The last 4 of the sequence: the second double block and every single block.
    assert [offloader.blocks.names[i] for i in offloader.swapped] == FLUX2_NAMES[1:]
    loaded, per_pass = replay(offloader.trace, 2 if checkpointing else 4, offloader.swapped)
    assert not loaded
    if checkpointing:
        for loads in per_pass:
            assert sorted(loads) == sorted(2 * [1, 2, 3, 4])
        # Adjacent blocks of different sizes (double, single) are on the device at once at most.
        assert offloader.peak_swapped_bytes <= 2 * max(offloader._nbytes.values())
    assert offloader._nbytes[1] > offloader._nbytes[2]  # a double block outweighs a single one


@pytest.mark.parametrize("ring", [1, 2])
@pytest.mark.parametrize("streamed", [2, 3, 5])
def test_flux2_h2d_streaming_over_both_lists_matches_plain_training(ring, streamed):
    config = BlockSwapConfig(blocks_to_swap=streamed, h2d_only=True, ring_size=ring)
    offloader = check_swap_training("flux2", config, "cpu")
    indices = streaming_block_indices(5, streamed)
    assert offloader.stream_indices == indices
    names = [offloader.blocks.names[i] for i in indices]
    assert any(n.startswith("transformer_blocks.") for n in names)
    assert any(n.startswith("single_transformer_blocks.") for n in names)
    check_h2d_schedule(offloader, indices, min(ring, streamed))
    # Slots hold the largest streamed block; the smaller single blocks fill part of one.
    sizes = [offloader.streamed[i].nbytes for i in indices]
    assert len(set(sizes)) > 1 and offloader.ring[0].numel() == max(sizes)


@pytest.mark.parametrize("config", [BlockSwapConfig(4), BlockSwapConfig(2, h2d_only=True)], ids=["classic", "h2d"])
def test_flux2_host_parameters_are_the_swapped_blocks_of_both_lists(config):
    model, _ = build_flux2()
    model.requires_grad_(False)
    selected = host_parameters(config)(model)
    chosen = {name for name, _ in model.named_parameters() if selected(name)}
    # What the policy itself keeps in host memory, named by where each tensor sits in the model.
    offloader = create_offloader(model, config, "cpu")
    kept = {slot.name for slot, _, _ in offloader._masters}
    offloader.remove()
    assert chosen == kept
    lists = {".".join(name.split(".")[:2]) for name in chosen}
    expected = FLUX2_NAMES[1:] if not config.h2d_only else ["transformer_blocks.1", "single_transformer_blocks.1"]
    assert lists == set(expected)


def test_flux2_more_blocks_than_both_lists_hold_is_refused():
    model, _ = lora_model("flux2")
    with pytest.raises(ValueError, match=r"blocks_to_swap=6 \(--blocks_to_swap\) but Flux2Transformer2DModel\."
                                         r"transformer_blocks \+ single_transformer_blocks has only 5 blocks; use at "
                                         r"most 5"):
        create_offloader(model, BlockSwapConfig(6), "cpu")
    assert create_offloader(model, BlockSwapConfig(5), "cpu").num_blocks == 5


# ---- the same on CUDA ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("config", [
    BlockSwapConfig(2, h2d_only=True, ring_size=1, use_pinned_memory=True),
    BlockSwapConfig(3, h2d_only=True, ring_size=2, use_pinned_memory=True),
    BlockSwapConfig(3, h2d_only=True, ring_size=2),
    BlockSwapConfig(2, use_pinned_memory=True),
    BlockSwapConfig(2),
], ids=["h2d-direct-ring1", "h2d-direct-ring2", "h2d-staged", "classic-direct", "classic-staged"])
@pytest.mark.parametrize("name", MODELS)  # FLUX.2: the H2D configs stream double and single blocks
def test_lora_training_on_cuda_matches_plain_cuda_training(name, config):
    offloader = check_swap_training(name, config, "cuda")
    assert offloader.engine_name == ("direct" if config.use_pinned_memory else "staged")


@pytest.mark.gpu
def test_cuda_report_measures_copies_and_stalls():
    model, inputs = lora_model("wan")
    offloader = create_offloader(model, BlockSwapConfig(3, h2d_only=True, ring_size=1, use_pinned_memory=True,
                                                        debug_timing=True), "cuda")
    train(model, inputs, "cuda", steps=3)
    rows = {line.split()[0]: line.split() for line in offloader.report().splitlines()[2:]}
    assert float(rows["total"][2]) > 0  # copy ms, from CUDA events
    assert int(rows["total"][4]) > 0  # waits
    assert float(rows["total"][6]) >= 0  # stall ms
