import torch
import torch.distributed as dist

# Every dtype a dict may hold, by code. The header carries the code, never the name.
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
CODE = {dt: i for i, dt in enumerate(DTYPES)}
# The first message always carries PREFIX header words (zero-padded); a longer header sends the rest in a second
# message. PREFIX covers every dict of a few keys with short names, so usually one metadata round trip is enough.
PREFIX = 256
TAG_HEAD, TAG_REST, TAG_DATA = 1, 2, 3


def encode_header(tensors) -> list[int]:
    """[total words, n_keys, then per key: dtype code, ndim, *shape, name length, *name bytes]."""
    words = [0, len(tensors)]
    for name, t in tensors.items():
        if t.dtype not in CODE:
            raise TypeError(f"dtype {t.dtype} of {name!r} cannot be sent")
        raw = name.encode("utf-8")
        words += [CODE[t.dtype], t.dim(), *t.shape, len(raw), *raw]
    words[0] = len(words)
    return words


def decode_header(words):
    pos, layout = 2, []
    for _ in range(words[1]):
        dtype, ndim = DTYPES[words[pos]], words[pos + 1]
        shape = words[pos + 2:pos + 2 + ndim]
        pos += 2 + ndim
        length = words[pos]
        name = bytes(words[pos + 1:pos + 1 + length]).decode("utf-8")
        pos += 1 + length
        layout.append((name, dtype, shape))
    return layout


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor: every dtype travels the same way, whatever the backend supports.
    A one-element view counts as contiguous whatever its stride, and a byte view needs stride 1: copy that one."""
    flat = t.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def _post(ops: list) -> None:
    """Post point-to-point ops as one batch and wait for it (NCCL issues a batch as one group)."""
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def pipeline_shift(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return {k: v.detach().clone() for k, v in tensors.items()}
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    items = list(tensors.items())
    # Metadata and payload travel on the device of the inputs (NCCL moves only GPU tensors).
    if items:
        device = items[0][1].device
    else:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    # Every rank sends to the next and receives from the previous one at the same time, in rounds that each rank
    # runs in the same order: (1) header prefix, (2) rest of the header if either side needs it, (3) payload.
    # Each round is one batch, so NCCL (which ignores tags and pairs messages in order) never has a send wait on a
    # receive that is queued behind another send.
    words = encode_header(tensors)
    header = torch.tensor(words + [0] * max(0, PREFIX - len(words)), dtype=torch.int64, device=device)
    in_head = torch.empty(PREFIX, dtype=torch.int64, device=device)
    _post([dist.P2POp(dist.isend, header[:PREFIX], nxt, tag=TAG_HEAD),
           dist.P2POp(dist.irecv, in_head, prv, tag=TAG_HEAD)])
    in_words = in_head.tolist()
    total = in_words[0]

    rest = []  # round 2: only the pairs whose header is longer than the prefix take part
    if len(words) > PREFIX:
        rest.append(dist.P2POp(dist.isend, header[PREFIX:], nxt, tag=TAG_REST))
    if total > PREFIX:
        in_rest = torch.empty(total - PREFIX, dtype=torch.int64, device=device)
        rest.append(dist.P2POp(dist.irecv, in_rest, prv, tag=TAG_REST))
    _post(rest)
    if total > PREFIX:
        in_words = in_words + in_rest.tolist()

    ops, out = [], {}
    for i, (_, t) in enumerate(items):
        if t.numel():  # an empty tensor is described fully by the header
            ops.append(dist.P2POp(dist.isend, _as_bytes(t.detach().contiguous()), nxt, tag=TAG_DATA + i))
    for i, (name, dtype, shape) in enumerate(decode_header(in_words)):
        buf = torch.empty(shape, dtype=dtype, device=device)
        if buf.numel():
            ops.append(dist.P2POp(dist.irecv, _as_bytes(buf), prv, tag=TAG_DATA + i))
        out[name] = buf
    _post(ops)
    return out
