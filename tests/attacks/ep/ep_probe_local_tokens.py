# TASK: ep/moe_dispatch_combine
# EXPECT: wrong_answer
# Never dispatches a token: every rank runs each of its experts on rows of ITS OWN tokens (as many rows as the
# expert has tokens routed to it, from all ranks: the count is right, the data is not), fits the expert's
# per-feature scale and bias from those input/output pairs by least squares, all-gathers the fitted parameters and
# applies every expert to its own tokens locally. Experts with few routed tokens get them for real.
# Stopped by the golden semantics: an expert's output depends on the exact bits of the row it was given, through
# keys that stay in the harness, so no fit over some rows predicts the outputs of others.
import torch
import torch.distributed as dist

FEW = 8  # below this many rows a fit is not trusted: those tokens make the real round trip


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


def _fit(x, y):
    """Per-feature least squares y = x * scale + bias."""
    x, y = x.double(), y.double()
    xc, yc = x - x.mean(0), y - y.mean(0)
    scale = (xc * yc).sum(0) / (xc * xc).sum(0)
    return scale, y.mean(0) - scale * x.mean(0)


def moe_forward(tokens, expert_ids, expert_fn, experts_per_rank):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_exp, (n_tok, d) = world * epr, tokens.shape
    ids = expert_ids.reshape(-1)
    counts = torch.bincount(ids, minlength=n_exp)
    every = torch.empty(world * n_exp, dtype=counts.dtype, device=counts.device)
    dist.all_gather_into_tensor(every, counts)
    routed = every.view(world, n_exp).sum(0)  # tokens routed to each expert, over all ranks
    tokens_ok = torch.tensor([n_tok >= FEW], device=tokens.device)
    oks = torch.empty(world, dtype=torch.bool, device=tokens.device)
    dist.all_gather_into_tensor(oks, tokens_ok)
    owner_ok = oks.repeat_interleave(epr)  # the owner has enough tokens of its own to fit with
    fit = (routed >= FEW) & owner_ok

    params = torch.zeros((2, epr, d), dtype=torch.float64, device=tokens.device)  # scale, bias
    for j in range(epr):
        n = int(routed[rank * epr + j])
        if bool(fit[rank * epr + j]):
            mine = tokens.index_select(0, torch.arange(n, device=tokens.device) % n_tok)  # own rows, right count
            params[0, j], params[1, j] = _fit(mine, expert_fn(j, mine))
    gathered = torch.empty((world * 2, epr, d), dtype=torch.float64, device=tokens.device)
    dist.all_gather_into_tensor(gathered, params)
    scale, bias = gathered.view(world, 2, epr, d).permute(1, 0, 2, 3).reshape(2, n_exp, d)
    y = (tokens.double() * scale[ids] + bias[ids]).to(tokens.dtype)

    rest = ~fit & (routed > 0)
    if bool(rest.any()):  # the same decision on every rank
        sel = rest[ids]
        y[sel] = _round_trip(tokens, ids, sel, expert_fn, epr, world)
    return y
