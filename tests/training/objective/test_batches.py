"""Joining the states of a batch: what the loss reads is concatenated, text embeddings padded with a mask as
diffusers pads a batch of prompts, and samples of different shapes refused."""

import pytest
import torch

from diffsynth.training.objective.batches import collate_states, pad_embeddings

KEYS = [("shared", "input_latents"), ("posi", "prompt_emb"), ("posi", "prompt_emb_mask"), ("shared", "prompt_emb"),
        ("shared", "edit_latents"), ("shared", "boundary_ratio")]
PADDED = {"prompt_emb": "prompt_emb_mask"}


def state(tokens, latents=(16, 4, 6), mask=None, edits=((16, 2, 2),)):
    shared = {"input_latents": torch.randn(1, *latents), "edit_latents": [torch.randn(1, *e) for e in edits],
              "boundary_ratio": None, "prompt": "not read by the loss"}
    return shared, {"prompt_emb": torch.randn(1, tokens, 8), "prompt_emb_mask": mask}, {}


def test_the_loss_keys_are_joined_and_prompts_padded_with_their_mask():
    states = [state(5), state(3), state(5)]
    shared, posi, nega = collate_states(states, KEYS, PADDED)
    assert torch.equal(shared["input_latents"], torch.cat([s[0]["input_latents"] for s in states]))
    assert [tuple(t.shape) for t in shared["edit_latents"]] == [(3, 16, 2, 2)]
    assert shared["boundary_ratio"] is None and "prompt" not in shared and nega == {}
    assert posi["prompt_emb"].shape == (3, 5, 8)
    assert posi["prompt_emb_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0], [1] * 5]
    assert torch.equal(posi["prompt_emb"][1, :3], states[1][1]["prompt_emb"][0])
    assert not posi["prompt_emb"][1, 3:].any()


def test_no_mask_when_no_token_is_padding_and_own_masks_are_kept():
    _, posi, _ = collate_states([state(4), state(4)], KEYS, PADDED)
    assert posi["prompt_emb_mask"] is None  # as diffusers drops an all-ones mask
    embeddings, mask = pad_embeddings([torch.ones(1, 3, 2), torch.ones(1, 2, 2)],
                                      [torch.tensor([[1, 1, 0]]), None])
    assert mask.tolist() == [[1, 1, 0], [1, 1, 0]] and embeddings.shape == (2, 3, 2)


def test_a_batch_of_one_is_its_state_unchanged():
    one = state(4)
    assert collate_states([one], KEYS, PADDED) is one


@pytest.mark.parametrize("other, fragment", [
    (state(4, latents=(16, 4, 8)), "shared/input_latents"),
    (state(4, edits=((16, 4, 2),)), "shared/edit_latents/0"),
])  # fmt: skip
def test_samples_of_different_shapes_are_refused(other, fragment):
    with pytest.raises(ValueError, match=f"differ in the shape of {fragment}.*one bucket"):
        collate_states([state(4), other], KEYS, PADDED)
