# Plausible bug: the data are flattened so that runs are 1-D slices, but the block size is taken as
# x.shape[0] (rows) instead of x.numel() (elements). Right for 1-D inputs, wrong as soon as x has more than one
# dimension: the runs land at the wrong offsets and most of the result is never written.
import torch
import torch.distributed as dist


def all_gather(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    blk = x.shape[0]  # BUG: should be x.numel()
    flat = torch.zeros(world * x.numel(), dtype=x.dtype)
    flat[rank * blk:rank * blk + x.numel()] = x.reshape(-1)
    d = 1
    while d < world:
        partner = rank ^ d
        mine, theirs = (rank // d) * d, (partner // d) * d
        reqs = [dist.isend(flat[mine * blk:(mine + d) * blk], partner),
                dist.irecv(flat[theirs * blk:(theirs + d) * blk], partner)]
        for r in reqs:
            r.wait()
        d *= 2
    return flat.reshape(world * x.shape[0], *x.shape[1:])
