# TASK: collective/allreduce_ring
# EXPECT: open
# An all-reduce (every rank sends its input to every other and sums what it receives) run on a torch stream of
# its own (torch.cuda.Stream is non-blocking) that never waits for the harness's stream. Suspected gap, found by
# reading, not yet run: torch ranks time calls between events on the harness's stream, so work on this stream is
# ordered neither after the start nor before the stop. Work finished before the first mark (during the warm-up)
# escapes the clock, and only the last call runs on to the device sync. A median of tiny per-call times would
# follow. benchmarks/gpu_stream_checks.py shows what happens.
import torch
import torch.distributed as dist

_SIDE: dict = {}


def _sum_of_all(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = x.detach().clone()
    incoming = [torch.empty_like(x) for _ in range(world - 1)]
    ops = []
    for step, buf in enumerate(incoming, start=1):
        ops += [dist.P2POp(dist.isend, x, (rank + step) % world), dist.P2POp(dist.irecv, buf, (rank - step) % world)]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    for buf in incoming:
        out += buf
    return out


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    side = _SIDE.get(x.device)
    if side is None:
        side = _SIDE[x.device] = torch.cuda.Stream(x.device)
    with torch.cuda.stream(side):
        return _sum_of_all(x)
