# Plausible bug: every rank sends its local top-k and the merge samples among all the gathered candidates, but
# forgets to cut the merged list back to k: the softmax then renormalises over up to world * k candidates. Right
# only where the shards together hold no more than k candidates (k = V, or one small shard).
import torch
import torch.distributed as dist


def vocab_parallel_sample(logits_shard, vocab_bounds, k, temperature, u):
    rank, world = dist.get_rank(), dist.get_world_size()
    b, dev = logits_shard.shape[0], logits_shard.device
    x = logits_shard.double()
    sizes = [min(k, vocab_bounds[p + 1] - vocab_bounds[p]) for p in range(world)]
    vals, idx = torch.sort(x, dim=1, descending=True, stable=True)
    mine = torch.stack([vals[:, :sizes[rank]], (idx[:, :sizes[rank]] + vocab_bounds[rank]).double()]).contiguous()
    packs = [mine if p == rank else torch.empty((2, b, sizes[p]), dtype=torch.float64, device=dev)
             for p in range(world)]
    ops = [dist.P2POp(dist.isend, mine, p) for p in range(world) if p != rank and mine.numel()]
    ops += [dist.P2POp(dist.irecv, packs[p], p) for p in range(world) if p != rank and packs[p].numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    all_vals = torch.cat([pk[0] for pk in packs], dim=1)
    all_ids = torch.cat([pk[1] for pk in packs], dim=1).long()
    top, order = torch.sort(all_vals, dim=1, descending=True, stable=True)
    ids = all_ids.gather(1, order)
    z = top / temperature
    logp = z - torch.logsumexp(z, dim=1, keepdim=True)
    cdf = torch.cumsum(torch.exp(logp), dim=1)
    pos = (cdf <= u.double().unsqueeze(1)).sum(dim=1).clamp(max=ids.shape[1] - 1).unsqueeze(1)
    return ids.gather(1, pos).squeeze(1), logp.gather(1, pos).squeeze(1)
