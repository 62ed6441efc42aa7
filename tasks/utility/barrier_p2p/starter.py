import torch
import torch.distributed as dist


def barrier() -> None:
    """Return only after every rank of the default group has called barrier(); use send/recv only."""
    rank, world = dist.get_rank(), dist.get_world_size()
    raise NotImplementedError
