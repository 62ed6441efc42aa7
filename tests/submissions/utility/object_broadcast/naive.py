# Correct but slow: one broadcast for the sizes, one for the key bytes, one for the values, and a list of
# Python ints rebuilt element by element.
import torch
import torch.distributed as dist


def broadcast_object(obj, root, device):
    rank = dist.get_rank()
    if rank == root:
        keys = [k.encode("utf-8", "surrogatepass") for k in obj]
        meta = [len(keys)] + [len(k) for k in keys] + [len(v) for v in obj.values()]
        meta_t = torch.tensor(meta, dtype=torch.int64, device=device)
        n_meta = torch.tensor([meta_t.numel()], dtype=torch.int64, device=device)
    else:
        n_meta = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(n_meta, src=root)
    if rank != root:
        meta_t = torch.empty(int(n_meta), dtype=torch.int64, device=device)
    dist.broadcast(meta_t, src=root)
    meta = meta_t.tolist()
    n = meta[0]
    klens, vlens = meta[1:1 + n], meta[1 + n:]
    if rank == root:
        raw = torch.tensor(list(b"".join(keys)), dtype=torch.uint8, device=device)
        vals = torch.tensor([x for v in obj.values() for x in v], dtype=torch.int64, device=device)
    else:
        raw = torch.empty(sum(klens), dtype=torch.uint8, device=device)
        vals = torch.empty(sum(vlens), dtype=torch.int64, device=device)
    if raw.numel():
        dist.broadcast(raw, src=root)
    if vals.numel():
        dist.broadcast(vals, src=root)
    blob = bytes(raw.tolist())
    out, kp, vp = {}, 0, 0
    for kl, vl in zip(klens, vlens):
        out[blob[kp:kp + kl].decode("utf-8", "surrogatepass")] = [int(vals[vp + i]) for i in range(vl)]
        kp += kl
        vp += vl
    return out
