"""Stage 1 writes one cache file per sample, each with tensor sizes of its own (set by the image and the prompt), for
hours: writing one must keep nothing in memory. ``safetensors.torch.save_file`` viewed every tensor through a ctypes
array type of its byte size, which ctypes caches for good: about 6 KiB per new size, for the life of the process
(``scripts/bench_soak.py --stage_one`` prints stage 1's peak memory per number of images)."""

import gc
import tracemalloc

import torch

from diffsynth.core.data.cache import load_cache_sample, save_cache_sample


def test_writing_samples_of_ever_new_sizes_keeps_no_memory_per_size(tmp_path):
    path = tmp_path / "0.safetensors"

    def write(first_size, count):
        for size in range(first_size, first_size + count):
            state = {"shared": {"latents": torch.ones(1, 16, 1, 1, size)}, "posi": {"prompt_emb": torch.ones(size, 2)},
                     "nega": {}}
            save_cache_sample(path, state, {"pipeline": "test"})

    write(8, 10)  # imports and first-use caches
    gc.collect()
    tracemalloc.start()
    try:
        write(1000, 100)
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 100 * 1024, f"{kept / 1024:.0f} KiB kept after writing 100 samples of new sizes"
    assert torch.equal(load_cache_sample(path)["shared"]["latents"], torch.ones(1, 16, 1, 1, 1099))
