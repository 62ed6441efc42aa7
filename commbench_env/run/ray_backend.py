"""Many hosts: Ray schedules episodes onto whichever node has the resources their sandbox needs.

Each episode of an evaluation run is a Ray task that asks for what its sandbox profile needs (`episode_resources`:
`cuda` one GPU per rank, `cuda-shared` a share of one GPU, `cpu` no GPU; a CPU per rank). On the node Ray picks it
plays the episode with the same code as a local run (`eval_episode.play_eval_episode`), with the sandbox pinned to
the GPUs Ray gave the task, and returns the result record and the trace, which the driver writes into its own run
folder: a Ray run folder looks exactly like a local one.

For RL, a `SandboxActor` keeps one env (a sandbox with a warm judge) on a node for many episodes: `RayScorer`
spreads submissions over several actors, and `RemoteEnv` drives one actor's env with the Gymnasium calls.

Ray is an optional dependency: `pip install "commbench-env[ray]"`. Every node needs this package (same version:
task hashes are checked) and, for docker profiles, the sandbox image.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agents import AgentCard, load_agent_card
from ..errors import CardError, CommBenchError
from ..sandbox import SandboxProfile, load_profile
from .scoring import Score, Submission, score_with_retry

INSTALL_HINT = 'Ray is not installed: pip install "commbench-env[ray]" (or pip install ray)'


def require_ray() -> Any:
    """The ray module, or a CommBenchError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise CommBenchError(f"{INSTALL_HINT} ({exc})") from None
    return ray


def init_local_ray(num_cpus: int | None = None, num_gpus: int | None = None, **kwargs: Any) -> Any:
    """Start a one-node Ray instance that listens and talks on 127.0.0.1 only, without dashboard or usage stats.

    By default a local Ray instance binds the machine's network address; this keeps it on loopback (for tests and
    single hosts). To use a cluster, call `ray.init(address=...)` (or `connect`) instead.
    """
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # With this switch off, Ray takes the loopback address as the node's address (ray_constants reads it at import).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = require_ray()
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # ray may have been imported before the variable was set
    if ray.is_initialized():
        raise CommBenchError("Ray is already initialised in this process; call ray.shutdown() first")
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _node_ip_address="127.0.0.1", **kwargs)
    addresses = {n["NodeManagerAddress"] for n in ray.nodes()}
    if addresses != {"127.0.0.1"}:
        ray.shutdown()
        raise CommBenchError(f"the local Ray instance did not stay on loopback (node addresses {sorted(addresses)})")
    return ray


def connect(address: str | None = None) -> Any:
    """Use the Ray instance this process already joined; else join `address` ('auto': the cluster that
    `ray start` set up on this machine); with no address, start a one-node instance on loopback."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    if address:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=address, log_to_driver=False)
        return ray
    return init_local_ray()


# -- resources --------------------------------------------------------------------------------------------

def episode_resources(profile: SandboxProfile | str, world: int, *, cpus: float | None = None,
                      gpu_share: float = 1.0) -> dict[str, float]:
    """What one episode asks Ray for: `num_gpus` from the device mode (`cuda`: one per rank; `cuda-shared`: every
    rank on one GPU, `gpu_share` of it, so 0.5 lets two episodes share a GPU; `cpu`: none) and `num_cpus` (default
    one per rank: each rank is a process)."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    if world < 1:
        raise ValueError(f"world size must be at least 1, not {world}")
    if not 0 < gpu_share <= 1:
        raise ValueError(f"gpu_share must be in (0, 1], not {gpu_share}")
    gpus = {"cpu": 0.0, "cuda": float(world), "cuda-shared": float(gpu_share)}[prof.device_mode]
    return {"num_cpus": float(world if cpus is None else cpus), "num_gpus": gpus}


def pin_gpus(profile: SandboxProfile, gpu_ids: Sequence[int | str]) -> SandboxProfile:
    """The profile restricted to the GPUs Ray assigned (local: CUDA_VISIBLE_DEVICES; docker: device requests)."""
    if profile.device_mode == "cpu" or not gpu_ids:
        return profile
    return profile.model_copy(update={"gpus": profile.gpus.model_copy(update={"ids": [int(i) for i in gpu_ids],
                                                                              "count": 0})})


def check_fits(resources: dict[str, float], what: str) -> None:
    """Raise if no live node of the cluster could ever hold `resources` (Ray would queue the work forever)."""
    ray = require_ray()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(n.get("CPU", 0) >= resources["num_cpus"] and n.get("GPU", 0) >= resources["num_gpus"] for n in nodes):
        return
    have = ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes) or "no live node"
    raise CommBenchError(f"{what} asks for {resources['num_cpus']:g} CPUs and {resources['num_gpus']:g} GPUs on one "
                         f"node, but no node of the Ray cluster has that much ({have}); use a smaller world, fewer "
                         "CPUs per episode, or add nodes")


def _worker_profile(sandbox: str | SandboxProfile) -> SandboxProfile:
    ray = require_ray()
    prof = load_profile(sandbox) if isinstance(sandbox, str) else sandbox
    return pin_gpus(prof, ray.get_gpu_ids())


def _node_info() -> dict[str, Any]:
    ray = require_ray()
    return {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [int(i) for i in ray.get_gpu_ids()]}


# -- evaluation episodes as Ray tasks -------------------------------------------------------------------------

@dataclass(frozen=True)
class EpisodeJob:
    """One episode of an evaluation run, as shipped to a Ray worker."""

    task_id: str
    sample: int = 0
    agent: AgentCard | str = "reference"
    sandbox: SandboxProfile | str = "local-cpu"
    world: int | None = None
    max_turns: int | None = None
    agent_params: dict[str, Any] = field(default_factory=dict)
    infra_retries: int = 2
    task_hash: str | None = None  # the driver's; a worker with another version of the card refuses the job

    @property
    def key(self) -> str:
        return f"{self.task_id}#{self.sample}"


@dataclass
class RayOptions:
    address: str | None = None        # None: this process's Ray instance, else a local one on loopback
    cpus_per_episode: float | None = None  # default: one per rank
    gpu_share: float = 1.0            # cuda-shared episodes: the fraction of a GPU each asks for
    max_in_flight: int | None = None  # episodes submitted at once; None: all (Ray queues what does not fit)
    env_vars: dict[str, str] = field(default_factory=dict)  # set in the workers (e.g. an agent's API key)
    max_retries: int = 1              # Ray's retries of a task whose worker or node died


def agent_env_vars(card: AgentCard) -> dict[str, str]:
    """The API-key variable an agent card reads (params.api_key_env, else its class's default), with its value
    from this process's environment when set: Ray workers get the variables of the node they run on, not ours."""
    import importlib

    from ..agents.base import BUILTIN_KINDS

    name = card.params.get("api_key_env")
    if not name:
        target = BUILTIN_KINDS.get(card.kind, card.kind)
        if ":" in target:
            mod, cls = target.split(":", 1)
            try:
                name = getattr(getattr(importlib.import_module(mod), cls), "default_key_env", None)
            except (ImportError, AttributeError):
                name = None
    return {name: os.environ[name]} if name and name in os.environ else {}


def _play_remote(job: EpisodeJob) -> dict[str, Any]:
    """Runs in a Ray worker: one episode through eval_episode.play_eval_episode; returns the record and the trace."""
    import tempfile

    from ..cards import load_task
    from .eval_episode import EpisodeKey, play_eval_episode

    task = load_task(job.task_id)
    if job.task_hash and task.hash != job.task_hash:
        raise CardError(f"task {job.task_id} on node {socket.gethostname()} has hash {task.hash}, the driver's "
                        f"has {job.task_hash}: install the same commbench-env version on every node")
    card = job.agent if isinstance(job.agent, AgentCard) else load_agent_card(job.agent)
    node = _node_info()
    with tempfile.TemporaryDirectory(prefix="commbench-ray-") as tmp:
        rec = play_eval_episode(task, EpisodeKey(job.task_id, job.sample), card, sandbox=_worker_profile(job.sandbox),
                                trace_dir=Path(tmp), world=job.world, max_turns=job.max_turns,
                                infra_retries=job.infra_retries, agent_params=job.agent_params)
        trace_name, trace_text = None, None
        if rec.get("trace_path") and Path(rec["trace_path"]).is_file():
            trace_name = Path(rec["trace_path"]).name
            trace_text = Path(rec["trace_path"]).read_text(encoding="utf-8")
    return {"record": {**rec, "node": node}, "trace_name": trace_name, "trace_text": trace_text}


def _job_resources(job: EpisodeJob, opts: RayOptions) -> dict[str, float]:
    from ..cards import load_task

    world = load_task(job.task_id).world_for(job.world)
    return episode_resources(job.sandbox, world, cpus=opts.cpus_per_episode, gpu_share=opts.gpu_share)


def run_episodes_ray(jobs: Sequence[EpisodeJob], *, trace_dir: Path, options: RayOptions | None = None,
                     on_start: Callable[[EpisodeJob], None] | None = None,
                     on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Play every job as a Ray task; write each trace into `trace_dir` and return the records (completion order).

    A record is the local runner's (see eval_episode.play_eval_episode) plus `node` (host, node id, GPU ids), with
    `trace_path` pointing into `trace_dir`. A worker or node that dies beyond Ray's retries gives an `infra_error`
    record; a card or agent error (CommBenchError) stops the run and is raised, as in a local run.
    """
    opts = options or RayOptions()
    if not jobs:
        return []
    ray = connect(opts.address)
    trace_dir.mkdir(parents=True, exist_ok=True)
    remote = ray.remote(_play_remote)
    runtime_env = {"env_vars": dict(opts.env_vars)} if opts.env_vars else None
    pending = list(jobs)
    running: dict[Any, EpisodeJob] = {}
    started: dict[Any, float] = {}
    records: list[dict[str, Any]] = []
    limit = opts.max_in_flight or len(pending) or 1

    for res in {tuple(sorted(_job_resources(j, opts).items())) for j in pending}:
        check_fits(dict(res), "an episode")

    def submit(job: EpisodeJob) -> None:
        res = _job_resources(job, opts)
        ref = remote.options(num_cpus=res["num_cpus"], num_gpus=res["num_gpus"], max_retries=opts.max_retries,
                             retry_exceptions=False, runtime_env=runtime_env).remote(job)
        running[ref] = job
        started[ref] = time.monotonic()
        if on_start:
            on_start(job)

    try:
        while pending or running:
            while pending and len(running) < limit:
                submit(pending.pop(0))
            ready, _ = ray.wait(list(running), num_returns=1)
            ref = ready[0]
            job = running.pop(ref)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, CommBenchError):
                    raise cause from None
                raise
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.TaskUnschedulableError, ray.exceptions.OutOfMemoryError,
                    ray.exceptions.ObjectLostError) as exc:
                out = {"record": {"key": job.key, "status": "infra_error", "task_id": job.task_id,
                                  "sample": job.sample, "attempts": 1,
                                  "error": f"{type(exc).__name__}: {exc}"[:2000],
                                  "duration_s": time.monotonic() - started[ref]},
                       "trace_name": None, "trace_text": None}
            rec = out["record"]
            if out["trace_name"] and out["trace_text"] is not None:
                path = trace_dir / out["trace_name"]
                path.write_text(out["trace_text"], encoding="utf-8")
                rec["trace_path"] = str(path)
            records.append(rec)
            if on_result:
                on_result(rec)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
    return records


# -- actors: one warm sandbox per actor ---------------------------------------------------------------------

class SandboxActor:
    """One env (a sandbox with a warm judge) on a Ray node, kept for many episodes; used as a Ray actor.

    `env_options` are CommBenchEnv keyword arguments (max_turns, reward, reference, trace_dir, ...); traces stay
    on the node (their paths are in the returned info).
    """

    def __init__(self, sandbox: SandboxProfile | str = "local-cpu", **env_options: Any):
        self.profile = _worker_profile(sandbox)
        self.env_options = env_options
        self._env: Any = None

    def _make_env(self, task_id: str) -> Any:
        from ..episode.gym_env import CommBenchEnv

        if self._env is not None:
            self._env.close()
        self._env = CommBenchEnv(task=task_id, sandbox=self.profile, **self.env_options)
        return self._env

    def node(self) -> dict[str, Any]:
        return _node_info()

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        options = options or {}
        if self._env is None:
            self._make_env(options.get("task", "collective/allreduce_ring"))
        return self._env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self._env is None:
            raise CommBenchError("reset() the remote env before step()")
        return self._env.step(action)

    def play_turn(self, action: Any) -> Any:
        """One turn as a typed StepOutcome (see episode/core.py), and the observation after it."""
        if self._env is None:
            raise CommBenchError("reset() the remote env before play_turn()")
        return self._env.play_turn(action), self._env.observation()

    def score(self, sub: Submission, retries: int = 1) -> Score:
        """Judge one submission as a one-turn episode (the actor's env must have max_turns=1)."""
        score, env = score_with_retry(lambda s: self._make_env(s.task_id), self._env, sub, retries)
        self._env = env
        return score

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def start_actor(sandbox: SandboxProfile | str = "local-cpu", *, world: int = 2, cpus: float | None = None,
                gpu_share: float = 1.0, **env_options: Any) -> Any:
    """A SandboxActor holding the resources of a `world`-rank episode of this sandbox (see episode_resources)."""
    ray = require_ray()
    res = episode_resources(sandbox, world, cpus=cpus, gpu_share=gpu_share)
    check_fits(res, "a SandboxActor")
    return ray.remote(SandboxActor).options(num_cpus=res["num_cpus"], num_gpus=res["num_gpus"]).remote(
        sandbox, **env_options)


class RemoteEnv:
    """The Gymnasium calls (reset, step, close) of an env that lives in a SandboxActor on some Ray node."""

    def __init__(self, sandbox: SandboxProfile | str = "local-cpu", *, world: int = 2, cpus: float | None = None,
                 gpu_share: float = 1.0, actor: Any = None, **env_options: Any):
        self._ray = require_ray()
        self.actor = actor if actor is not None else start_actor(sandbox, world=world, cpus=cpus, gpu_share=gpu_share,
                                                                 **env_options)
        self._closed = False
        self._obs: dict = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        return self._ray.get(self.actor.reset.remote(seed=seed, options=options))

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        return self._ray.get(self.actor.step.remote(action))

    def play_turn(self, action: Any) -> Any:
        """One turn as a typed StepOutcome (episode/core.py); `observation()` is the observation after it."""
        outcome, self._obs = self._ray.get(self.actor.play_turn.remote(action))
        return outcome

    def observation(self) -> dict:
        return self._obs

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._ray.is_initialized():  # Ray already shut down: the actor went with it
            return
        try:
            self._ray.wait([self.actor.close.remote()], timeout=60)
        finally:
            self._ray.kill(self.actor)


class RayScorer:
    """Judge submissions on a Ray cluster: `actors` SandboxActors (one warm sandbox each), fed one submission at a
    time as they free up; scores come back in submission order. Same interface as scoring.LocalScorer."""

    def __init__(self, sandbox: SandboxProfile | str = "local-cpu", actors: int = 2, *, world: int = 2,
                 cpus: float | None = None, gpu_share: float = 1.0, retries: int = 1, address: str | None = None,
                 start_timeout_s: float = 300.0, **env_options: Any):
        if actors < 1:
            raise ValueError("actors must be at least 1")
        self._ray = connect(address)
        self.retries = retries
        env_options = {k: v for k, v in env_options.items() if k != "max_turns"}
        self.actors = [start_actor(sandbox, world=world, cpus=cpus, gpu_share=gpu_share, max_turns=1, **env_options)
                       for _ in range(actors)]
        self._closed = False
        # An actor the cluster has no room for would take submissions and never answer: wait until all are placed.
        ready, _ = self._ray.wait([a.node.remote() for a in self.actors], num_returns=actors, timeout=start_timeout_s)
        if len(ready) < actors:
            self.close()
            res = episode_resources(sandbox, world, cpus=cpus, gpu_share=gpu_share)
            raise CommBenchError(f"only {len(ready)} of {actors} SandboxActors started within {start_timeout_s:.0f} s: "
                                 f"the cluster has no room for more (each asks for {res['num_cpus']:g} CPUs and "
                                 f"{res['num_gpus']:g} GPUs); ask for fewer actors or fewer CPUs each")
        self.nodes = self._ray.get(ready)

    def score(self, submissions: Sequence[Submission]) -> list[Score]:
        if self._closed:
            raise RuntimeError("this scorer was closed")
        from ray.util import ActorPool

        pool = ActorPool(self.actors)
        return list(pool.map(lambda actor, sub: actor.score.remote(sub, self.retries), list(submissions)))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        refs = [a.close.remote() for a in self.actors]  # each removes its sandbox; an unplaced actor never answers
        self._ray.wait(refs, num_returns=len(refs), timeout=60)
        for a in self.actors:
            self._ray.kill(a)

    def __enter__(self) -> "RayScorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
