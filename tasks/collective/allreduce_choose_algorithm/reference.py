import torch
import torch.distributed as dist

# One all-reduce for every size, on a fabric where a message costs 8 us of its sender's port to post, 3 us of
# flight and its bytes at 12.5 GB/s. Small vectors are latency-bound (count dependent rounds and messages per
# round), large ones bandwidth-bound (2 (W - 1) / W of the vector out of every port, in as few messages as
# possible), and in between the best schedule reduce-scatters part of the way and all-reduces the pieces whole.
# Every plan below is costed on that model from the sizes alone, so every rank picks the same, cheapest one:
#  - block sums (small vectors, any W): every rank keeps the sum of the l consecutive ranks ending at itself
#    (x[r] + x[r-1] + ..., ranks mod W); a round of radix k sends block sums to r + jR (j < k, R the span reached)
#    and multiplies the span by k. The lengths each round must carry are planned backwards from {W}, so the last
#    round does not overshoot: ceil(log2 W) rounds of one message, or fewer rounds of radix 3 where that is cheaper
#    (W = 3: one round of 19 us; W = 5, 6: 11 + 19 us).
#  - levels: W = k_1 x ... x k_t x G. Level i groups the ranks that differ only in their i-th mixed-radix digit:
#    each reduce-scatters its segment among its k_i members (k_i - 1 messages, one piece per peer) and keeps the
#    piece of its digit; the G consecutive ranks that share all t digits all-reduce their piece by block sums;
#    the levels all-gather in reverse. t = 0 is the block-sum all-reduce of the whole vector; W = 2^m with levels
#    of 2 and G = 2 is Rabenseifner's recursive halving and doubling with the innermost halving and doubling steps
#    merged into one swap (the same bytes, one message fewer); medium sizes stop after a level or two.
#  - shifts (W = 5, 7, ... where no product of levels fits): a bandwidth-optimal reduce-scatter over relative
#    blocks (rank r's block j is block (r + j) % W), in rounds of span R from the top down: send the blocks
#    [jR, (j + 1) R) still held to r + jR and add what r - jR sends into blocks [0, R); then the all-gather over
#    the same spans bottom up.

ALPHA_US, OVERHEAD_US, BYTES_PER_US = 3.0, 8.0, 12.5e3


def _round_us(message_bytes: list[float]) -> float:
    sent = [b for b in message_bytes if b > 0]
    return ALPHA_US + sum(OVERHEAD_US + b / BYTES_PER_US for b in sent) if sent else 0.0


def _radix_sequences(world: int) -> list[tuple[int, ...]]:
    """Every sequence of radices (each >= 2) whose running product first reaches `world` at its last radix."""
    out = []

    def grow(seq: tuple[int, ...], span: int) -> None:
        last = -(-world // span)
        for k in range(2, last + 1):
            if k == last:
                out.append(seq + (k,))
            else:
                grow(seq + (k,), span * k)

    if world > 1:
        grow((), 1)
    return out


def _level_sequences(world: int) -> list[tuple[int, ...]]:
    """Every sequence of radices (each >= 2) whose product divides `world`, the empty one included."""
    out = [()]
    for k in range(2, world + 1):
        if world % k == 0:
            out += [(k,) + rest for rest in _level_sequences(world // k)]
    return out


# ---- block sums: the all-reduce of a small vector among `group` consecutive ranks --------------------------------
def _sums_plan(group: int, radices: tuple[int, ...]):
    """spans[i] = R_i; sends[i] = [(j, lengths)]: to member + j * R_i go its block sums of those lengths;
    need[i] = the lengths held before round i (need[-1] == [group])."""
    spans = [1]
    for k in radices[:-1]:
        spans.append(spans[-1] * k)
    need = [None] * len(radices) + [[group]]
    sends = [None] * len(radices)
    for i in reversed(range(len(radices))):
        R, held, out = spans[i], set(), {}
        for length in need[i + 1]:
            held.add(min(length, R))
            j = 1
            while length - j * R > 0:
                piece = min(R, length - j * R)
                out.setdefault(j, set()).add(piece)
                held.add(piece)
                j += 1
        need[i] = sorted(held)
        sends[i] = [(j, sorted(ls)) for j, ls in sorted(out.items())]
    return spans, sends, need


def _sums_us(plan, nbytes: float) -> float:
    return sum(_round_us([len(ls) * nbytes for _, ls in rnd]) for rnd in plan[1])


def _sums_all_reduce_(vec: torch.Tensor, me: int, group: int, base: int, plan) -> None:
    """vec <- the sum of vec over ranks base .. base + group - 1 (this rank is base + me)."""
    spans, sends, need = plan
    n = vec.numel()
    blk = {1: vec.clone()}
    for i, rnd in enumerate(sends):
        R, ops, got = spans[i], [], {}
        for j, ls in rnd:
            out = blk[ls[0]] if len(ls) == 1 else torch.cat([blk[l] for l in ls])
            inc = torch.empty(len(ls) * n, dtype=vec.dtype, device=vec.device)
            got[j] = {l: inc[q * n:(q + 1) * n] for q, l in enumerate(ls)}
            ops.append(dist.P2POp(dist.isend, out, base + (me + j * R) % group))
            ops.append(dist.P2POp(dist.irecv, inc, base + (me - j * R) % group))
        _run(ops)
        new = {}
        for length in need[i + 1]:
            acc = blk[min(length, R)].clone()
            j = 1
            while length - j * R > 0:
                acc += got[j][min(R, length - j * R)]
                j += 1
            new[length] = acc
        blk = new
    vec.copy_(blk[group])


def _run(ops) -> None:
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def _sizes(n: int, k: int) -> list[int]:
    """Element counts of torch.tensor_split(v, k) for a vector of n elements."""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


# ---- levels: reduce-scatter by mixed-radix digits, a group all-reduce, all-gather -------------------------------
def _levels_us(world: int, n: int, esize: int, levels, inner) -> float:
    total, seg = 0.0, n
    for k in levels:
        sizes = _sizes(seg, k)
        total += 2 * _round_us([max(sizes) * esize] * (k - 1))  # reduce-scatter and all-gather of this level
        seg = max(sizes)
    if inner is not None:
        total += _sums_us(inner, seg * esize)
    return total


def _levels_all_reduce(flat: torch.Tensor, rank: int, world: int, levels, inner) -> None:
    stride, seg, path = world, flat, []
    for k in levels:
        stride //= k
        d = (rank // stride) % k
        pieces = list(torch.tensor_split(seg, k))
        got, ops = [], []
        for t in range(1, k):
            to, frm = (d + t) % k, (d - t) % k
            if pieces[to].numel():
                ops.append(dist.P2POp(dist.isend, pieces[to], rank + (to - d) * stride))
            if pieces[d].numel():
                got.append(torch.empty_like(pieces[d]))
                ops.append(dist.P2POp(dist.irecv, got[-1], rank + (frm - d) * stride))
        _run(ops)
        for g in got:
            pieces[d] += g
        path.append((pieces, d, k, stride))
        seg = pieces[d]
    group = stride
    if group > 1 and seg.numel():
        _sums_all_reduce_(seg, rank % group, group, rank - rank % group, inner)
    for pieces, d, k, stride in reversed(path):
        ops = []
        for t in range(1, k):
            to, frm = (d - t) % k, (d + t) % k
            if pieces[d].numel():
                ops.append(dist.P2POp(dist.isend, pieces[d], rank + (to - d) * stride))
            if pieces[frm].numel():
                ops.append(dist.P2POp(dist.irecv, pieces[frm], rank + (frm - d) * stride))
        _run(ops)


# ---- shifts: reduce-scatter and all-gather over relative blocks, any world size ---------------------------------
def _shift_spans(world: int, radices) -> list[int]:
    spans = [1]
    for k in radices:
        spans.append(min(spans[-1] * k, world))
    return spans


def _shift_us(world: int, n: int, esize: int, radices) -> float:
    block = -(-n // world) * esize
    spans, total = _shift_spans(world, radices), 0.0
    for i, k in enumerate(radices):
        R, H = spans[i], spans[i + 1]
        counts = [min(R, H - j * R) for j in range(1, k) if j * R < H]
        total += 2 * _round_us([c * block for c in counts])
    return total


def _shift_all_reduce(flat: torch.Tensor, rank: int, world: int, radices) -> None:
    blocks = list(torch.tensor_split(flat, world))
    spans = _shift_spans(world, radices)

    def rel(a: int, b: int) -> list[torch.Tensor]:
        return [blocks[(rank + j) % world] for j in range(a, b)]

    def numel(views) -> int:
        return sum(v.numel() for v in views)

    for i in reversed(range(len(radices))):  # reduce-scatter: hold blocks [0, spans[i + 1]), keep [0, spans[i])
        R, H = spans[i], spans[i + 1]
        ops, adds = [], []
        for j in range(1, radices[i]):
            if j * R >= H:
                break
            cnt = min(R, H - j * R)
            out, mine = rel(j * R, j * R + cnt), rel(0, cnt)  # mine: what r - jR sends (an empty run: nothing)
            if numel(out):
                ops.append(dist.P2POp(dist.isend, torch.cat(out), (rank + j * R) % world))
            if numel(mine):
                inc = torch.empty(numel(mine), dtype=flat.dtype, device=flat.device)
                ops.append(dist.P2POp(dist.irecv, inc, (rank - j * R) % world))
                adds.append((mine, inc))
        _run(ops)
        for mine, inc in adds:
            o = 0
            for v in mine:
                v += inc[o:o + v.numel()]
                o += v.numel()
    for i in range(len(radices)):  # all-gather: hold blocks [0, spans[i]), gain [spans[i], spans[i + 1])
        R = spans[i]
        ops, puts = [], []
        for j in range(1, radices[i]):
            if j * R >= world:
                break
            cnt = min(R, world - j * R)
            out, dest = rel(0, cnt), rel(j * R, j * R + cnt)
            if numel(out):
                ops.append(dist.P2POp(dist.isend, torch.cat(out), (rank - j * R) % world))
            if numel(dest):
                inc = torch.empty(numel(dest), dtype=flat.dtype, device=flat.device)
                ops.append(dist.P2POp(dist.irecv, inc, (rank + j * R) % world))
                puts.append((dest, inc))
        _run(ops)
        for dest, inc in puts:
            o = 0
            for v in dest:
                v.copy_(inc[o:o + v.numel()])
                o += v.numel()


def _choose(world: int, n: int, esize: int):
    best = None
    for levels in _level_sequences(world):
        group = world
        for k in levels:
            group //= k
        for radices in _radix_sequences(group) or [None]:
            inner = _sums_plan(group, radices) if radices else None
            cost = _levels_us(world, n, esize, levels, inner)
            if best is None or cost < best[0]:
                best = (cost, "levels", levels, inner)
    for radices in _radix_sequences(world):
        cost = _shift_us(world, n, esize, radices)
        if cost < best[0]:
            best = (cost, "shifts", radices, None)
    return best


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.detach().reshape(-1).clone()
    n = flat.numel()
    if world == 1 or n == 0:
        return flat.view(x.shape)
    _, family, plan, inner = _choose(world, n, flat.element_size())
    if family == "levels":
        _levels_all_reduce(flat, rank, world, plan, inner)
    else:
        _shift_all_reduce(flat, rank, world, plan)
    return flat.view(x.shape)
