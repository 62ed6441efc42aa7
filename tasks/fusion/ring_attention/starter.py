import torch
import torch.distributed as dist


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                   causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [n_r, H, D], k and v: [n_r, Hkv, D], this rank's block of the sequence (positions sum(seq_lens[:rank])
    onwards). Return (out [n_r, H, D], lse [n_r, H]): attention of this rank's queries over the whole sequence
    (causal: key j visible to query i iff j <= i), and the log-sum-exp of each query's scaled scores."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
