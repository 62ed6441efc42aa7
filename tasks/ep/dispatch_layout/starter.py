import torch
import torch.distributed as dist


def dispatch_layout(topk_idx: torch.Tensor, experts_per_rank: int):
    """Return (tokens_per_rank [world], tokens_per_expert [E], rank_offset [T, world], expert_offset [T, k]), all
    int64: this rank's token counts per destination rank, every rank's token counts per expert, and each token's
    row in each destination rank's receive buffer and in each of its experts' batches (both ordered by source rank,
    then token index; -1 where the token does not go)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
