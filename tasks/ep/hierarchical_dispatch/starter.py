import torch
import torch.distributed as dist


def hierarchical_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, experts_per_rank: int, group_size: int):
    """Return (recv_x [n, d], recv_src [n, 2] int64, recv_topk [n, k] int64): every token of every rank with at
    least one expert on this rank (expert e lives on rank e // experts_per_rank), once, ordered by (source rank,
    token index); recv_src = (source rank, token index); recv_topk = the token's top-k row with this rank's experts
    made local and every other entry -1. Ranks form nodes of group_size consecutive ranks; only collectives may
    move data."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
