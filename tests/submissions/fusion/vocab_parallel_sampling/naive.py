# Correct but slow: all-gather the whole vocabulary (every shard padded to the largest), then every rank samples
# from the full [B, V] logits. Moves B * V logits where B * k candidates per rank would do.
import torch
import torch.distributed as dist


def vocab_parallel_sample(logits_shard, vocab_bounds, k, temperature, u):
    world = dist.get_world_size()
    b = logits_shard.shape[0]
    x = logits_shard if logits_shard.dtype in (torch.float32, torch.float64) else logits_shard.float()
    sizes = [vocab_bounds[p + 1] - vocab_bounds[p] for p in range(world)]
    m = max(sizes)
    padded = torch.zeros((b, m), dtype=x.dtype, device=x.device)
    padded[:, :x.shape[1]] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    full = torch.cat([pt[:, :s] for pt, s in zip(parts, sizes)], dim=1)
    vals, ids = torch.sort(full, dim=1, descending=True, stable=True)
    z = vals[:, :k].double() / temperature
    logp = z - torch.logsumexp(z, dim=1, keepdim=True)
    cdf = torch.cumsum(torch.exp(logp), dim=1)
    pos = (cdf <= u.double().unsqueeze(1)).sum(dim=1).clamp(max=k - 1).unsqueeze(1)
    return ids[:, :k].gather(1, pos).squeeze(1), logp.gather(1, pos).squeeze(1)
