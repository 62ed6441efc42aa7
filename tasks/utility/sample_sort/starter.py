import torch
import torch.distributed as dist


def sample_sort(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the int64 keys of all ranks together. With N keys in all, ordered by (key, source rank, source
    index), return this rank's share of that order, global positions floor(rank * N / W) ..
    floor((rank + 1) * N / W) - 1: (keys, the rank each came from, its index in that rank's keys)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
