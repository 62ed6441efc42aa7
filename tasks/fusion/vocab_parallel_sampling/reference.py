import torch
import torch.distributed as dist


def _local_candidates(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This shard's first min(k, V_r) columns per row in the order (value descending, column ascending)."""
    if x.shape[1] <= k:
        vals, idx = torch.sort(x, dim=1, descending=True, stable=True)
        return vals, idx
    # the k-th largest value t: everything above t is in, then the lowest columns equal to t
    t = torch.topk(x, k, dim=1, sorted=True).values[:, -1:]
    above = x > t
    tied = (x == t) & (torch.cumsum((x == t).to(torch.int32), dim=1) <= k - above.sum(1, keepdim=True))
    keep = above | tied                                   # exactly k per row
    idx = keep.nonzero()[:, 1].view(x.shape[0], k)        # ascending columns
    vals, order = torch.sort(x.gather(1, idx), dim=1, descending=True, stable=True)
    return vals, idx.gather(1, order)


def vocab_parallel_sample(logits_shard: torch.Tensor, vocab_bounds: list[int], k: int, temperature: float,
                          u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev, b = logits_shard.device, logits_shard.shape[0]
    x = logits_shard if logits_shard.dtype in (torch.float32, torch.float64) else logits_shard.float()
    words = x.element_size() // 4                         # int32 words per value on the wire
    sizes = [min(k, vocab_bounds[p + 1] - vocab_bounds[p]) for p in range(world)]

    # 1. local candidates, packed with their global ids into one flat int32 message: B * kr values' words, then
    #    B * kr ids
    vals, idx = _local_candidates(x, k)
    mine = torch.cat([vals.contiguous().view(torch.int32).reshape(-1),
                      (idx + vocab_bounds[rank]).to(torch.int32).reshape(-1)])

    # 2. one round: my candidates to every peer, every peer's from it (sizes known from vocab_bounds)
    packs = [mine if p == rank else torch.empty(b * sizes[p] * (words + 1), dtype=torch.int32, device=dev)
             for p in range(world)]
    ops = [dist.P2POp(dist.isend, mine, p) for p in range(world) if p != rank and mine.numel()]
    ops += [dist.P2POp(dist.irecv, packs[p], p) for p in range(world) if p != rank and packs[p].numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()

    # 3. the same merge on every rank: in rank order, equal values already stand in ascending id order, so a stable
    #    sort by value gives (value descending, id ascending)
    all_vals = torch.cat([pk[:b * s * words].view(x.dtype).view(b, s) for pk, s in zip(packs, sizes)], dim=1)
    all_ids = torch.cat([pk[b * s * words:].view(b, s) for pk, s in zip(packs, sizes)], dim=1).to(torch.int64)
    top, order = torch.sort(all_vals, dim=1, descending=True, stable=True)
    ids = all_ids.gather(1, order[:, :k])

    # 4. temperature softmax over the k candidates, inverse CDF at u (float64: far from the edges' tolerance)
    z = top[:, :k].to(torch.float64) / temperature
    logp = z - torch.logsumexp(z, dim=1, keepdim=True)
    cdf = torch.cumsum(torch.exp(logp), dim=1)
    pos = (cdf <= u.to(torch.float64).unsqueeze(1)).sum(dim=1).clamp(max=k - 1).unsqueeze(1)
    return ids.gather(1, pos).squeeze(1), logp.gather(1, pos).squeeze(1)
