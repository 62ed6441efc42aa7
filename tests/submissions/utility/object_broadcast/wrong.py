# Plausible mistake: everything numeric packed into one float64 tensor "so that one broadcast carries it all";
# float64 holds integers exactly only up to 2**53, so large int64 values come back rounded.
import torch
import torch.distributed as dist


def broadcast_object(obj, root, device):
    rank = dist.get_rank()
    if rank == root:
        keys = [k.encode("utf-8") for k in obj]
        blob = b"".join(keys)
        nums = [len(keys)] + [len(k) for k in keys] + [len(v) for v in obj.values()]
        nums += [x for v in obj.values() for x in v]
        data = torch.tensor(nums, dtype=torch.float64, device=device)
        raw = torch.tensor(list(blob), dtype=torch.uint8, device=device)
        sizes = torch.tensor([data.numel(), raw.numel()], dtype=torch.int64, device=device)
    else:
        sizes = torch.zeros(2, dtype=torch.int64, device=device)
    dist.broadcast(sizes, src=root)
    n_data, n_raw = sizes.tolist()
    if rank != root:
        data = torch.empty(n_data, dtype=torch.float64, device=device)
        raw = torch.empty(n_raw, dtype=torch.uint8, device=device)
    dist.broadcast(data, src=root)
    if n_raw:
        dist.broadcast(raw, src=root)
    nums = [int(x) for x in data.tolist()]
    blob = bytes(raw.tolist())
    n = nums[0]
    klens, vlens, values = nums[1:1 + n], nums[1 + n:1 + 2 * n], nums[1 + 2 * n:]
    out, kp, vp = {}, 0, 0
    for kl, vl in zip(klens, vlens):
        out[blob[kp:kp + kl].decode("utf-8")] = values[vp:vp + vl]
        kp += kl
        vp += vl
    return out
