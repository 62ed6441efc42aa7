import torch
import torch.distributed as dist


def low_latency_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, max_tokens: int, experts_per_rank: int):
    """Return (recv_x [experts_per_rank, world * max_tokens, d], recv_count [experts_per_rank, world] int64,
    recv_src_idx [experts_per_rank, world * max_tokens] int64): slot (l, s) = rows [s * max_tokens,
    (s + 1) * max_tokens) of recv_x[l] holds, from its first row, the tokens of rank s routed to this rank's local
    expert l in increasing token index, recv_src_idx their token indices, recv_count[l, s] how many there are."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
