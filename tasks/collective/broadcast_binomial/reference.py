import torch
import torch.distributed as dist


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == root:
        out = x.detach().contiguous().clone()
    else:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if world == 1 or out.numel() == 0:  # every rank knows the shape: an empty tensor needs no message
        return out
    v = (rank - root) % world  # rank relative to the root
    # Receive once, from the parent: v with its lowest set bit cleared.
    mask = 1
    while mask < world:
        if v & mask:
            dist.recv(out, (v - mask + root) % world)
            break
        mask <<= 1
    # Forward to the children v + 2^j for every 2^j below that bit, largest subtree first (it has the most
    # rounds still to go). The sends are posted together so they overlap.
    reqs = []
    mask >>= 1
    while mask > 0:
        if v + mask < world:
            reqs.append(dist.isend(out, (v + mask + root) % world))
        mask >>= 1
    for r in reqs:
        r.wait()
    return out
