import torch
import torch.distributed as dist


def vocab_parallel_sample(logits_shard: torch.Tensor, vocab_bounds: list[int], k: int, temperature: float,
                          u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits_shard: [B, V_r], columns vocab_bounds[rank] .. vocab_bounds[rank + 1] - 1 of the logits; u: [B]
    float64 in [0, 1), the same on every rank. Return (token [B] int64, logprob [B]), the same on every rank:
    top-k by (logit descending, id ascending), softmax of logit / temperature over the k, inverse CDF at u."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
