import torch
import torch.distributed as dist

# The root's outgoing port is the bottleneck: it must send the tensor at least once (size / 370 GB/s), and a tree
# or a chain sends it once per level or per hop. Here the root sends each of the W - 1 other ranks a different
# 1 / (W - 1) of the tensor, once, and those ranks forward their part to each other: every byte leaves the root
# once, and every rank's incoming port carries the tensor once. The parts are cut into a few chunks that the
# root interleaves, so that forwarding starts before the root is done (a pipeline of depth two; a chain's is
# W - 1). Every chunk costs a message (0.5 us of the sender's port in the model), so the chunk count is picked
# from the model's costs; a tensor too small to split pays off goes from the root to every rank directly.
ALPHA_US, OVERHEAD_US, BYTES_PER_US = 2.0, 0.5, 370e3


def _estimate(world: int, nbytes: int, chunks: int) -> float:
    part = nbytes / (world - 1) / chunks
    return (2 * ALPHA_US + (world - 1) * chunks * OVERHEAD_US + nbytes / BYTES_PER_US
            + (world - 2) * (OVERHEAD_US + part / BYTES_PER_US))


def _plan(world: int, nbytes: int, numel: int) -> int:
    """0: straight from the root to every rank; C >= 1: scatter and forward in C chunks per part."""
    direct = ALPHA_US + (world - 1) * (OVERHEAD_US + nbytes / BYTES_PER_US)
    if world <= 2 or numel < world - 1:
        return 0
    best = min(range(1, 9), key=lambda c: _estimate(world, nbytes, c))
    return best if _estimate(world, nbytes, best) < direct and numel >= (world - 1) * best else 0


def _wait(reqs) -> None:
    for req in reqs:
        req.wait()


def broadcast(x: torch.Tensor, root: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.detach().clone() if rank == root else torch.empty_like(x)
    flat = out.view(-1)
    nbytes = flat.numel() * flat.element_size()
    if world == 1 or nbytes == 0:
        return out
    chunks = _plan(world, nbytes, flat.numel())
    if chunks == 0:
        if rank == root:
            _wait(dist.batch_isend_irecv([dist.P2POp(dist.isend, flat, (root + s) % world) for s in range(1, world)]))
        else:
            dist.recv(flat, root)
        return out
    real = lambda v: (root + v) % world  # ranks relative to the root: the root is 0, part i goes to i + 1
    parts = [list(torch.tensor_split(p, chunks)) for p in torch.tensor_split(flat, world - 1)]
    me = (rank - root) % world - 1
    if me < 0:  # the root: chunk c of every part, then chunk c + 1 of every part, ...
        _wait(dist.batch_isend_irecv([dist.P2POp(dist.isend, parts[i][c], real(i + 1))
                                      for c in range(chunks) for i in range(world - 1)]))
        return out
    others = world - 1
    own = [dist.irecv(parts[me][c], root) for c in range(chunks)]
    pending = []
    for c in range(chunks):
        own[c].wait()
        ops = []  # forward my chunk c to every other non-root and take theirs, in shift order
        for s in range(1, others):
            dst, src = (me + s) % others, (me - s) % others
            ops.append(dist.P2POp(dist.isend, parts[me][c], real(dst + 1)))
            ops.append(dist.P2POp(dist.irecv, parts[src][c], real(src + 1)))
        pending += dist.batch_isend_irecv(ops) if ops else []
    _wait(pending)
    return out
