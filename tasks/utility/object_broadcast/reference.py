import torch
import torch.distributed as dist

# The first message is a slab of a size every rank knows: the payload's total length and as much of the payload
# as fits. When the object fits (the usual case) that is the only message; otherwise the rest follows in a
# broadcast. The slab is at least SLAB bytes, or the size of the previous call's payload (every rank saw it, so
# all agree), up to MAX_SLAB: a stream of similar objects takes one message each.
# A small slab goes straight from the root to every rank, all sends at once (one message latency); a large one
# by broadcast, whose pipeline takes W - 1 latencies but sends the bytes out of the root only once.
SLAB = 16384
DIRECT_MAX = 262144
MAX_SLAB = 16 << 20
_slab = [SLAB]


def _serialise(obj: dict, slab: int, device: torch.device) -> torch.Tensor:
    """[total bytes, n keys, (key byte length, list length) * n, values...] as int64, then the keys' UTF-8 bytes;
    padded to at least `slab` bytes."""
    keys = [k.encode("utf-8", "surrogatepass") for k in obj]
    lists = list(obj.values())
    header = [0, len(keys)]
    for k, v in zip(keys, lists):
        header += (len(k), len(v))
    ints = torch.tensor(header + [x for v in lists for x in v], dtype=torch.int64)
    blob = b"".join(keys)
    total = ints.numel() * 8 + len(blob)
    ints[0] = total
    out = torch.empty(max(total, slab), dtype=torch.uint8)
    out[:ints.numel() * 8] = ints.view(torch.uint8)
    if blob:
        out[ints.numel() * 8:total] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return out.to(device)


def _deserialise(payload: torch.Tensor) -> dict:
    head = payload[:16].view(torch.int64).tolist()
    n = head[1]
    lens = payload[16:16 + 16 * n].view(torch.int64).tolist()
    klens, vlens = lens[0::2], lens[1::2]
    start = 16 + 16 * n
    n_values = sum(vlens)
    values = payload[start:start + 8 * n_values].view(torch.int64).tolist()
    blob = bytes(payload[start + 8 * n_values:head[0]].tolist())
    out, kpos, vpos = {}, 0, 0
    for kl, vl in zip(klens, vlens):
        out[blob[kpos:kpos + kl].decode("utf-8", "surrogatepass")] = values[vpos:vpos + vl]
        kpos += kl
        vpos += vl
    return out


def broadcast_object(obj, root: int, device: torch.device):
    rank = dist.get_rank()
    slab = _slab[0]
    world = dist.get_world_size()
    direct = world > 2 and slab <= DIRECT_MAX
    if rank == root:
        payload = _serialise(obj, slab, device)
        total = int(payload[:8].view(torch.int64))
        if direct:
            ops = [dist.P2POp(dist.isend, payload[:slab], r) for r in range(world) if r != root]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        else:
            dist.broadcast(payload[:slab], src=root)
        if total > slab:
            dist.broadcast(payload[slab:], src=root)
        result = {k: list(v) for k, v in obj.items()}
    else:
        first = torch.empty(slab, dtype=torch.uint8, device=device)
        if direct:
            dist.recv(first, src=root)
        else:
            dist.broadcast(first, src=root)
        total = int(first[:8].view(torch.int64))
        payload = first
        if total > slab:
            payload = torch.empty(total, dtype=torch.uint8, device=device)
            dist.broadcast(payload[slab:], src=root)
            payload[:slab] = first
        result = _deserialise(payload.cpu())
    _slab[0] = max(SLAB, min(total, MAX_SLAB))
    return result
