"""Shared segments: views are recognised, another process sees the same bytes, the memory goes with its last mapping."""

import gc
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffsynth.core.device import copy_into
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.core.shared_weights import (SEGMENT_PREFIX, LocalGroup, SharedSegment, is_shared_host,
                                           memory_files_supported, shared_span, shared_storage)
from diffsynth.core.shared_weights.local_group import NODE_RANK_ENV, machine_key
from diffsynth.core.shared_weights.pss import segment_pss

from .processes import run_ranks

pytestmark = pytest.mark.skipif(not memory_files_supported(), reason="needs Linux memory files")


def mapped(name: str) -> bool:
    with open("/proc/self/maps") as maps:
        return f"/memfd:{SEGMENT_PREFIX}:{name} " in maps.read()


def test_views_of_a_segment_are_recognised_and_other_tensors_are_not():
    segment = SharedSegment.create(4096, "views")
    weight = segment.tensor(64, torch.bfloat16, (4, 8))
    weight.fill_(1.5)
    assert is_shared_host(weight) and shared_storage(weight).numel() == 4096
    assert torch.equal(segment.flat[64:128].view(torch.bfloat16), torch.full((32,), 1.5, dtype=torch.bfloat16))
    assert not is_shared_host(torch.ones(4)) and not is_shared_host(torch.empty(4, device="meta"))
    segment.close_handle()


def test_the_memory_goes_with_the_last_mapping():
    segment = SharedSegment.create(1 << 16, "lifetime")
    weight = segment.tensor(0, torch.float32, (16,))
    segment.close_handle()
    del segment
    gc.collect()
    assert mapped("lifetime") and is_shared_host(weight)  # a view keeps the mapping
    del weight
    gc.collect()
    assert not mapped("lifetime")


def test_another_process_maps_the_same_bytes_while_the_creator_holds_its_handle():
    segment = SharedSegment.create(4096, "attach")
    segment.tensor(0, torch.int32, (4,)).copy_(torch.tensor([1, 2, 3, 4]))
    offer = segment.offer()
    child = (
        "import sys, torch\n"
        "from diffsynth.core.shared_weights import SegmentOffer, SharedSegment\n"
        f"segment = SharedSegment.attach(SegmentOffer({offer.pid}, {offer.fd}, {offer.nbytes}, 'attach'))\n"
        "values = segment.tensor(0, torch.int32, (4,))\n"
        "print(values.tolist())\n"
        "values.mul_(10)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1, 2, 3, 4]"
    assert segment.tensor(0, torch.int32, (4,)).tolist() == [10, 20, 30, 40]
    segment.close_handle()
    with pytest.raises(RuntimeError, match="handle is closed"):
        segment.offer()


def test_a_span_is_found_only_where_the_tensors_lie_at_the_offsets():
    segment = SharedSegment.create(4096, "span")
    first = segment.tensor(128, torch.float32, (3,))  # 12 bytes: the next aligned offset is 64 further
    second = segment.tensor(192, torch.bfloat16, (2, 2))
    span = shared_span([first, second], [0, 64], 72)
    assert span is not None and span.data_ptr() == first.data_ptr() and span.numel() == 72
    assert shared_span([first, second], [0, 16], 72) is None
    assert shared_span([first, torch.zeros(2, 2, dtype=torch.bfloat16)], [0, 64], 72) is None
    assert shared_span([torch.zeros(3)], [0], 12) is None
    segment.close_handle()


def test_a_segment_counts_in_the_proportional_set_size_of_the_process_that_touched_it():
    segment = SharedSegment.create(1 << 20, "pss")
    before = segment_pss()
    segment.flat.fill_(1)
    assert segment_pss() - before == 1 << 20
    segment.close_handle()


def test_a_process_alone_is_its_own_local_group():
    group = LocalGroup.of_this_process()
    assert (group.size, group.rank, group.is_main) == (1, 0, True)
    assert group.from_main("mine") == "mine" and group.gather(3) == [3]


@pytest.mark.gpu
def test_a_page_locked_segment_copies_to_the_gpu_without_blocking_the_host():
    segment = SharedSegment.create(64 << 20, "gpu")
    assert segment.lock_pages() and segment.flat.is_pinned()
    host = segment.tensor(0, torch.float32, (16 << 20,))
    host.copy_(torch.arange(16 << 20, dtype=torch.float32))
    target = torch.empty_like(host, device="cuda")
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU work queued ahead of the copy
    copy_into(target, host)
    # Not timed: the sleep queued ahead is still running when the copy returns, so the host did not wait for it
    # (from pageable memory the host would wait the second, and find the stream idle).
    still_queued = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_queued and torch.equal(target.cpu(), host)
    segment.close_handle()


def load_page_locked(root: str) -> dict:
    """Rank body: both processes load the tiny Qwen-Image DiT into the shared copy; each page-locks its mapping."""
    from diffsynth.core.loader import SharedLoad, load_model_from_files

    torch.cuda.set_device(0)
    files = sorted((Path(root) / QWEN_IMAGE_MODEL_ID / "transformer").glob("*.safetensors"))
    model = load_model_from_files(files, torch.bfloat16, shared=SharedLoad(LocalGroup.of_this_process()))
    return {"pinned": all(param.is_pinned() and is_shared_host(param) for param in model.parameters())}


@pytest.mark.gpu
def test_every_process_page_locks_the_shared_copy(tiny_root, tmp_path):
    assert [rank["pinned"] for rank in run_ranks(load_page_locked, 2, tmp_path, str(tiny_root))] == [True, True]




def test_processes_of_two_launch_nodes_never_share_a_machine_key(monkeypatch):
    """Processes group by machine key (``LocalGroup``): two launch nodes (``accelerate launch --machine_rank 0`` and
    ``1``) never share a host copy of the frozen weights, even on one host; one node's processes do."""
    keys = []
    for node in ("0", "0", "1"):
        monkeypatch.setenv(NODE_RANK_ENV, node)
        keys.append(machine_key())
    assert keys[0] == keys[1] != keys[2] and keys[2].startswith(keys[0][:-1])
