"""asyncio: astep/areset keep the event loop free; EpisodePool runs episodes concurrently with coroutine agents
(and synchronous ones), streams outcomes, and retries infrastructure failures without scoring them."""

from __future__ import annotations

import asyncio

import pytest

from commbench_env.agents import load_agent
from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.run.rollouts import EpisodePool, EpisodeRequest
from commbench_env.sandbox import load_profile

TASK = "p2p/ring_shift"
REFERENCE = load_task(TASK).reference_source()
WRONG = "import torch\n\n\ndef ring_shift(x):\n    return x.clone()\n"


def test_astep_and_areset_leave_the_event_loop_free(trace_dir):
    env = CommBenchEnv(task=TASK, world_size=2, max_turns=2, reference="none", trace_dir=str(trace_dir))

    async def main():
        ticks = 0

        async def ticker(job: asyncio.Future):
            nonlocal ticks
            while not job.done():
                ticks += 1
                await asyncio.sleep(0.005)

        reset = asyncio.ensure_future(env.areset(seed=1))
        await ticker(reset)
        obs, info = reset.result()
        assert obs["turn"] == 0 and info["task_id"] == TASK
        ticks_at_reset = ticks
        step = asyncio.ensure_future(env.astep({"tool": "check", "source": REFERENCE}))
        await ticker(step)
        info = step.result()[4]
        assert info["verdict"] == "pass"
        # the loop ran other coroutines while the judge worked (a blocking step would have allowed none)
        assert ticks > ticks_at_reset
        await env.aclose()

    asyncio.run(main())


def test_episode_pool_runs_episodes_concurrently(trace_dir):
    """Four episodes in flight at once: every agent waits in `act` until all four are there, which only a concurrent
    run gets past. Agents 'think' (await) like an LLM rollout waiting on its model."""
    arrived: set[int] = set()
    all_here = asyncio.Event()

    class Agent:
        def __init__(self, req: EpisodeRequest):
            self.req, self.turn = req, 0

        async def reset(self, obs, info):
            assert obs["turn"] == 0 and info["task_id"] == self.req.task

        async def act(self, obs, info):
            self.turn += 1
            if self.turn == 1:
                arrived.add(self.req.tag)
                if len(arrived) == 4:
                    all_here.set()
                await asyncio.wait_for(all_here.wait(), timeout=120)
                return {"tool": "check", "source": WRONG if self.req.tag == "wrong" else REFERENCE}
            await asyncio.sleep(0.01)  # a model call
            return {"tool": "submit", "source": ""}

    def agent(req: EpisodeRequest):
        return load_agent("reference") if req.tag == "sync" else Agent(req)

    requests = [EpisodeRequest(TASK, world_size=2, seed=i, tag=t) for i, t in enumerate(["a", "b", "wrong", "c"])]
    requests.append(EpisodeRequest(TASK, world_size=2, tag="sync"))  # a synchronous Agent, run in threads

    async def main():
        async with EpisodePool(agent, concurrency=4, env_kwargs={"max_turns": 3, "reference": "none",
                                                                 "trace_dir": str(trace_dir)}) as pool:
            streamed = [o async for o in pool.stream(requests)]
        return streamed

    streamed = asyncio.run(main())
    assert sorted(o.index for o in streamed) == [0, 1, 2, 3, 4]
    by_tag = {o.request.tag: o for o in streamed}
    for tag in ("a", "b", "c", "sync"):
        assert by_tag[tag].final_reward > 0 and by_tag[tag].verdict == "pass", tag
    assert by_tag["wrong"].final_reward == 0.0 and by_tag["wrong"].verdict == "wrong_answer"
    assert by_tag["sync"].turns == 3 and [s.verdict for s in by_tag["sync"].steps] == ["runtime_error", "pass", "pass"]
    first_four = [by_tag[t] for t in ("a", "b", "wrong", "c")]
    assert max(o.started for o in first_four) < min(o.ended for o in first_four)  # their windows overlap


def test_infrastructure_failures_are_retried_and_never_scored(trace_dir):
    broken = load_profile("local-cpu").model_copy(update={"python": "/nonexistent/python3"})

    async def main():
        async with EpisodePool(lambda req: load_agent("reference"), concurrency=2, infra_retries=2,
                               env_kwargs={"sandbox": broken, "max_turns": 3, "trace_dir": str(trace_dir)}) as pool:
            return await pool.run([TASK, "collective/allreduce_ring"])

    outcomes = asyncio.run(main())
    for o in outcomes:
        assert not o.ok and o.attempts == 3 and "SandboxError" in o.error and o.final_reward == 0.0
    assert not list(trace_dir.glob("*.jsonl"))  # no trace of a failed episode is left to be scored


def test_a_card_error_stops_the_run(trace_dir):
    async def main():
        async with EpisodePool(lambda req: load_agent("reference"), env_kwargs={"trace_dir": str(trace_dir)}) as pool:
            await pool.run(["no/such_task"])

    with pytest.raises(Exception, match="no task 'no/such_task'"):
        asyncio.run(main())



def test_envs_are_made_on_the_requests_task(trace_dir):
    """The pool makes each env on its first request's task: the env's default task (a torch task that runs in
    `cpu` and `cuda` only) must not decide whether a `cuda-shared` sandbox is allowed. Without a GPU the request
    cannot be served, and the run says so before any episode starts (never a runtime error scored as the
    agent's)."""
    from commbench_env.errors import UnservableError

    async def main():
        async with EpisodePool(lambda req: load_agent("reference"), infra_retries=0, env_kwargs={
                "sandbox": "local-gpu-shared", "max_turns": 2, "trace_dir": str(trace_dir)}) as pool:
            return await pool.run(["p2p/ipc_push_copy"])

    with pytest.raises(UnservableError, match="p2p/ipc_push_copy in device mode 'cuda-shared'.*sees 0"):
        asyncio.run(main())
    assert not list(trace_dir.glob("*.jsonl"))
