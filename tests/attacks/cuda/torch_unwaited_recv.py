# TASK: p2p/ring_shift
# EXPECT: timed
# The reference ring shift without `wait()` on its requests: the send and receive run on NCCL's own stream, and
# nothing orders the stream the judge times after them, so each call's own marks are microseconds apart while
# the transfers queue up behind. The outputs are right once the device is synchronised. The judge sees the
# device still busy after the last mark and times the calls as a whole, each an equal share of the window.
import torch
import torch.distributed as dist


def ring_shift(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1 or x.numel() == 0:
        return x.detach().clone()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dist.batch_isend_irecv([dist.P2POp(dist.isend, x.detach().contiguous(), (rank + 1) % world),
                            dist.P2POp(dist.irecv, out, (rank - 1) % world)])
    return out
