from typing import Callable

import torch
import torch.distributed as dist


def pipeline_step(micro_batches: torch.Tensor | None, targets: torch.Tensor | None,
                  forward: Callable[[int, torch.Tensor], torch.Tensor],
                  backward: Callable[[int, torch.Tensor], torch.Tensor],
                  num_micro_batches: int, template: torch.Tensor) -> torch.Tensor | None:
    """One-forward-one-backward (PipeDream-Flush / Megatron) schedule: stage s runs P - s - 1 warm-up forwards,
    then alternates one forward and one backward, then drains the remaining backwards. At most P - s micro-batches
    are stashed on stage s at any time, for any number of micro-batches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    prev, nxt = rank - 1, rank + 1
    m_count = num_micro_batches
    out = None
    if first or last:
        out = torch.empty((m_count, *template.shape), dtype=template.dtype, device=template.device)
    sends = []  # requests of sends still in flight: waited for once, at the end

    def comm(send: torch.Tensor | None = None, send_to: int = -1, recv_from: int = -1) -> torch.Tensor | None:
        """Send and/or receive one activation-shaped tensor in ONE batch. A stage's send to a neighbour and its
        receive from that same neighbour go together (send_forward_recv_backward and send_backward_recv_forward),
        so under NCCL neither side's send waits behind its own receive: the pairing that keeps 1F1B deadlock-free.
        Only the receive is waited for here; the send completes in the background."""
        ops, buf = [], None
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send, send_to))
        if recv_from >= 0:
            buf = torch.empty_like(template)
            ops.append(dist.P2POp(dist.irecv, buf, recv_from))
        if not ops:
            return None
        reqs = dist.batch_isend_irecv(ops)
        if len(reqs) == len(ops) and send is not None:  # one request per op: keep the send's for later
            sends.append(reqs[0])
            reqs = reqs[1:]
        for req in reqs:  # the receive (or a single request for the whole coalesced batch)
            req.wait()
        return buf

    fwd_i = bwd_i = 0

    def run_forward(x: torch.Tensor) -> torch.Tensor:
        nonlocal fwd_i
        y = forward(fwd_i, x)
        if last:
            out[fwd_i].copy_(y)
        fwd_i += 1
        return y

    def run_backward(g: torch.Tensor) -> torch.Tensor:
        nonlocal bwd_i
        gx = backward(bwd_i, g)
        if first:
            out[bwd_i].copy_(gx)
        bwd_i += 1
        return gx

    def next_input() -> torch.Tensor:
        return micro_batches[fwd_i] if first else comm(recv_from=prev)

    warmup = min(world - rank - 1, m_count)
    steady = m_count - warmup

    for _ in range(warmup):  # fill the pipeline (never on the last stage)
        comm(run_forward(next_input()), nxt)
    x = next_input() if steady else None
    for k in range(steady):
        y = run_forward(x)
        if last:
            g = y - targets[bwd_i]  # dL/dy of 0.5 * ||y - t||^2
        else:
            g = comm(y, nxt, recv_from=nxt)  # send_forward_recv_backward
        gx = run_backward(g)
        more = k < steady - 1
        if first:
            x = micro_batches[fwd_i] if more else None
        elif more:
            x = comm(gx, prev, recv_from=prev)  # send_backward_recv_forward
        else:
            comm(gx, prev)
    for _ in range(warmup):  # drain the backwards of the warm-up micro-batches
        gx = run_backward(comm(recv_from=nxt))
        if not first:
            comm(gx, prev)
    for req in sends:
        req.wait()
    return out
