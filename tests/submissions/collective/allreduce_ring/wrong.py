# A ring all-reduce with a classic bug: the all-gather phase starts from the wrong chunk index,
# so each rank overwrites a reduced chunk with a stale one.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.detach().clone().reshape(-1)
    chunks = list(torch.tensor_split(out, world))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_idx, recv_idx = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv_idx])
        for r in [dist.isend(chunks[send_idx], right), dist.irecv(incoming, left)]:
            r.wait()
        chunks[recv_idx] += incoming
    for step in range(world - 1):
        send_idx, recv_idx = (rank - step) % world, (rank - step - 1) % world  # bug: off by one chunk
        incoming = torch.empty_like(chunks[recv_idx])
        for r in [dist.isend(chunks[send_idx], right), dist.irecv(incoming, left)]:
            r.wait()
        chunks[recv_idx].copy_(incoming)
    return out.reshape(x.shape)
