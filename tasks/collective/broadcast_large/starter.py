import torch
import torch.distributed as dist


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    """Return the root rank's `x` on every rank, using only point-to-point messages."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
