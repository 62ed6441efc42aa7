import torch
import torch.distributed as dist


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """q, k, v: [n, H, D], this rank's n consecutive positions (rank r: r*n .. r*n + n - 1) of the sequence.
    Return out [n, H, D]: attention of this rank's queries over the whole sequence, every head (causal: key j
    visible to query i iff j <= i)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
