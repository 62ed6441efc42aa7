import torch
import torch.distributed as dist

# Every dtype a dict may hold, by code. The header carries the code, never the name.
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
CODE = {dt: i for i, dt in enumerate(DTYPES)}
TAG_LEN, TAG_HEADER, TAG_DATA = 1, 2, 3


def encode_header(tensors):
    """[n_keys, then per key: dtype code, ndim, *shape, name length, *name bytes] as int64."""
    words = [len(tensors)]
    for name, t in tensors.items():
        if t.dtype not in CODE:
            raise TypeError(f"dtype {t.dtype} of {name!r} cannot be sent")
        raw = name.encode("utf-8")
        words += [CODE[t.dtype], t.dim(), *t.shape, len(raw), *raw]
    return torch.tensor(words, dtype=torch.int64)


def decode_header(header):
    words = header.tolist()
    pos, layout = 1, []
    for _ in range(words[0]):
        dtype, ndim = DTYPES[words[pos]], words[pos + 1]
        shape = words[pos + 2:pos + 2 + ndim]
        pos += 2 + ndim
        length = words[pos]
        name = bytes(words[pos + 1:pos + 1 + length]).decode("utf-8")
        pos += 1 + length
        layout.append((name, dtype, shape))
    return layout


def pipeline_shift(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return {k: v.detach().clone() for k, v in tensors.items()}
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    items = list(tensors.items())

    # The sender knows everything up front, so all of its messages go out at once (each with its own tag,
    # so they can never be confused); only the receiver has to go step by step: length, header, payload.
    header = encode_header(tensors)
    hlen = torch.tensor([header.numel()], dtype=torch.int64)
    sends = [dist.isend(hlen, nxt, tag=TAG_LEN), dist.isend(header, nxt, tag=TAG_HEADER)]
    for i, (_, t) in enumerate(items):
        if t.numel():
            sends.append(dist.isend(t.detach().contiguous().reshape(-1), nxt, tag=TAG_DATA + i))

    in_len = torch.empty(1, dtype=torch.int64)
    dist.irecv(in_len, prv, tag=TAG_LEN).wait()
    in_header = torch.empty(int(in_len.item()), dtype=torch.int64)
    dist.irecv(in_header, prv, tag=TAG_HEADER).wait()

    out, recvs = {}, []
    for i, (name, dtype, shape) in enumerate(decode_header(in_header)):
        buf = torch.empty(shape, dtype=dtype)
        if buf.numel():  # the sender sends nothing for an empty tensor either
            recvs.append(dist.irecv(buf.reshape(-1), prv, tag=TAG_DATA + i))
        out[name] = buf
    for r in recvs + sends:
        r.wait()
    return out
