import torch
import torch.distributed as dist


def all_to_all_v(x: torch.Tensor, send_counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Send rows x[o_j : o_j + send_counts[j]] to rank j (o_j = sum of the earlier counts); return the rows every
    rank sent to this one, concatenated in source-rank order, and how many came from each rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
