# Correct but uncompressed: a two-shot all-reduce in float32, four bytes per element on the wire where int8
# with block scales needs about one.
import torch
import torch.distributed as dist


def all_reduce_int8(x: torch.Tensor, block: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.detach().reshape(-1).to(torch.float32).clone()
    shards = list(torch.tensor_split(flat, world))
    peers = [p for p in range(world) if p != rank]
    inc = {p: torch.empty_like(shards[rank]) for p in peers}
    ops = [dist.P2POp(dist.isend, shards[p], p) for p in peers if shards[p].numel()]
    ops += [dist.P2POp(dist.irecv, inc[p], p) for p in peers if shards[rank].numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    for p in peers:
        shards[rank] += inc[p]
    ops = [dist.P2POp(dist.isend, shards[rank], p) for p in peers if shards[rank].numel()]
    ops += [dist.P2POp(dist.irecv, shards[p], p) for p in peers if shards[p].numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    return flat.to(x.dtype).view(x.shape)
