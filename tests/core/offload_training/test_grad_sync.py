"""GradientSynchronizer across two gloo processes: means, missing gradients as zeros, small buckets."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from diffsynth.core.offload_training.grad_sync import GradientSyncConfig, GradientSynchronizer


def _worker(rank: int, port: int, bucket_mb: float, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        params = [torch.nn.Parameter(torch.zeros(shape)) for shape in ((3,), (2, 2), (5,))]
        frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
        params[0].grad = torch.full((3,), float(rank + 1))
        params[1].grad = torch.full((2, 2), 10.0 * rank)
        if rank == 0:
            params[2].grad = torch.ones(5)  # rank 1 has no gradient for it: it counts as zeros
        GradientSynchronizer([*params, frozen], GradientSyncConfig(bucket_mb=bucket_mb)).all_reduce_mean()
        results[rank] = [p.grad.clone() for p in params]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bucket_mb", [25.0, 1e-5])
def test_gradients_become_the_mean_on_every_rank(bucket_mb):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(port, bucket_mb, results), nprocs=2, join=True)
    for rank in (0, 1):
        first, second, third = results[rank]
        assert torch.equal(first, torch.full((3,), 1.5))
        assert torch.equal(second, torch.full((2, 2), 5.0))
        assert torch.equal(third, torch.full((5,), 0.5))


def test_single_process_is_a_no_op_and_bad_bucket_sizes_are_refused():
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    GradientSynchronizer([param]).all_reduce_mean()
    assert torch.equal(param.grad, torch.ones(2))
    with pytest.raises(ValueError, match="bucket_mb=0"):
        GradientSyncConfig(bucket_mb=0)
