import torch
import torch.distributed as dist


def tp_attention(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor,
                 num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """x: [n, d], this rank's rows of the sequence. wq: [d, q*D], this rank's query heads' columns of Wq (q =
    num_heads // world_size); wk, wv: [d, m*D], the columns of the kv heads those query heads read; wo: [q*D, d],
    the same query heads' rows of Wo. Return this rank's rows [n, d] of the causal GQA attention block's output."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
