import torch
import torch.distributed as dist


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    """Return the root's x on every rank (x is only a placeholder off the root)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
