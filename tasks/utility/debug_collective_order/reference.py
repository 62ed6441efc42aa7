import torch
import torch.distributed as dist


def softmax_stats(logits: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    b, v = logits.shape
    base, extra = divmod(vocab_size, world)
    offset = rank * base + min(rank, extra)
    # Every rank reduces its own columns to three numbers per row -- its maximum, the sum of exp(logit - that
    # maximum) and the global id of the maximum's first column -- and one exchange hands them to every rank. The
    # sequence of calls is then the same on every rank whatever its shard's width (zero included), and the merge
    # below is the online-softmax combination of the shards' partial results.
    stats = torch.empty((b, 3), dtype=torch.float64, device=logits.device)
    if v:
        x = logits.to(torch.float64)
        idx = torch.argmax(x, dim=1)  # the first of equal maxima
        m = x.gather(1, idx[:, None]).squeeze(1)
        stats[:, 0] = m
        stats[:, 1] = torch.exp(x - m[:, None]).sum(dim=1)
        stats[:, 2] = (idx + offset).to(torch.float64)  # ids < 2**53 are exact in float64
    else:
        stats[:, 0] = float("-inf")
        stats[:, 1] = 0.0
        stats[:, 2] = float(vocab_size)
    every = torch.empty((world, b, 3), dtype=torch.float64, device=logits.device)
    every[rank] = stats
    if world > 1:
        # the all-gather as one batch of messages to and from every peer: a few hundred bytes each, so what
        # counts is the number of message latencies in a row (one), not the bytes
        ops = []
        for s in range(1, world):
            dst, src = (rank + s) % world, (rank - s) % world
            ops += [dist.P2POp(dist.isend, stats, dst), dist.P2POp(dist.irecv, every[src], src)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    ms, ss, ids = every.unbind(dim=2)                       # [world, b] each
    big = ms.max(dim=0).values                              # the global maximum of every row (finite: V >= 1)
    lse = big + torch.log((ss * torch.exp(ms - big)).sum(dim=0))
    # the smallest id among the shards whose maximum is the global one (shards are in vocabulary order)
    argmax = torch.where(ms == big, ids, float(vocab_size)).min(dim=0).values.to(torch.int64)
    return lse, argmax
