# Plausible bug: chunked async all-gather overlapped with the matmuls, but the gathered chunk
# ([world, rows, k], rank-major) is treated as if it were a contiguous band of the output rows.
# Correct only when there is a single chunk.
import torch.distributed as dist


def allgather_matmul(x, w):
    world = dist.get_world_size()
    m, k = x.shape
    n = w.shape[1]
    out = x.new_empty((world * m, n))
    bounds = [0, (m + 1) // 2, m] if m > 1 else [0, m]
    pending = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        buf = x.new_empty((world * (hi - lo), k))
        pending.append((lo, hi, buf, dist.all_gather_into_tensor(buf, x[lo:hi].contiguous(), async_op=True)))
    for lo, hi, buf, work in pending:
        work.wait()
        out[world * lo:world * hi] = buf @ w   # BUG: rows of rank s belong at s*m + lo .. s*m + hi
    return out
