# Recursive halving and doubling with the chunk arithmetic of a world that divides the length: every block is
# n // W elements, so the n % W elements at the end are never reduced (the rank's own values come back there).
import torch
import torch.distributed as dist


def _swap(out: torch.Tensor, inc: torch.Tensor, peer: int) -> None:
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, inc, peer)]):
        req.wait()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.detach().reshape(-1).clone()
    n = flat.numel()
    if world == 1 or n == 0:
        return flat.view(x.shape)
    if world & (world - 1) or n < world:  # other worlds: send the whole vector to everyone
        bufs = [torch.empty_like(flat) for _ in range(world - 1)]
        ops = []
        for s in range(1, world):
            ops += [dist.P2POp(dist.isend, flat, (rank + s) % world), dist.P2POp(dist.irecv, bufs[s - 1], (rank - s) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        out = flat.clone()
        for b in bufs:
            out += b
        return out.view(x.shape)
    chunk = n // world  # bug: drops n % world elements
    lo, hi = 0, world
    mask = world // 2
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & mask == 0 else ((mid, hi), (lo, mid))
        inc = torch.empty((keep[1] - keep[0]) * chunk, dtype=flat.dtype)
        _swap(flat[give[0] * chunk:give[1] * chunk].clone(), inc, rank ^ mask)
        flat[keep[0] * chunk:keep[1] * chunk] += inc
        lo, hi = keep
        mask //= 2
    mask = 1
    while mask < world:
        size = hi - lo
        plo = lo + size if rank & mask == 0 else lo - size
        inc = torch.empty(size * chunk, dtype=flat.dtype)
        _swap(flat[lo * chunk:hi * chunk].clone(), inc, rank ^ mask)
        flat[plo * chunk:(plo + size) * chunk] = inc
        lo, hi = min(lo, plo), max(hi, plo + size)
        mask *= 2
    return flat.view(x.shape)
