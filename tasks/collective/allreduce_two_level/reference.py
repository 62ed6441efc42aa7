import torch
import torch.distributed as dist

# Three schedules; the cheapest on the modelled switch (2 us per message, 0.5 us of the sender's port per
# message, 370 GB/s per port) is picked from the sizes alone, so every rank picks the same one.
#  - one-shot: every rank sends x to every rank; sums are local. One latency, W - 1 vectors out of every port.
#  - recursive doubling (W and g powers of two): step k swaps the whole vector with rank ^ 2^k and adds. The first
#    log2 g partners are in the group, so the group sum appears on the way. log2 W latencies and vectors.
#  - three phases over g shards of the flat tensor (any W and g):
#    1. within each group, a reduce-scatter: each member ends with the group's partial sum of the shards it owns
#       (in a group of q members, member m owns shards m, m + q, ...; q < g only in a smaller last group);
#    2. across groups, for each shard, an all-reduce among its owners (one rank per group): its total;
#    3. within each group, one all-gather of (partial, total) of every member's shards.
#    The group sum comes out of phase 1 and only a shard per rank crosses groups: about 3 (g-1)/g vectors
#    through each port, whatever W is. Each exchange goes to all peers at once, in shift order (to + s, from - s).
TAG_RS, TAG_X, TAG_AG = 1, 2, 3
ALPHA_US, OVERHEAD_US, BYTES_PER_US = 2.0, 0.5, 370e3


def _pow2(q: int) -> bool:
    return q & (q - 1) == 0


def _one_shot_us(q: int, nbytes: float) -> float:
    return ALPHA_US + (q - 1) * (OVERHEAD_US + nbytes / BYTES_PER_US) if q > 1 else 0.0


def _two_shot_us(q: int, nbytes: float) -> float:
    return 2 * ALPHA_US + 2 * (q - 1) * (OVERHEAD_US + nbytes / q / BYTES_PER_US) if q > 1 else 0.0


def _run(ops) -> None:
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def _exchange(members: list[int], me: int, send_of, recv_of, tag: int) -> None:
    """Send send_of(j) to member j and receive recv_of(j) from member j, for every other member, all at once."""
    q, ops = len(members), []
    for s in range(1, q):
        dst, src = (me + s) % q, (me - s) % q
        out, inc = send_of(dst), recv_of(src)
        if out.numel():
            ops.append(dist.P2POp(dist.isend, out, members[dst], tag=tag))
        if inc.numel():
            ops.append(dist.P2POp(dist.irecv, inc, members[src], tag=tag))
    _run(ops)


def _sum_of_all(vec: torch.Tensor, members: list[int], me: int, tag: int) -> torch.Tensor:
    """Every member's vec, summed in member order (so the same bits on every member)."""
    got = [vec if j == me else torch.empty_like(vec) for j in range(len(members))]
    _exchange(members, me, lambda j: vec, lambda j: got[j], tag)
    total = got[0].clone()
    for t in got[1:]:
        total += t
    return total


def _all_reduce_(seg: torch.Tensor, members: list[int], me: int, tag: int) -> None:
    q = len(members)
    if q == 1 or seg.numel() == 0:
        return
    nbytes = seg.numel() * seg.element_size()
    if _one_shot_us(q, nbytes) <= _two_shot_us(q, nbytes):
        seg.copy_(_sum_of_all(seg.clone(), members, me, tag))
        return
    pieces = list(torch.tensor_split(seg, q))
    got = [torch.empty_like(pieces[me]) for _ in range(q)]
    _exchange(members, me, lambda j: pieces[j], lambda j: got[j], tag)
    for j in range(q):
        if j != me:
            pieces[me] += got[j]
    _exchange(members, me, lambda j: pieces[me], lambda j: pieces[j], tag)


def two_level_all_reduce(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.detach().reshape(-1)
    n = flat.numel()
    g = max(1, min(group_size, world))
    groups = [list(range(s, min(s + g, world))) for s in range(0, world, g)]
    members = groups[rank // g]
    q, me, G = len(members), rank % g, len(groups)
    if world == 1 or n == 0:
        return flat.clone().view(x.shape), flat.clone().view(x.shape)

    nbytes = n * flat.element_size()
    one_shot = _one_shot_us(world, nbytes)
    doubling = (world.bit_length() - 1) * (ALPHA_US + OVERHEAD_US + nbytes / BYTES_PER_US)
    three = (_one_shot_us(g, nbytes / g) + _one_shot_us(g, 2 * nbytes / g)
             + min(_one_shot_us(G, nbytes / g), _two_shot_us(G, nbytes / g)))
    if _pow2(world) and _pow2(g) and doubling < min(one_shot, three):
        buf, group_sum = flat.clone(), flat.clone()
        d = 1
        while d < world:
            incoming = torch.empty_like(buf)
            _exchange([rank, rank ^ d], 0, lambda j: buf, lambda j: incoming, TAG_X)
            buf += incoming  # a + b here, b + a on the partner: the same bits
            d *= 2
            if d == g:
                group_sum = buf.clone()
        return group_sum.view(x.shape), buf.view(x.shape)
    if one_shot <= three:
        got = [flat if j == rank else torch.empty_like(flat) for j in range(world)]
        _exchange(list(range(world)), rank, lambda j: flat, lambda j: got[j], TAG_X)
        group_sum = got[members[0]].clone()
        for j in members[1:]:
            group_sum += got[j]
        total = got[0].clone()
        for t in got[1:]:
            total += t
        return group_sum.view(x.shape), total.view(x.shape)

    base, extra = divmod(n, g)
    shard = [base + (1 if i < extra else 0) for i in range(g)]
    off = [0]
    for s in shard:
        off.append(off[-1] + s)
    owned = [[i for i in range(m, g, q)] for m in range(q)]  # shards of each member of this group
    block = [sum(shard[i] for i in owned[m]) for m in range(q)]
    start = [sum(block[:m]) for m in range(q + 1)]
    # 1. group reduce-scatter over a copy laid out by owner, so that each member's shards are one block
    laid = torch.cat([flat[off[i]:off[i + 1]] for m in range(q) for i in owned[m]])
    got = [torch.empty(block[me], dtype=flat.dtype, device=flat.device) for _ in range(q)]
    _exchange(members, me, lambda j: laid[start[j]:start[j + 1]], lambda j: got[j], TAG_RS)
    part = laid[start[me]:start[me + 1]].clone()
    for j in range(q):
        if j != me:
            part += got[j]
    # 2. the total of each owned shard, among the owners of that shard in every group, in shard order
    tot = part.clone()
    pos = 0
    for i in owned[me]:
        column = [grp[i % len(grp)] for grp in groups]
        _all_reduce_(tot[pos:pos + shard[i]], column, column.index(rank), TAG_X)
        pos += shard[i]
    # 3. one group all-gather of (partial, total) per member
    both = [torch.cat([part, tot]) if j == me else torch.empty(2 * block[j], dtype=flat.dtype, device=flat.device)
            for j in range(q)]
    _exchange(members, me, lambda j: both[me], lambda j: both[j], TAG_AG)
    group_sum, total = torch.empty_like(flat), torch.empty_like(flat)
    for m in range(q):
        o = 0
        for i in owned[m]:
            group_sum[off[i]:off[i + 1]] = both[m][o:o + shard[i]]
            total[off[i]:off[i + 1]] = both[m][block[m] + o:block[m] + o + shard[i]]
            o += shard[i]
    return group_sum.view(x.shape), total.view(x.shape)
