import torch
import torch.distributed as dist


def dedup_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, experts_per_rank: int):
    """Deliver every (token, top-k slot) entry to the rank owning its expert (expert e lives on rank
    e // experts_per_rank as local expert e % experts_per_rank) and return, on each rank, (expert_x, expert_src,
    expert_counts): the rows of local expert 0, then 1, ..., each expert's rows ordered by (source rank, token
    index); expert_src[n] = (source rank, token index, top-k slot) of row n; expert_counts[l] = rows of expert l."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
