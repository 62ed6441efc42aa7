import torch
import torch.distributed as dist


def reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Rank r returns block r (rows r*m:(r+1)*m) of the element-wise sum over all ranks of x."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if x.shape[0] % world:
        raise NotImplementedError("x must hold world_size blocks of equal size along dim 0")
    m = x.shape[0] // world
    acc = x.detach().clone()  # this rank's partial sums, block by block

    def block(j: int) -> torch.Tensor:
        return acc[j * m:(j + 1) * m]

    if world == 1 or acc.numel() == 0:
        return block(rank).clone()
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = torch.empty_like(block(0))
    # Ring: in each step every rank passes the partial sum of one block to its right neighbour and adds the
    # partial sum arriving from its left neighbour into its own copy of that block. After world - 1 steps the
    # block a rank owns has passed through every rank.
    for step in range(world - 1):
        send_idx = (rank - step - 1) % world
        recv_idx = (rank - step) % world
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, block(send_idx), right),
                                       dist.P2POp(dist.irecv, incoming, left)])
        for req in reqs:
            req.wait()
        block(recv_idx).add_(incoming)
    return block(rank).clone()
