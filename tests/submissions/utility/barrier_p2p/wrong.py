# WRONG: rank 0 waits for everybody, but the other ranks never wait for rank 0's release.
# Under gloo a send completes only once rank 0 has posted the matching receive, so rank r leaves after rank 0
# (and, as rank 0 receives in order, ranks 1..r-1) entered -- but not after ranks r+1.. entered.
# (Hence this happens to be a correct barrier at world size 2; it fails from 3 ranks on.)
import torch
import torch.distributed as dist


def barrier() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1, dtype=torch.uint8)
    if rank == 0:
        for src in range(1, world):
            dist.recv(token, src)
    else:
        dist.send(token, 0)
