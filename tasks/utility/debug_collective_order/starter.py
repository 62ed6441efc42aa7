import torch
import torch.distributed as dist

CHUNK = 512  # columns per step: bounds the float64 temporaries of a wide shard


def softmax_stats(logits: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-sum-exp of every row over the whole vocabulary, smallest vocabulary id of each row's maximum), for a
    vocabulary split over the ranks as torch.tensor_split splits range(vocab_size)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if logits.dim() != 2:
        raise NotImplementedError("logits must be a [batch, columns] matrix")
    b, v = logits.shape
    base, extra = divmod(vocab_size, world)
    offset = rank * base + min(rank, extra)  # the vocabulary id of this shard's first column
    x = logits.to(torch.float64)

    # 1. the largest logit of every row, over all ranks
    if v:
        m = x.max(dim=1).values
    else:  # this rank holds no columns
        m = torch.full((b,), float("-inf"), dtype=torch.float64, device=logits.device)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)

    # 2. the sum of exp(logit - max) over the whole vocabulary, a chunk of columns at a time
    total = torch.zeros(b, dtype=torch.float64, device=logits.device)
    for start in range(0, v, CHUNK):
        part = torch.exp(x[:, start:start + CHUNK] - m[:, None]).sum(dim=1)
        dist.all_reduce(part)
        total += part
    lse = m + torch.log(total)

    # 3. the smallest vocabulary id holding the maximum: this rank's candidate, or vocab_size if it has none
    first = torch.full((b,), vocab_size, dtype=torch.int64, device=logits.device)
    if v:
        hit = x == m[:, None]
        found = hit.any(dim=1)
        first[found] = hit.to(torch.int8).argmax(dim=1)[found] + offset
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    return lse.to(logits.dtype), first
