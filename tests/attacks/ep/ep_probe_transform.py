# TASK: ep/moe_dispatch_combine
# EXPECT: wrong_answer
# Never dispatches a token: every rank calls its experts on made-up rows (a row of zeros gives the bias, a row of
# ones the scale plus the bias), exactly as many rows as the expert has tokens routed to it, so a harness that only
# counts rows sees nothing wrong; the 2 * E * d parameters are all-gathered and every rank applies every expert to
# its own tokens itself. Experts with a single routed token (too few rows to probe) get that token for real.
# Stopped by the golden semantics: an expert's output depends on the exact bits of the row it was given, through
# keys that stay in the harness, so probes say nothing about the outputs of other rows.
import torch
import torch.distributed as dist


def _round_trip(tokens, ids, sel, expert_fn, epr, world):
    """The honest dispatch -> expert -> combine, for the tokens where `sel` holds only."""
    part, pids = tokens[sel].contiguous(), ids[sel]
    n_tok, d = part.shape
    order = torch.argsort(pids, stable=True)
    send = part.index_select(0, order).contiguous()
    counts = torch.bincount(pids, minlength=world * epr)
    rcounts = torch.empty_like(counts)
    dist.all_to_all_single(rcounts, counts)
    send_splits = counts.view(world, epr).sum(1).tolist()
    rc = rcounts.view(world, epr)
    recv_splits = rc.sum(1).tolist()
    recv = part.new_empty((sum(recv_splits), d))
    dist.all_to_all_single(recv, send, recv_splits, send_splits)
    local = torch.arange(epr, device=tokens.device).repeat(world).repeat_interleave(
        rc.reshape(-1), output_size=recv.shape[0])
    done = torch.empty_like(recv)
    for j in range(epr):
        rows = (local == j).nonzero().flatten()
        if rows.numel():
            done[rows] = expert_fn(j, recv.index_select(0, rows))
    back = part.new_empty((n_tok, d))
    dist.all_to_all_single(back, done, send_splits, recv_splits)
    out = torch.empty_like(part)
    out[order] = back
    return out


def moe_forward(tokens, expert_ids, expert_fn, experts_per_rank):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_exp, d = world * epr, tokens.shape[1]
    ids = expert_ids.reshape(-1)
    counts = torch.bincount(ids, minlength=n_exp)
    every = torch.empty(world * n_exp, dtype=counts.dtype, device=counts.device)
    dist.all_gather_into_tensor(every, counts)
    routed = every.view(world, n_exp).sum(0)  # tokens routed to each expert, over all ranks

    params = torch.zeros((2, epr, d), dtype=torch.float64, device=tokens.device)  # scale, bias
    for j, n in enumerate(routed[rank * epr:(rank + 1) * epr].tolist()):
        if n >= 2:
            probe = tokens.new_zeros((n, d))
            probe[1] = 1
            out = expert_fn(j, probe).double()
            params[0, j] = out[1] - out[0]
            params[1, j] = out[0]
    gathered = torch.empty((world * 2, epr, d), dtype=torch.float64, device=tokens.device)
    dist.all_gather_into_tensor(gathered, params)
    scale, bias = gathered.view(world, 2, epr, d).permute(1, 0, 2, 3).reshape(2, n_exp, d)
    y = (tokens.double() * scale[ids] + bias[ids]).to(tokens.dtype)

    few = routed == 1
    if bool(few.any()):  # the same decision on every rank: `routed` is global
        sel = few[ids]
        y[sel] = _round_trip(tokens, ids, sel, expert_fn, epr, world)
    return y
