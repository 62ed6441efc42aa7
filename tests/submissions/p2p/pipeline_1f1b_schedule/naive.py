# Correct but slow: the 1F1B order, with every message a blocking send or receive on its own, so a stage waits
# for each of its sends to be delivered before it goes on, and sends and receives never overlap.
import torch
import torch.distributed as dist


def pipeline_step(micro_batches, targets, forward, backward, num_micro_batches, template):
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    prev, nxt = rank - 1, rank + 1
    m_count = num_micro_batches
    out = torch.empty((m_count, *template.shape), dtype=template.dtype) if first or last else None

    def recv(src):
        buf = torch.empty_like(template)
        dist.recv(buf, src)
        return buf

    warmup = min(world - rank - 1, m_count)
    f = b = 0
    for _ in range(warmup):
        x = micro_batches[f] if first else recv(prev)
        dist.send(forward(f, x).contiguous(), nxt)
        f += 1
    for _ in range(m_count - warmup):
        x = micro_batches[f] if first else recv(prev)
        y = forward(f, x)
        f += 1
        if last:
            out[b] = y
            g = y - targets[b]
        else:
            dist.send(y.contiguous(), nxt)
            g = recv(nxt)
        gx = backward(b, g)
        if first:
            out[b] = gx
        else:
            dist.send(gx.contiguous(), prev)
        b += 1
    for _ in range(warmup):
        gx = backward(b, recv(nxt))
        if first:
            out[b] = gx
        else:
            dist.send(gx.contiguous(), prev)
        b += 1
    return out
