import torch
import torch.distributed as dist


def all_to_all(x: torch.Tensor) -> torch.Tensor:
    """Block j of the result (rows j*m:(j+1)*m) is block `rank` of rank j's x; x holds world_size blocks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if x.shape[0] % world:
        raise NotImplementedError("x must hold world_size blocks of equal size along dim 0")
    m = x.shape[0] // world
    src = x.contiguous()
    out = torch.empty_like(src)
    out[rank * m:(rank + 1) * m] = src[rank * m:(rank + 1) * m]

    # Pairwise schedule: in step s every rank sends to the rank s ahead of it and receives from the rank s
    # behind it, so each rank sends and receives exactly one block per step.
    for step in range(1, world):
        dst, peer = (rank + step) % world, (rank - step) % world
        send_buf = src[dst * m:(dst + 1) * m]
        recv_buf = out[peer * m:(peer + 1) * m]
        # Blocking calls. Even ranks send first and odd ranks receive first, so that a send always finds its
        # receive posted and the two halves of the step cannot both wait.
        if rank % 2 == 0:
            dist.send(send_buf, dst, tag=step)
            dist.recv(recv_buf, peer, tag=step)
        else:
            dist.recv(recv_buf, peer, tag=step)
            dist.send(send_buf, dst, tag=step)
    return out
