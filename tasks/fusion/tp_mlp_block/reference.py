import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp_block(x: torch.Tensor, norm_weight: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                 eps: float) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    n, d = x.shape
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32  # compute in float32 at least
    xf = x.to(ct)
    # RMSNorm's statistics are per token: computed on this rank's own rows, before anything moves. The normalised
    # rows travel in the input's dtype (bfloat16 stays bfloat16 on the wire).
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(ct)).to(x.dtype).contiguous()
    w1c, w2c = w1.to(ct), w2.to(ct)

    def mlp(rows: torch.Tensor) -> torch.Tensor:
        """This rank's share (its ffn columns) of the MLP output for one block of rows."""
        return F.gelu(rows.to(ct) @ w1c) @ w2c

    # All-gather of h, one shifted step at a time: at step t this rank sends h to rank + t and receives the block
    # of rank - t (every step a permutation: no link carries two messages). Step t + 1 is posted before block t is
    # multiplied, so the matmuls run while the next block travels. Each step is one batch, posted in the same
    # order on every rank, which NCCL pairs without deadlock.
    def gather_step(t: int):
        buf = torch.empty_like(h)
        ops = [dist.P2POp(dist.isend, h, (rank + t) % world), dist.P2POp(dist.irecv, buf, (rank - t) % world)]
        return dist.batch_isend_irecv(ops), buf

    partial: list = [None] * world  # partial[s]: this rank's contribution to rank s's output rows
    pending = gather_step(1) if world > 1 else None
    acc = xf + mlp(h)  # own rows: residual plus own contribution, no communication
    for t in range(1, world):
        reqs, buf = pending
        for req in reqs:
            req.wait()
        if t + 1 < world:
            pending = gather_step(t + 1)
        partial[(rank - t) % world] = mlp(buf).to(x.dtype).contiguous()

    # Reduce-scatter of the partial outputs, in the same shifted steps: at step t this rank sends its
    # contribution for rank - t there and adds the one that rank + t made for it.
    for t in range(1, world):
        inc = torch.empty((n, d), dtype=x.dtype, device=x.device)
        ops = [dist.P2POp(dist.isend, partial[(rank - t) % world], (rank - t) % world),
               dist.P2POp(dist.irecv, inc, (rank + t) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        acc += inc.to(ct)
    return acc
