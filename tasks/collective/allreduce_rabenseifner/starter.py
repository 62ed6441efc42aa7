import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Return the element-wise sum of `x` over all ranks, using only point-to-point messages."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
