# Plausible bug: the gates are the softmax over all E logits at the chosen experts (Switch-style), not the softmax
# over the k chosen logits that the statement asks for; everything else is right.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _exchange(sends: list, recvs: list) -> None:
    """One round: every (tensor, peer) send and receive posted at once; empty ones skipped (both sides know the
    sizes, so they skip the same messages)."""
    ops = [dist.P2POp(dist.isend, t, p) for t, p in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, p) for t, p in recvs if t.numel()]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def moe_layer_forward(x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor, topk: int,
                      w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = w1.shape[0]
    t, d = x.shape
    dev = x.device
    peers = [p for p in range(world) if p != rank]

    # 1. route: top-k of the logits, softmax over the chosen ones; as a dense [T, E] gate matrix (0: not chosen)
    logits = torch.addmm(router_bias, x, router_weight)
    top = logits.topk(topk, dim=1)
    probs = torch.softmax(logits, dim=1)  # BUG: softmax over all E experts, not over the k chosen ones
    gates = torch.zeros_like(logits).scatter_(1, top.indices, probs.gather(1, top.indices))
    gates = gates.view(t, world, epr)

    # 2. each token travels once to each rank hosting one of its experts, with its gates for that rank's experts
    #    (one [n, d + epr] message per peer); the counts go first (one tiny round)
    send_idx = [(gates[:, p] > 0).any(1).nonzero()[:, 0] for p in range(world)]
    payload = [torch.cat([x.index_select(0, i), gates[:, p].index_select(0, i)], 1) for p, i in enumerate(send_idx)]
    counts = torch.tensor([i.numel() for i in send_idx], dtype=torch.int64, device=dev)
    recv_counts = torch.empty_like(counts)
    recv_counts[rank] = counts[rank]
    _exchange([(counts[p:p + 1], p) for p in peers], [(recv_counts[p:p + 1], p) for p in peers])
    n_in = recv_counts.tolist()
    recv = [x.new_empty((n_in[p], d + epr)) for p in range(world)]
    recv[rank] = payload[rank]
    _exchange([(payload[p], p) for p in peers], [(recv[p], p) for p in peers])

    # 3. experts: every local expert once on all the rows that chose it; each row's outputs summed with its gates
    #    here, so one row per token goes back, however many of its experts live on this rank
    rows = torch.cat(recv)
    h_in, g = rows[:, :d], rows[:, d:]
    acc = torch.zeros_like(h_in)
    for l in range(epr):
        sel = (g[:, l] > 0).nonzero()[:, 0]
        if sel.numel():
            xe = h_in.index_select(0, sel)
            out = (F.silu(xe @ w1[l]) * (xe @ w3[l])) @ w2[l]
            acc.index_add_(0, sel, out * g.index_select(0, sel)[:, l:l + 1])

    # 4. combine: the partial sums go back (the sizes are the dispatch's, swapped) and add up at the source
    partial = list(torch.split(acc, n_in))
    back = [x.new_empty((counts[p].item(), d)) for p in range(world)]
    back[rank] = partial[rank]
    _exchange([(partial[p].contiguous(), p) for p in peers], [(back[p], p) for p in peers])
    y = torch.zeros_like(x)
    for p in range(world):
        if send_idx[p].numel():
            y.index_add_(0, send_idx[p], back[p])
    return y
