"""Shared segments: views are recognised, another process sees the same bytes, the memory goes with its last mapping."""

import gc
import subprocess
import sys

import pytest
import torch

from diffsynth.core.shared_weights import (SEGMENT_PREFIX, LocalGroup, SharedSegment, is_shared_host,
                                           memory_files_supported, shared_span, shared_storage)
from diffsynth.core.shared_weights.pss import segment_pss

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
