"""Golden semantics of the first task wave (issue #22): p2p_patterns.

Point-to-point patterns beyond the ring: a 2-D halo exchange with corners, the ghost exchange of a sparse graph,
a 1F1B pipeline schedule driven through harness-owned stage functions, a paged KV-cache block transfer from a
prefill rank to decode ranks, and a pairwise bidirectional exchange.
"""

from __future__ import annotations

import functools
import math
import operator

import torch

from . import register
from .base import (CandidateError, GoldenOp, bool_param, elem_size as _elem, expect_tensor, generator, int_param,
                   narrow, num_param, rand, to_dtype, wide)
from .compare import compare_tensor, first_mismatch

_int_param = functools.partial(int_param, optional=True)
_num_param = num_param
_bool_param = bool_param


def _shared_seed(*parts: int) -> int:
    """A seed every rank (and the coordinator) derives alike from public case data."""
    s = 0x9E3779B97F4A7C15
    for p in parts:
        s = (s * 0x100000001B3 ^ (int(p) & 0xFFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF
    return s


def _check_params(case, allowed: set[str]) -> None:
    unknown = set(case.params) - allowed
    if unknown:
        raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(allowed)}")


def _params_key(case) -> tuple:
    """The case params as a hashable key for the caches of public layouts (lists become tuples)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in case.params.items()))


def _zipf(n: int, skew: float, g: torch.Generator) -> torch.Tensor:
    """Weights (1 + rank)^-skew over a seeded permutation of n items (skew 0: uniform)."""
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    return (1.0 + torch.randperm(n, generator=g).to(torch.float64)) ** (-skew)


# ---- 2-D halo exchange with corners ----------------------------------------------------------------------------

def grid_2d(world: int) -> tuple[int, int]:
    """(px, py): py is the largest divisor of world not above sqrt(world), px = world // py. Rank r sits at grid
    row r // py, column r % py. 2 -> 2x1, 3 -> 3x1, 4 -> 2x2, 6 -> 3x2, 8 -> 4x2, a prime p -> p x 1."""
    py = max(d for d in range(1, math.isqrt(world) + 1) if world % d == 0)
    return world // py, py


@register
class HaloExchange2D(GoldenOp):
    """`halo_exchange_2d(tile, halo, periodic) -> y`: the tile with a frame of h cells from its eight neighbours.

    The global array G [px*H, py*W] is cut into tiles [H, W] (the case shape); rank r owns the tile at grid row
    i = r // py, column j = r % py (`grid_2d`). y [H + 2h, W + 2h] is y[a, b] = G[i*H - h + a, j*W - h + b], the
    indices taken modulo G's shape when periodic, and 0 outside G when not. 0 <= h <= min(H, W), so the frame
    comes from the eight neighbouring tiles only. nccl-tests size: the bytes of the frame, (2h(H + W) + 4h^2)
    elements, less its left and right columns in a periodic grid of one column (they are the rank's own).
    """

    name = "halo_exchange_2d"
    nccl_op = "sendrecv"
    functions = ("halo_exchange_2d",)

    def validate_case(self, case):
        _check_params(case, {"halo", "periodic"})
        if len(case.shape) != 2 or min(case.shape) < 1:
            raise ValueError("shape must be [H, W] (the tile) with H, W >= 1")
        h = case.params.get("halo")
        if type(h) is not int or not 0 <= h <= min(case.shape):
            raise ValueError(f"params.halo must be an int in [0, min(H, W) = {min(case.shape)}], got {h!r}")
        if not isinstance(case.params.get("periodic"), bool):
            raise ValueError("params.periodic (true or false) is required")

    def make_inputs(self, case, rank, world, seed):
        return {"tile": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        y = fns["halo_exchange_2d"](inputs["tile"], int(case.params["halo"]), bool(case.params["periodic"]))
        return {"y": expect_tensor(y, "halo_exchange_2d's return value")}

    def expected(self, case, world, inputs):
        px, py = grid_2d(world)
        hh, ww = (int(s) for s in case.shape)
        h = int(case.params["halo"])
        g = torch.cat([torch.cat([inputs[i * py + j]["tile"] for j in range(py)], dim=1) for i in range(px)], dim=0)
        out = []
        for r in range(world):
            i, j = divmod(r, py)
            rows = torch.arange(i * hh - h, (i + 1) * hh + h)
            cols = torch.arange(j * ww - h, (j + 1) * ww + h)
            if case.params["periodic"]:
                y = g[rows % (px * hh)][:, cols % (py * ww)]
            else:
                rin = (rows >= 0) & (rows < px * hh)
                cin = (cols >= 0) & (cols < py * ww)
                y = torch.zeros((hh + 2 * h, ww + 2 * h), dtype=g.dtype)
                y[rin.nonzero()[:, 0, None], cin.nonzero()[:, 0]] = g[rows[rin]][:, cols[cin]]
            out.append({"y": y.clone()})
        return out

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        # a square tile of side n = 4h: the frame is 4h(n + h) = 20 h^2 elements
        h = max(1, math.isqrt(max(1, size_bytes // (20 * _elem(perf.dtype)))))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[4 * h, 4 * h], dtype=perf.dtype,
                        params={"periodic": True, **perf.params, "halo": h})

    def metric_bytes(self, case, world):
        """The frame's bytes that come from other ranks: all of it, but for the left and right columns of a
        periodic grid of one column (the rank's own)."""
        hh, ww = (int(s) for s in case.shape)
        h = int(case.params["halo"])
        own = 2 * h * hh if grid_2d(world)[1] == 1 and case.params.get("periodic") else 0
        return (2 * h * (hh + ww) + 4 * h * h - own) * _elem(case.dtype)


# ---- ghost exchange of a sparse graph ------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _graph(n: int, world: int, key: tuple) -> dict[str, torch.Tensor]:
    """The public graph of a case: ownership, CSR structure, and per rank its ghost ids and who needs what."""
    p = dict(key)
    g = generator(_shared_seed(int(p.get("graph_seed", 0)), n, world, 0x6A09))
    w = _zipf(world, float(p.get("owner_skew", 0.0)), g)
    empty = p.get("empty_rank")
    if empty is not None:
        w[int(empty) % world] = 0.0
    owner = torch.multinomial(w, n, replacement=True, generator=g) if n else torch.zeros(0, dtype=torch.int64)
    n_edges = int(round(float(p.get("avg_degree", 4.0)) * n))
    skew = float(p.get("skew", 0.0))
    if n and n_edges:
        u = torch.multinomial(_zipf(n, skew, g), n_edges, replacement=True, generator=g)
        v = torch.multinomial(_zipf(n, skew, g), n_edges, replacement=True, generator=g)
        # a share of the edges stays inside the source's partition (a partitioner's locality): the target is
        # then drawn uniformly from the vertices of the source's owner
        local_edge = torch.rand(n_edges, generator=g) < float(p.get("locality", 0.0))
        by_owner = torch.argsort(owner, stable=True)
        count = torch.bincount(owner, minlength=world)
        start = torch.cumsum(count, 0) - count
        o = owner[u[local_edge]]
        pick = (torch.rand(o.numel(), generator=g, dtype=torch.float64) * count[o]).long()
        v[local_edge] = by_owner[start[o] + pick]
    else:
        u = v = torch.zeros(0, dtype=torch.int64)
    keep = u != v
    iso = p.get("isolated_rank")
    if iso is not None:
        q = int(iso) % world
        keep &= (owner[u] == q) == (owner[v] == q)
    key_uv = torch.unique(u[keep] * n + v[keep])  # sorted: CSR order, no repeated edges
    u, v = key_uv // max(n, 1), key_uv % max(n, 1)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    if n:
        indptr[1:] = torch.bincount(u, minlength=n).cumsum(0)
    local = torch.zeros(n, dtype=torch.int64)
    out = {"owner": owner.to(torch.int64), "indptr": indptr, "indices": v.to(torch.int64), "local": local}
    for r in range(world):
        mine = (owner == r).nonzero()[:, 0]
        local[mine] = torch.arange(mine.numel())
        cols = v[owner[u] == r]
        out[f"ghosts{r}"] = torch.unique(cols[owner[cols] != r])
    return out


@register
class GraphGhostExchange(GoldenOp):
    """`gather_ghosts(values, owner, indptr, indices) -> ghosts`: the values of the remote neighbours.

    The graph of N vertices (case shape [N, f]) is public: owner [N] (the rank of every vertex), CSR indptr [N+1]
    and indices [nnz] (vertex u's neighbours are indices[indptr[u]:indptr[u+1]], a directed structure). values
    [n_r, f] are the private features of the vertices rank r owns, in increasing global id. ghosts [g_r, f] are
    the values of every vertex owned by another rank that is a neighbour of a vertex of r, in increasing global
    id. params: graph_seed, avg_degree (edges per vertex, default 4), skew (Zipf exponent of the out- and
    in-degrees, default 0), owner_skew (Zipf exponent of how many vertices each rank owns, default 0), locality
    (the share of edges whose target is drawn from the source's own partition, default 0), empty_rank (owns no
    vertex), isolated_rank (its vertices link only to each other). nccl-tests size: the mean over ranks of the
    ghost bytes a rank receives.
    """

    name = "graph_ghost_exchange"
    nccl_op = None
    functions = ("gather_ghosts",)

    def validate_case(self, case):
        _check_params(case, {"graph_seed", "avg_degree", "skew", "owner_skew", "empty_rank", "isolated_rank",
                             "locality"})
        if len(case.shape) != 2 or case.shape[0] < 0 or case.shape[1] < 1:
            raise ValueError("shape must be [N, f]: N >= 0 vertices, f >= 1 features")
        _int_param(case, "graph_seed", default=0)
        _num_param(case, "avg_degree", default=4.0, low=0.0, high=64.0)
        _num_param(case, "skew", default=0.0, low=0.0)
        _num_param(case, "owner_skew", default=0.0, low=0.0)
        _num_param(case, "locality", default=0.0, low=0.0, high=1.0)
        _int_param(case, "empty_rank", low=0)
        _int_param(case, "isolated_rank", low=0)

    def supports_world(self, world, case):
        return world >= 2 or case.params.get("empty_rank") is None

    def graph(self, case, world) -> dict[str, torch.Tensor]:
        return _graph(int(case.shape[0]), world, _params_key(case))

    def make_inputs(self, case, rank, world, seed):
        gr = self.graph(case, world)
        n_local = int((gr["owner"] == rank).sum())
        return {"values": rand([n_local, int(case.shape[1])], case.dtype, generator(seed)),
                "owner": gr["owner"].clone(), "indptr": gr["indptr"].clone(), "indices": gr["indices"].clone()}

    def call(self, fns, inputs, case, rank, world):
        y = fns["gather_ghosts"](inputs["values"], inputs["owner"], inputs["indptr"], inputs["indices"])
        return {"ghosts": expect_tensor(y, "gather_ghosts's return value")}

    def expected(self, case, world, inputs):
        gr = self.graph(case, world)
        f = int(case.shape[1])
        table = torch.zeros((int(case.shape[0]), f), dtype=to_dtype(case.dtype))
        for r in range(world):
            table[(gr["owner"] == r).nonzero()[:, 0]] = inputs[r]["values"]
        return [{"ghosts": table[gr[f"ghosts{r}"]].clone()} for r in range(world)]

    def size_case(self, perf, size_bytes, world):
        """A random graph (perf params: avg_degree, locality); N makes the mean ghost bytes about `size_bytes`."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        f = int(params.pop("features", 64))
        params.setdefault("avg_degree", 8.0)
        k = float(params["avg_degree"]) * (1.0 - float(params.get("locality", 0.0)))  # edges leaving a partition
        share = (world - 1) / world * (1.0 - math.exp(-k / world))  # expected ghosts per rank / N
        n = max(world, int(size_bytes / (f * _elem(perf.dtype)) / max(share, 1e-3)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n, f], dtype=perf.dtype,
                        params={"graph_seed": 1, **params})

    def metric_bytes(self, case, world):
        gr = self.graph(case, world)
        total = sum(int(gr[f"ghosts{r}"].numel()) for r in range(world))
        return total * int(case.shape[1]) * _elem(case.dtype) // max(world, 1)


# ---- 1F1B pipeline schedule ----------------------------------------------------------------------------------

@register
class Pipeline1F1B(GoldenOp):
    """`pipeline_step(micro_batches, targets, forward, backward, num_micro_batches, template) -> tensor | None`.

    Stage s = rank s of P = world stages. The harness owns stage s's layer a = tanh(x @ W_s) (W_s [d, d], secret
    to the stage) and hands the stage two closures: forward(m, x) stashes x and returns a for micro-batch m;
    backward(m, g) takes dL/da, accumulates dW_s += x^T dz with dz = g * (1 - a^2), frees the stash and returns
    dL/dx = dz @ W_s^T. The loss is 0.5 * sum_m ||y_m - t_m||^2 over the last stage's outputs y_m and the targets
    t_m (given to the last stage only), so the gradient fed to the last stage's backward is y_m - t_m. Stage 0
    returns dL/dx of every micro-batch, [M, b, d]; the last stage its outputs, [M, b, d]; other stages None.
    Checked besides: dW_s of every stage (the harness's sum), forward and backward called once per micro-batch,
    and the most micro-batches stashed at once on stage s, which must not exceed P - s (the 1F1B bound).
    case.shape = [M, b, d]. nccl-tests size: the activations a stage sends forward, M * b * d elements.
    """

    name = "pipeline_1f1b"
    nccl_op = None
    functions = ("pipeline_step",)

    def supports_world(self, world, case):
        return world >= 2  # a first and a last stage

    def validate_case(self, case):
        _check_params(case, set())
        if len(case.shape) != 3 or min(case.shape) < 1:
            raise ValueError("shape must be [M, b, d] (micro-batches, rows, features), all >= 1")
        if case.dtype not in ("float32", "float64"):
            raise ValueError("dtype must be float32 or float64")

    def make_inputs(self, case, rank, world, seed):
        m, b, d = (int(s) for s in case.shape)
        g = generator(seed)
        out = {"secret_w": rand([d, d], "float64", g).mul_(1.5 / math.sqrt(d)).to(to_dtype(case.dtype)),
               "template": torch.zeros((b, d), dtype=to_dtype(case.dtype))}
        if rank == 0:
            out["micro_batches"] = rand([m, b, d], case.dtype, g)
        if rank == world - 1:
            out["targets"] = rand([m, b, d], case.dtype, g).mul_(0.5)
        return out

    def call(self, fns, inputs, case, rank, world):
        m_count, b, d = (int(s) for s in case.shape)
        w = inputs["secret_w"]
        dtype, device = w.dtype, w.device
        gw = torch.zeros_like(w)
        stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        stats = [0, 0, 0]  # forward calls, backward calls, most micro-batches stashed at once
        state = [0] * m_count  # 0: not run, 1: forward done, 2: backward done

        def index(m, fn: str) -> int:
            try:
                i = operator.index(m)
            except TypeError:
                raise CandidateError(f"{fn}: the micro-batch index must be an int, got {type(m).__name__}") from None
            if not 0 <= i < m_count:
                raise CandidateError(f"{fn}: micro-batch index {i} is out of range [0, {m_count})")
            return i

        def tensor_arg(t, fn: str, what: str) -> torch.Tensor:
            t = expect_tensor(t, f"{fn}'s argument {what}")
            if tuple(t.shape) != (b, d) or t.dtype != dtype or t.device != device:
                raise CandidateError(f"{fn}: {what} must be a [{b}, {d}] {dtype} tensor on {device}, got "
                                     f"{list(t.shape)} {t.dtype} on {t.device}")
            return t

        def forward(m, x):
            i = index(m, "forward")
            if state[i]:
                raise CandidateError(f"forward({i}) called twice on stage {rank}: each micro-batch runs forward "
                                     "once per stage")
            x = tensor_arg(x, "forward", "x").detach().clone()
            a = torch.tanh(x @ w)
            stash[i] = (x, a)
            state[i] = 1
            stats[0] += 1
            stats[2] = max(stats[2], len(stash))
            return a.clone()

        def backward(m, grad):
            i = index(m, "backward")
            if state[i] != 1:
                raise CandidateError(f"backward({i}) on stage {rank} " + (
                    "before forward: run its forward on this stage first" if state[i] == 0 else
                    "called twice: each micro-batch runs backward once per stage"))
            grad = tensor_arg(grad, "backward", "grad")
            x, a = stash.pop(i)
            dz = grad * (1 - a * a)
            gw.add_(x.T @ dz)
            state[i] = 2
            stats[1] += 1
            return dz @ w.T

        res = fns["pipeline_step"](inputs.get("micro_batches"), inputs.get("targets"), forward, backward, m_count,
                                   inputs["template"])
        out = {"grad_w": gw, "calls": torch.tensor(stats, dtype=torch.int64)}
        first, last = rank == 0, rank == world - 1
        if first or last:
            res = expect_tensor(res, f"pipeline_step's return value on stage {rank}")
            if first:
                out["grad_x"] = res
            else:
                out["y"] = res
        elif res is not None:
            raise CandidateError(f"pipeline_step must return None on a middle stage (stage {rank} of {world}), got "
                                 f"{type(res).__name__}")
        return out

    def expected(self, case, world, inputs):
        xs = wide(inputs[0]["micro_batches"])
        acts = []
        for s in range(world):
            w = wide(inputs[s]["secret_w"])
            a = torch.tanh(xs @ w)
            acts.append((xs, a))
            xs = a
        y = xs
        g = y - wide(inputs[world - 1]["targets"])
        gws = [None] * world
        for s in reversed(range(world)):
            x, a = acts[s]
            dz = g * (1 - a * a)
            gws[s] = torch.einsum("mbi,mbj->ij", x, dz)
            g = dz @ wide(inputs[s]["secret_w"]).T
        out = [{"grad_w": narrow(gws[s], case.dtype)} for s in range(world)]
        out[0]["grad_x"] = narrow(g, case.dtype)
        out[world - 1]["y"] = narrow(y, case.dtype)
        return out

    def verify(self, case, world, inputs, outputs, tol):
        m_count = int(case.shape[0])
        for s in range(world):
            c = outputs[s].get("calls")
            if c is None or c.numel() != 3:
                return {"case": case.name, "rank": s, "output": "calls", "reason": "missing",
                        "detail": f"stage {s} reported no call counts"}
            fwd, bwd, peak = (int(v) for v in c)
            if fwd != m_count or bwd != m_count:
                return {"case": case.name, "rank": s, "output": "forward/backward calls", "reason": "semantics",
                        "expected": f"{m_count} forward and {m_count} backward calls",
                        "got": f"{fwd} forward and {bwd} backward calls",
                        "detail": f"stage {s} must run forward and backward once for each of the {m_count} "
                                  f"micro-batches before pipeline_step returns"}
            if peak > world - s:
                return {"case": case.name, "rank": s, "output": "micro-batches in flight", "reason": "semantics",
                        "expected": f"at most P - s = {world - s} micro-batches stashed at once on stage {s}",
                        "got": f"{peak} at once",
                        "detail": f"stage {s} had {peak} micro-batches forwarded and not yet backwarded at one time; "
                                  f"with P = {world} stages the bound is P - s = {world - s}"}
        return first_mismatch(case, self.expected(case, world, inputs), outputs, tol)

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = dict(perf.params)
        d = int(params.pop("features", 128))
        m = int(params.pop("micro_batches", 2 * world))
        b = max(1, size_bytes // (m * d * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[m, b, d], dtype=perf.dtype, params=params)

    def metric_bytes(self, case, world):
        return math.prod(int(s) for s in case.shape) * _elem(case.dtype)


# ---- paged KV-cache block transfer ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _kv_plan(shape: tuple[int, ...], world: int, key: tuple) -> dict:
    """The public transfer plan: per sequence its decode rank, its blocks in the prefill pool, its slots in the
    decode pool and how many of its leading blocks the decode rank has cached (lists of ints)."""
    p = dict(key)
    n_src = int(shape[0])
    n_dst = int(p.get("decode_blocks", n_src))
    n_seq = int(p.get("num_seqs", 8))
    g = generator(_shared_seed(int(p.get("plan_seed", 0)), world, n_src, n_dst, n_seq, 0x3C6E))
    if p.get("bench"):
        total = int(p["total_blocks"])
        lengths = [total // n_seq + (i < total % n_seq) for i in range(n_seq)]
        dest = [1 + i % (world - 1) for i in range(n_seq)]
    else:
        max_blocks = int(p.get("max_blocks", 4))
        lengths = torch.randint(0, max_blocks + 1, (n_seq,), generator=g).tolist()
        empty = (torch.rand(n_seq, generator=g) < float(p.get("p_empty", 0.2))).tolist()
        lengths = [0 if e else n for n, e in zip(lengths, empty)]
        w = _zipf(world - 1, float(p.get("skew", 0.0)), g)
        idle = p.get("idle_rank")
        if idle is not None:
            w[int(idle) % (world - 1)] = 0.0
        dest = (1 + torch.multinomial(w, n_seq, replacement=True, generator=g)).tolist() if n_seq else []
    shared = int(p.get("shared_prefix", 0))

    def share(i: int) -> int:  # leading blocks sequence i shares with sequence i - 1 (odd i only)
        return min(shared, lengths[i], lengths[i - 1]) if shared and i % 2 else 0

    for r in range(1, world):  # fit every decode pool
        while sum(lengths[i] for i in range(n_seq) if dest[i] == r) > n_dst:
            i = max((i for i in range(n_seq) if dest[i] == r), key=lambda i: lengths[i])
            lengths[i] -= 1
    while sum(lengths[i] - share(i) for i in range(n_seq)) > n_src:  # and the prefill pool
        i = max(range(n_seq), key=lambda i: lengths[i] - share(i))
        lengths[i] -= 1
    perm = torch.randperm(n_src, generator=g).tolist()
    src: list[list[int]] = []
    for i in range(n_seq):
        k = share(i)
        src.append((src[i - 1][:k] if k else []) + perm[:lengths[i] - k])
        perm = perm[lengths[i] - k:]
    dst: list[list[int]] = [[] for _ in range(n_seq)]
    for r in range(1, world):
        free = torch.randperm(n_dst, generator=g).tolist()
        for i in range(n_seq):
            if dest[i] == r:
                dst[i], free = free[:lengths[i]], free[lengths[i]:]
    if p.get("bench"):
        cached = [n // 2 for n in lengths]
    else:
        hit = (torch.rand(n_seq, generator=g) < float(p.get("cache_hit", 0.0))).tolist()
        draw = torch.rand(n_seq, generator=g).tolist()
        cached = [1 + int(u * n) if h and n else 0 for h, u, n in zip(hit, draw, lengths)]
        if p.get("all_cached"):
            cached = list(lengths)
    public = sorted({b for i in range(n_seq) for b in src[i][:cached[i]]})
    return {"dest": dest, "src": src, "dst": dst, "cached": cached, "n_dst": n_dst, "public": public,
            "public_seed": _shared_seed(int(p.get("plan_seed", 0)), world, n_src, 0x1F83)}


def _table(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(x) for x in lists], dtype=torch.int64)
    offsets = torch.zeros(len(lists) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    flat = torch.tensor([b for x in lists for b in x], dtype=torch.int64)
    return offsets, flat


@register
class KVBlockTransfer(GoldenOp):
    """`transfer_kv_blocks(pool, table_offsets, table_blocks, seq_rank, cached_blocks) -> pool`: paged KV blocks
    from the prefill rank 0 to the decode ranks, skipping the blocks a decode rank has cached.

    Rank 0 holds pool [n_src, *block] and, per sequence i, the blocks that hold its KV cache in token order (block
    table in CSR form: table_blocks[table_offsets[i]:table_offsets[i+1]]); its cached_blocks is None. seq_rank [S]
    names the decode rank (1..world-1) of every sequence, on every rank. Decode rank r holds its own pool
    [n_dst, *block], a table of the same form whose sequence i lists, for the sequences with seq_rank[i] = r, the
    slots of its pool where block k of the sequence belongs (0 entries for the other sequences), and
    cached_blocks [S]: for each of its sequences, how many leading blocks its pool already holds at their slots
    (a prefix-cache hit; 0 for the other sequences). Only the decode rank knows them. Every rank returns its pool
    after the transfer: rank 0's unchanged; rank r's with pool[dst_i[k]] = pool_0[src_i[k]] for every block of
    its sequences, and every other slot unchanged. The pools may be updated in place. Exact (no tolerance).

    The contents of cached blocks come from a public seed of the case (`public_seed`): rank 0's pool holds them at
    their source blocks and the decode rank at their slots, so that a cached slot already holds the right bytes;
    every other block is private to its rank's seed.

    case.shape = [n_src, *block]; params: plan_seed, num_seqs (default 8), max_blocks (per sequence, default 4),
    p_empty (chance a sequence has no block, default 0.2), skew (Zipf exponent of the routing, default 0),
    idle_rank (decode rank 1 + idle_rank % (world - 1) gets no sequence; world >= 3), shared_prefix (odd
    sequences share their first k blocks with the sequence before: repeated ids in rank 0's table),
    cache_hit (the chance that a sequence has a cached prefix, of 1..L blocks; default 0), all_cached (every block
    of every sequence cached), decode_blocks (n_dst, default n_src). nccl-tests size: the bytes of the blocks
    that are not cached, which must travel.
    """

    name = "kv_block_transfer"
    nccl_op = None
    functions = ("transfer_kv_blocks",)

    def validate_case(self, case):
        _check_params(case, {"plan_seed", "num_seqs", "max_blocks", "p_empty", "skew", "idle_rank", "shared_prefix",
                             "cache_hit", "all_cached", "decode_blocks", "bench", "total_blocks"})
        if len(case.shape) < 2 or case.shape[0] < 1 or min(case.shape[1:]) < 1:
            raise ValueError("shape must be [pool_blocks, *block_shape] with every size >= 1")
        _int_param(case, "plan_seed", default=0)
        _int_param(case, "num_seqs", default=8, low=0)
        _int_param(case, "max_blocks", default=4, low=0)
        _num_param(case, "p_empty", default=0.2, low=0.0, high=1.0)
        _num_param(case, "skew", default=0.0, low=0.0)
        _int_param(case, "idle_rank", low=0)
        _int_param(case, "shared_prefix", default=0, low=0)
        _num_param(case, "cache_hit", default=0.0, low=0.0, high=1.0)
        _bool_param(case, "all_cached", False)
        _int_param(case, "decode_blocks", low=1)

    def supports_world(self, world, case):
        return world >= (3 if case.params.get("idle_rank") is not None else 2)

    def plan(self, case, world) -> dict:
        return _kv_plan(tuple(int(s) for s in case.shape), world, _params_key(case))

    def _public(self, case, plan) -> torch.Tensor:
        block = [int(s) for s in case.shape[1:]]
        return rand([len(plan["public"]), *block], case.dtype, generator(plan["public_seed"]))

    def make_inputs(self, case, rank, world, seed):
        plan = self.plan(case, world)
        block = [int(s) for s in case.shape[1:]]
        n = int(case.shape[0]) if rank == 0 else plan["n_dst"]
        pool = rand([n, *block], case.dtype, generator(seed))
        public = self._public(case, plan) if plan["public"] else None
        mine = [i for i, r in enumerate(plan["dest"]) if r == rank]
        if rank == 0:
            offsets, blocks = _table(plan["src"])
            if public is not None:
                pool[torch.tensor(plan["public"])] = public
        else:
            offsets, blocks = _table([plan["dst"][i] if plan["dest"][i] == rank else [] for i in
                                      range(len(plan["dest"]))])
            where = {b: j for j, b in enumerate(plan["public"])}
            for i in mine:
                for k in range(plan["cached"][i]):
                    pool[plan["dst"][i][k]] = public[where[plan["src"][i][k]]]
        out = {"pool": pool, "table_offsets": offsets, "table_blocks": blocks,
               "seq_rank": torch.tensor(plan["dest"], dtype=torch.int64)}
        if rank:
            out["cached_blocks"] = torch.tensor([plan["cached"][i] if plan["dest"][i] == rank else 0
                                                 for i in range(len(plan["dest"]))], dtype=torch.int64)
        return out

    def call(self, fns, inputs, case, rank, world):
        y = fns["transfer_kv_blocks"](inputs["pool"], inputs["table_offsets"], inputs["table_blocks"],
                                      inputs["seq_rank"], inputs.get("cached_blocks"))
        return {"pool": expect_tensor(y, "transfer_kv_blocks's return value")}

    def expected(self, case, world, inputs):
        plan = self.plan(case, world)
        src_pool = inputs[0]["pool"]
        out = [{"pool": src_pool.clone()}]
        for r in range(1, world):
            pool = inputs[r]["pool"].clone()
            for i, dr in enumerate(plan["dest"]):
                if dr == r and plan["dst"][i]:
                    pool[torch.tensor(plan["dst"][i])] = src_pool[torch.tensor(plan["src"][i])]
            out.append({"pool": pool})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        plan = self.plan(case, world)
        expected = self.expected(case, world, inputs)
        for r in range(world):
            e, g = expected[r]["pool"], outputs[r].get("pool")
            if g is None:
                return {"case": case.name, "rank": r, "output": "pool", "reason": "missing"}
            if g.dtype != e.dtype:
                return {"case": case.name, "rank": r, "output": "pool", "reason": "dtype",
                        "expected": str(e.dtype), "got": str(g.dtype)}
            m = compare_tensor(e, g, (0.0, 0.0))  # a transfer is bit-exact
            if m:
                for k in ("rtol", "atol", "worst_tolerance_ratio", "rel_error"):  # no tolerance to report
                    m.pop(k, None)
                m.update(case=case.name, rank=r, output="pool")
                if m.get("index"):
                    slot = m["index"][0]
                    if r == 0:
                        m["detail"] = f"rank 0's pool must come back unchanged; its block {slot} differs"
                    else:
                        owner = [(i, k) for i, d in enumerate(plan["dst"]) if plan["dest"][i] == r
                                 for k, s in enumerate(d) if s == slot]
                        if owner:
                            i, k = owner[0]
                            was = " (a cached block)" if k < plan["cached"][i] else ""
                            m["detail"] = (f"slot {slot} of rank {r}'s pool should hold block {k} of sequence {i}"
                                           f"{was}: block {plan['src'][i][k]} of rank 0's pool")
                        else:
                            m["detail"] = (f"slot {slot} of rank {r}'s pool is no target of the transfer and must "
                                           "keep its contents")
                return m
        return None

    def size_case(self, perf, size_bytes, world):
        """Equal-length sequences spread round-robin over the decode ranks, the first half of every sequence
        cached on its decode rank; pools twice the blocks of all sequences."""
        from ..cards import CaseSpec

        params = dict(perf.params)
        block = [int(s) for s in params.pop("block_shape", [2, 16, 4, 64])]
        moved = max(1, size_bytes // (math.prod(block) * _elem(perf.dtype)))
        total = 2 * moved
        n_seq = max(1, min(4 * (world - 1), moved))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[2 * total, *block], dtype=perf.dtype,
                        params={**params, "bench": True, "total_blocks": total, "num_seqs": n_seq,
                                "decode_blocks": 2 * total})

    def metric_bytes(self, case, world):
        plan = self.plan(case, world)
        block = math.prod(int(s) for s in case.shape[1:])
        return sum(len(s) - c for s, c in zip(plan["src"], plan["cached"])) * block * _elem(case.dtype)


# ---- bidirectional pairwise exchange -------------------------------------------------------------------------

def pair_partners(case, world: int) -> list[int]:
    """partner[r] for every rank (-1: none). pairing "xor": r ^ 1 where that rank exists. pairing "random": a
    seeded permutation whose first u ranks stay alone (u = params.unpaired, raised by one where world - u is
    odd) and the rest pair up in order."""
    if case.params.get("pairing", "xor") == "xor":
        return [r ^ 1 if r ^ 1 < world else -1 for r in range(world)]
    u = min(world, int(case.params.get("unpaired", 0)))
    if (world - u) % 2:
        u += 1
    perm = torch.randperm(world, generator=generator(_shared_seed(int(case.params.get("pairing_seed", 0)), world,
                                                                  0x5BD1))).tolist()
    partner = [-1] * world
    for a, b in zip(perm[u::2], perm[u + 1::2]):
        partner[a], partner[b] = b, a
    return partner


@register
class PairExchange(GoldenOp):
    """`exchange(x, partner) -> y`: rank r returns the x of its partner, or its own x when partner is -1.

    The pairing (an involution, `pair_partners`) comes from the case; every rank is told only its own partner.
    All ranks pass the same shape and dtype. nccl-tests size: the bytes of x (what a rank sends).
    """

    name = "pair_exchange"
    nccl_op = "sendrecv"
    functions = ("exchange",)

    def validate_case(self, case):
        _check_params(case, {"pairing", "pairing_seed", "unpaired"})
        if case.params.get("pairing", "xor") not in ("xor", "random"):
            raise ValueError("params.pairing must be 'xor' or 'random'")
        _int_param(case, "pairing_seed", default=0)
        _int_param(case, "unpaired", default=0, low=0)

    def make_inputs(self, case, rank, world, seed):
        return {"x": rand(case.shape, case.dtype, generator(seed))}

    def call(self, fns, inputs, case, rank, world):
        partner = pair_partners(case, world)[rank]
        return {"y": expect_tensor(fns["exchange"](inputs["x"], partner), "exchange's return value")}

    def expected(self, case, world, inputs):
        partner = pair_partners(case, world)
        return [{"y": inputs[p if p >= 0 else r]["x"].clone()} for r, p in enumerate(partner)]
