import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_attention(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor,
                 num_heads: int, num_kv_heads: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    n, d = x.shape
    q_loc = num_heads // world  # this rank's query heads: rank * q_loc .. rank * q_loc + q_loc - 1
    hd = wq.shape[1] // q_loc
    group = num_heads // num_kv_heads  # query heads per kv head
    first_kv = rank * q_loc // group  # the first kv head of wk / wv (they hold the heads this rank's queries read)
    m = wk.shape[1] // hd
    s = world * n
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32  # compute in float32 at least

    # 1. All-gather of the activations (Megatron's sequence parallelism): every block to every peer at once, in
    #    shifted order (the t-th message of every rank goes to rank + t: each round of messages is a permutation,
    #    so no port carries two at a time), one latency in all instead of one per step. The library collective
    #    would pay one latency per ring step. Moving the activations, not the weights: the block's weights (about
    #    4 * d * H * D / world per rank) outweigh a few hundred tokens of activations.
    xc = x.contiguous()
    full = torch.empty((world, n, d), dtype=x.dtype, device=x.device)
    full[rank].copy_(xc)
    ops = []
    for t in range(1, world):
        ops.append(dist.P2POp(dist.isend, xc, (rank + t) % world))
        ops.append(dist.P2POp(dist.irecv, full[(rank - t) % world], (rank - t) % world))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()

    # 2. This rank's heads over the whole sequence (rows in rank order = sequence order, so the causal mask is
    #    the plain lower triangle). GQA: local query head i reads kv head (rank * q_loc + i) // group, which is
    #    local kv head that minus first_kv; neighbouring query heads share a kv head (repeat_interleave order).
    xs = full.view(s, d).to(ct)
    q = (xs @ wq.to(ct)).view(s, q_loc, hd).transpose(0, 1)
    k = (xs @ wk.to(ct)).view(s, m, hd).transpose(0, 1)
    v = (xs @ wv.to(ct)).view(s, m, hd).transpose(0, 1)
    kv_of = (torch.arange(q_loc, device=x.device) + rank * q_loc) // group - first_kv
    o = F.scaled_dot_product_attention(q, k[kv_of], v[kv_of], is_causal=True)  # [q_loc, S, D]

    # 3. Row-parallel output projection: this rank's heads' share of every row of Y; Y is the sum of the shares.
    part = (o.transpose(0, 1).reshape(s, q_loc * hd) @ wo.to(ct)).view(world, n, d)

    # 4. Reduce-scatter back to sequence shards, again every peer at once in shifted order: this rank sends the
    #    share of rank - t's rows there and receives rank + t's share of its own rows. Shares travel in the input
    #    dtype (bfloat16 stays bfloat16: half the bytes) and are summed in float32.
    acc = part[rank].clone()
    if world > 1:
        send = part.to(x.dtype)
        inc = torch.empty((world - 1, n, d), dtype=x.dtype, device=x.device)
        ops = []
        for t in range(1, world):
            ops.append(dist.P2POp(dist.isend, send[(rank - t) % world], (rank - t) % world))
            ops.append(dist.P2POp(dist.irecv, inc[t - 1], (rank + t) % world))
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        acc += inc.to(ct).sum(0)
    return acc
