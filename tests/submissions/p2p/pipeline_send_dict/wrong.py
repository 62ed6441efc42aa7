# Plausible bug: "to keep the header simple" every tensor travels as float64 and the header carries names and
# shapes but no dtypes, so the receiver hands back float64 tensors: the values survive, the dtypes do not.
import torch
import torch.distributed as dist


def pipeline_shift(tensors):
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    words = [len(tensors)]
    for name, t in tensors.items():
        raw = list(name.encode())
        words += [t.dim(), *t.shape, len(raw), *raw]
    header = torch.tensor(words, dtype=torch.int64)
    n = torch.tensor([header.numel()])
    reqs = [dist.isend(n, nxt), dist.isend(header, nxt, tag=1)]
    for i, t in enumerate(tensors.values()):
        if t.numel():
            reqs.append(dist.isend(t.to(torch.float64).contiguous().reshape(-1), nxt, tag=10 + i))
    m = torch.empty(1, dtype=torch.int64)
    dist.recv(m, prv)
    h = torch.empty(int(m), dtype=torch.int64)
    dist.recv(h, prv, tag=1)
    w = h.tolist()
    pos, out = 1, {}
    for i in range(w[0]):
        ndim = w[pos]
        shape = w[pos + 1:pos + 1 + ndim]
        pos += 1 + ndim
        length = w[pos]
        name = bytes(w[pos + 1:pos + 1 + length]).decode()
        pos += 1 + length
        buf = torch.empty(shape, dtype=torch.float64)
        if buf.numel():
            dist.recv(buf.reshape(-1), prv, tag=10 + i)
        out[name] = buf
    for r in reqs:
        r.wait()
    return out
