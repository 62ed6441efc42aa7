"""verl's agent loop on CommBench: CommBenchAgentLoop run by verl's own AgentLoopWorker, episodes judged for real.

Generation is the one part of verl's rollout that needs a GPU server (vLLM/SGLang); here a scripted server answers
verl's `generate` call with the token ids of fixed replies, as a model would, so every other step is verl's code and
the judge's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

import numpy as np  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from commbench_env.cards import load_task  # noqa: E402
from commbench_env.integrations.tiny import corpus, tiny_tokenizer  # noqa: E402
from commbench_env.integrations.verl_adapter import (AGENT_NAME, verl_config, verl_rows,  # noqa: E402
                                                 write_verl_dataset)

ROOT = Path(__file__).resolve().parent.parent
TASK = "p2p/ring_shift"


def tool_call(tool: str, source: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': {'source': source}})}\n</tool_call><|im_end|>"


class ScriptedServer:
    """verl's generate call, answered from a script per trajectory (the first request id seen gets script 0...)."""

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.tokenizer, self.scripts, self.ids = tokenizer, scripts, {}
        self.prompts: dict[int, list[list[int]]] = {}

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict, **_) -> TokenOutput:
        k = self.ids.setdefault(request_id, len(self.ids))
        turn = len(self.prompts.setdefault(k, []))
        self.prompts[k].append(list(prompt_ids))
        ids = self.tokenizer.encode(self.scripts[k][turn], add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    from commbench_env.integrations.tiny import tiny_model

    tok = tiny_tokenizer(corpus([TASK]))
    tiny_model(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def rollout(tiny_dir: Path, tmp_path: Path, scripts: list[list[str]], max_turns: int = 2, options: str = ""):
    data = write_verl_dataset(verl_rows(TASK, world_size=2), tmp_path / "train.parquet")
    loops = tmp_path / "loops.yaml"
    loops.write_text(f"- name: {AGENT_NAME}\n  _target_: commbench_env.integrations.verl_adapter.CommBenchAgentLoop\n"
                     f"  max_turns: {max_turns}\n{options}  env_options:\n    trace_dir: {tmp_path / 'traces'}\n")
    cfg = verl_config(tiny_dir, data, loop_config=loops, overrides=[
        "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
    worker = AgentLoopWorker(cfg, llm_client=None)
    server = ScriptedServer(worker.tokenizer, scripts)
    worker.llm_client = server
    dataset = RLHFDataset(data_files=[str(data)], tokenizer=worker.tokenizer, config=cfg.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[0]])).repeat(repeat_times=len(scripts), interleave=True)
    return asyncio.run(worker.generate_sequences(batch)), server, worker.tokenizer


def test_agent_loop_judges_tool_calls_and_places_the_episode_reward(tiny_dir, tmp_path):
    task = load_task(TASK)
    scripts = [[tool_call("check", task.starter), tool_call("submit", task.reference_source())],  # fails, then passes
               [tool_call("compile", task.starter), "I give up.<|im_end|>"],  # budget runs out: last code scored
               ["no code at all<|im_end|>", "still none<|im_end|>"]]         # never sends code
    out, server, tok = rollout(tiny_dir, tmp_path, scripts)
    rewards, mask = out.batch["rm_scores"], out.batch["response_mask"]
    assert rewards.shape == mask.shape
    n_prompt = out.batch["prompts"].shape[1]
    seen = set()
    for i in range(3):
        n = int(out.batch["attention_mask"][i, n_prompt:].sum())
        resp, m = out.batch["responses"][i, :n].tolist(), mask[i, :n].tolist()
        trained = tok.decode([t for t, k in zip(resp, m) if k])       # the model's tokens
        judged = tok.decode([t for t, k in zip(resp, m) if not k])    # the judge's feedback, kept out of the loss
        k = next(j for j, script in enumerate(scripts) if script[0].replace("<|im_end|>", "") in trained)
        seen.add(k)
        assert scripts[k][1].split("<|im_end|>")[0] in trained and "<tool_response>" not in trained
        verdict, correct = out.non_tensor_batch["commbench_verdict"][i], out.non_tensor_batch["commbench_correct"][i]
        reward = float(rewards[i].sum())
        if k == 0:   # the reference, submitted
            assert (verdict, correct) == ("pass", True) and reward >= 0.5
            assert "NotImplementedError" in judged and "runtime_error" in judged   # the check's feedback
        elif k == 1:  # the starter compiles, then is scored at the end of the budget
            assert (verdict, correct, reward) == ("runtime_error", False, 0.0)
            assert "[compile] verdict: compiled" in judged
        else:
            assert (verdict, correct, reward) == ("", False, 0.0) and "Could not parse the action" in judged
        if reward:
            assert int(rewards[i].nonzero().max()) == n - 1   # on the last response token
        assert out.non_tensor_batch["__num_turns__"][i] == 4    # prompt, reply, feedback, reply
    assert seen == {0, 1, 2}
    # each second reply was generated with the judge's feedback to the first in its context
    first_prompt = tok.decode(server.prompts[0][0])  # the tools the model was shown: a torch task has no sanitize
    assert '"name": "submit"' in first_prompt and '"name": "sanitize"' not in first_prompt
    for first, second in server.prompts.values():
        tail = tok.decode(second[len(first):])
        assert second[:len(first)] == first and ("verdict:" in tail or "Could not parse" in tail)
    assert len(list((tmp_path / "traces").glob("*.jsonl"))) == 3   # each episode recorded like any other
    # verl's per-trajectory metrics: time generating, and time in the env (every reply reached it)
    assert all(m["generate_sequences"] > 0 and m["tool_calls"] > 0 for m in out.meta_info["metrics"])


def test_max_sandboxes_bounds_the_trajectories_that_hold_one(tiny_dir, tmp_path):
    """With max_sandboxes 1, the three trajectories play one after another on one warm sandbox, which stays for the
    next batch; without a bound, each would have made its own."""
    from commbench_env.integrations import verl_adapter

    scripts = [[tool_call("check", load_task(TASK).reference_source()), "done<|im_end|>"]] * 3
    out, server, _ = rollout(tiny_dir, tmp_path, scripts, options="  max_sandboxes: 1\n")
    assert list(out.non_tensor_batch["commbench_verdict"]) == ["pass"] * 3
    assert all(float(r.sum()) >= 0.5 for r in out.batch["rm_scores"])  # unsubmitted: the last code is scored
    keys = [k for k in verl_adapter._EPISODES._idle if str(tmp_path) in k]
    assert len(keys) == 1 and verl_adapter._EPISODES.idle(keys[0]) == 1


def test_grpo_example_runs_on_cpu(tmp_path):
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "verl_grpo.py"), "--steps", "2", "--tasks", TASK,
                           "--json", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(out.read_text())
    assert summary["steps"] == 2 and len(summary["losses"]) == 2
    # 2 steps x 2 prompts x 2 generations, each episode two model replies (turn budget 2)
    assert sum(summary["verdicts"].values()) == 8 and summary["generate_calls"] == 16
    assert all(np.isfinite(summary["losses"]))


def test_without_verl_the_import_says_what_to_install():
    code = ("import sys; sys.modules['verl'] = None\n"
            "try:\n    import commbench_env.integrations.verl_adapter\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "pip install 'commbench-env[verl]'" in out.stdout, out.stdout + out.stderr


def test_cuda_tasks_also_get_the_sanitize_tool():
    from commbench_env.integrations.common import tool_schemas

    names = lambda task: [t["function"]["name"] for t in tool_schemas(task)]  # noqa: E731
    assert names(TASK) == ["compile", "check", "benchmark", "profile", "submit"]
    assert names("p2p/ipc_push_copy") == ["compile", "check", "benchmark", "profile", "submit", "sanitize"]
