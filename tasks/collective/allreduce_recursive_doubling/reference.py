import torch
import torch.distributed as dist

# Small messages on a fabric where a message costs far more than its bytes (8 us of the sender's port to post, 3 us
# of flight, 12.5 GB/s): the time is the number of dependent rounds and the messages each rank posts per round.
# Every rank keeps block sums "ending at itself": blk[l] = x[r] + x[r-1] + ... + x[r-l+1] (ranks mod W). In a round
# of span R (the length every rank has reached) and radix k, rank r sends to r + j*R (j = 1 .. k-1) the block sums
# the receiver needs and adds what r - j*R sends it: blk[l] = blk[min(l, R)] + sum_j blk_{r - jR}[min(R, l - jR)].
# The last round needs a block of W - R, which is rarely a length already held, so the lengths each round must
# carry are planned backwards from {W}: at most two per message, no message more than two vectors.
# Rounds of radix 2 cost 11 us; a round of radix k costs 8 (k - 1) + 3, so radix 3 pays where it saves a round
# (W = 3: one round of 19 us instead of two of 11; W = 5, 6: 11 + 19 instead of 3 x 11). The plan is the cheapest
# sequence of radices by that cost, computed from the sizes alone, so every rank picks the same one.
ALPHA_US, OVERHEAD_US, BYTES_PER_US = 3.0, 8.0, 12.5e3


def _radix_sequences(world: int) -> list[list[int]]:
    """Every sequence of radices (each >= 2) whose running product first reaches `world` at its last radix."""
    out = []

    def grow(seq: list[int], span: int) -> None:
        last = -(-world // span)
        for k in range(2, last + 1):
            if k == last:
                out.append(seq + [k])
            else:
                grow(seq + [k], span * k)

    grow([], 1)
    return out


def _plan(world: int, radices: list[int]):
    """spans[i] = R_i; sends[i] = [(j, lengths)]: to rank + j * R_i go the block sums of those lengths;
    need[i] = the lengths held after round i - 1 (need[-1] == [world])."""
    spans = [1]
    for k in radices[:-1]:
        spans.append(spans[-1] * k)
    need = [None] * len(radices) + [[world]]
    sends = [None] * len(radices)
    for i in reversed(range(len(radices))):
        R, held, out = spans[i], set(), {}
        for length in need[i + 1]:
            held.add(min(length, R))
            j = 1
            while length - j * R > 0:
                out.setdefault(j, set()).add(min(R, length - j * R))
                held.add(min(R, length - j * R))
                j += 1
        need[i] = sorted(held)
        sends[i] = [(j, sorted(ls)) for j, ls in sorted(out.items())]
    return spans, sends, need


def _cost_us(sends, nbytes: int) -> float:
    return sum(ALPHA_US + sum(OVERHEAD_US + len(ls) * nbytes / BYTES_PER_US for _, ls in rnd) for rnd in sends)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = x.detach().reshape(-1).clone()
    n = flat.numel()
    if world == 1 or n == 0:
        return flat.view(x.shape)
    nbytes = n * flat.element_size()
    plans = [_plan(world, r) for r in _radix_sequences(world)]
    spans, sends, need = min(plans, key=lambda p: (_cost_us(p[1], nbytes), len(p[1])))
    blk = {1: flat}
    for i, rnd in enumerate(sends):
        R, ops, got = spans[i], [], {}
        for j, ls in rnd:
            out = blk[ls[0]] if len(ls) == 1 else torch.cat([blk[l] for l in ls])
            inc = torch.empty(len(ls) * n, dtype=flat.dtype, device=flat.device)
            got[j] = {l: inc[q * n:(q + 1) * n] for q, l in enumerate(ls)}
            ops.append(dist.P2POp(dist.isend, out, (rank + j * R) % world))
            ops.append(dist.P2POp(dist.irecv, inc, (rank - j * R) % world))
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        new = {}
        for length in need[i + 1]:
            acc = blk[min(length, R)].clone()
            j = 1
            while length - j * R > 0:
                acc += got[j][min(R, length - j * R)]
                j += 1
            new[length] = acc
        blk = new
    return blk[world].view(x.shape)
