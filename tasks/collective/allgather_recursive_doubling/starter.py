import torch
import torch.distributed as dist


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Return torch.cat of every rank's x along dim 0, in rank order (world size is a power of two)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: log2(world) steps; in step k swap your run of 2**k blocks with rank ^ (2**k)
    raise NotImplementedError
