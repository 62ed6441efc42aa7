# A log-step exchange with a classic slip: after the first round it forwards the partial sum it just received
# instead of its running sum, so from the second round on each rank misses some contributions.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    acc = x.detach().reshape(-1).clone()
    if world == 1 or acc.numel() == 0:
        return acc.view(x.shape)
    out, d = acc, 1
    while d < world:
        inc = torch.empty_like(acc)
        ops = [dist.P2POp(dist.isend, out, (rank + d) % world), dist.P2POp(dist.irecv, inc, (rank - d) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        acc = acc + inc
        out = inc  # bug: should forward acc
        d *= 2
    return acc.view(x.shape)
