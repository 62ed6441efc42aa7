# Plausible bug: the 1F1B schedule is right, but the backward rounds use the NEWEST micro-batch held instead of
# the oldest (a LIFO stack of stashes, as with recursion), and the gradient is sent with that index. The
# messages match in number and size, nothing hangs, but the gradients of different micro-batches get paired with
# the wrong activations whenever more than one micro-batch is held.
import torch
import torch.distributed as dist


def pipeline_step(micro_batches, targets, forward, backward, num_micro_batches, template):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    prev, nxt = rank - 1, rank + 1
    m_count = num_micro_batches
    out = torch.empty((m_count, *template.shape), dtype=template.dtype) if first or last else None
    held = []

    def recv(src):
        buf = torch.empty_like(template)
        dist.recv(buf, src)
        return buf

    def fwd(i, x):
        y = forward(i, x)
        held.append(i)
        if last:
            out[i] = y
        return y

    def bwd(g):
        i = held.pop()  # bug: newest first
        gx = backward(i, g)
        if first:
            out[i] = gx
        return gx, i

    warmup = min(world - rank - 1, m_count)
    f = 0
    for _ in range(warmup):
        x = micro_batches[f] if first else recv(prev)
        dist.send(fwd(f, x).contiguous(), nxt)
        f += 1
    for _ in range(m_count - warmup):
        x = micro_batches[f] if first else recv(prev)
        y = fwd(f, x)
        f += 1
        if last:
            g = y - targets[held[-1]]
        else:
            dist.send(y.contiguous(), nxt)
            g = recv(nxt)
        gx, _ = bwd(g)
        if not first:
            dist.send(gx.contiguous(), prev)
    for _ in range(warmup):
        gx, _ = bwd(recv(nxt))
        if not first:
            dist.send(gx.contiguous(), prev)
    return out
