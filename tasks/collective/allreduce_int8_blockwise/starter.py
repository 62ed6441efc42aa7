import torch
import torch.distributed as dist


def all_reduce_int8(x: torch.Tensor, block: int) -> torch.Tensor:
    """Return the element-wise sum of `x` over all ranks, within the blockwise error bound of the task, the same
    values on every rank, using only point-to-point messages (int8 with one scale per `block` elements is the
    intended wire format)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
