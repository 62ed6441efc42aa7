# Stopped by: the static check (torch.cuda.Stream and torch.cuda.stream are not allowed in torch tasks).
# An all-reduce (every rank sends its input to every other and sums what it receives) run on a torch stream of
# its own (torch.cuda.Stream is non-blocking) that never waits for the stream the judge times. Torch ranks time
# each call between events on their current stream, so this work is ordered after neither: it can run during the
# judge's warm-up, before the first mark. On 2 x H200 its per-call times were host-paced, not its own (0.79x
# the reference at 1 MiB, 1.57x at 64 MiB; benchmarks/results/gpu_stream_checks-2026-11-30-2gpu.md, session 7).
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
