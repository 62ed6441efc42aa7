# Plausible bug: Bruck's index algorithm with the initial rotation and the log steps right, but the final
# rotation picks slot (s - rank) % W for source s instead of (rank - s) % W. The two agree at W = 2 and on the
# ranks where they coincide, so small tests can pass; from W = 3 on most blocks land in the wrong place.
import torch
import torch.distributed as dist


def all_to_all(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    if x.numel() == 0:
        return x.clone()
    buf = torch.roll(x.reshape(world, -1), -rank, 0).contiguous()  # slot i: the block for rank + i
    d = 1
    while d < world:
        slots = torch.tensor([i for i in range(world) if i & d])
        send_buf = buf.index_select(0, slots)
        incoming = buf.new_empty((len(slots), buf.shape[1]))
        reqs = [dist.isend(send_buf, (rank + d) % world), dist.irecv(incoming, (rank - d) % world)]
        for q in reqs:
            q.wait()
        buf[slots] = incoming
        d *= 2
    src = torch.tensor([(s - rank) % world for s in range(world)])  # BUG: should be (rank - s) % world
    return buf.index_select(0, src).reshape(x.shape)
