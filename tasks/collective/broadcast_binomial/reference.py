import torch
import torch.distributed as dist


def _post(ops: list) -> list:
    """Post point-to-point ops as one batch (NCCL issues a batch as one group); no ops, no requests."""
    return dist.batch_isend_irecv(ops) if ops else []


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == root:
        out = x.detach().contiguous().clone()
    else:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if world == 1 or out.numel() == 0:  # every rank knows the shape: an empty tensor needs no message
        return out
    v = (rank - root) % world  # rank relative to the root
    # Receive once, from the parent: v with its lowest set bit cleared. (A batch of one, like every message here.)
    mask = 1
    while mask < world:
        if v & mask:
            for req in _post([dist.P2POp(dist.irecv, out, (v - mask + root) % world)]):
                req.wait()
            break
        mask <<= 1
    # Forward to the children v + 2^j for every 2^j below that bit, largest subtree first (it has the most rounds
    # still to go). The sends go out together in one batch, so they overlap. Every message flows from parent to
    # child, so no ranks can wait on each other in a circle.
    sends = []
    mask >>= 1
    while mask > 0:
        if v + mask < world:
            sends.append(dist.P2POp(dist.isend, out, (v + mask + root) % world))
        mask >>= 1
    for req in _post(sends):
        req.wait()
    return out
