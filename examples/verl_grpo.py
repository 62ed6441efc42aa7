"""GRPO with verl's agent loop on CommBench tasks: multi-turn tool calls, rewards from the real judge.

Runs on a CPU in about a minute with a tiny randomly initialised model built offline (no download):

    python examples/verl_grpo.py --steps 2

What runs is verl's own code wherever verl can run without a GPU: its RLHFDataset reads the rows
`write_verl_dataset` wrote; its AgentLoopWorker runs `CommBenchAgentLoop` for every trajectory (tool calls parsed
by verl's hermes parser, feedback tokens masked out, the episode's reward placed on the last token); its GRPO
advantage and PPO policy loss (`verl.trainer.ppo.core_algos`) make the update. Two pieces of verl need GPUs and are
stood in for here: generation (vLLM/SGLang servers) by `transformers`' generate on the same tokens, and the FSDP
actor by one AdamW step in this process. The tiny model writes gibberish, so its rewards are 0; the point is that
the loop runs end to end.

For real (a GPU host, `pip install verl[vllm]` as verl's docs say; CommBench's rows and loop are the same):

    commbench rows --trainer verl --tasks smoke --world 2 --repeats 64 --out commbench.parquet
    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
        data.train_files=commbench.parquet data.val_files=commbench.parquet \\
        data.max_prompt_length=4096 data.max_response_length=8192 data.return_raw_chat=True \\
        data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
        actor_rollout_ref.model.path=Qwen/Qwen3-1.7B actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=8 \\
        actor_rollout_ref.rollout.multi_turn.enable=True actor_rollout_ref.rollout.multi_turn.format=hermes \\
        actor_rollout_ref.rollout.agent.agent_loop_config_path=$(python -c \\
            "from commbench_env.integrations.verl_adapter import VERL_AGENT_LOOP_CONFIG as p; print(p)") \\
        actor_rollout_ref.rollout.agent.default_agent_loop=commbench trainer.n_gpus_per_node=8

Judging then uses the config's sandbox (`local-cpu` over gloo, needing no GPU; copy the yaml and set `sandbox:
local-gpu` or `docker-gpu` to judge on GPUs the trainer leaves free, or `remote: true` to judge on Ray actors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="p2p/ring_shift,collective/allreduce_ring", help="task selector")
    ap.add_argument("--world", type=int, default=2, help="world size where a task allows it")
    ap.add_argument("--sandbox", default="local-cpu", help="sandbox profile that judges the code")
    ap.add_argument("--max-turns", type=int, default=2, help="the env's turn budget per episode")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--generations", type=int, default=2, help="trajectories per prompt (the GRPO group)")
    ap.add_argument("--reply-tokens", type=int, default=48, help="new tokens per model reply")
    ap.add_argument("--response-tokens", type=int, default=4096, help="verl's max_response_length (all turns)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the summary (steps, rewards, verdicts) to this file")
    return ap.parse_args(argv)


class LocalGenerationServer:
    """Stands in for verl's vLLM/SGLang servers on a CPU: the same `generate` call (token ids in, token ids and
    log-probs out), answered by `transformers`' sampling from the model being trained."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int):
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self.lock = threading.Lock()  # one generate at a time: the model is shared with the update
        self.calls = 0

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        ids, logprobs = await asyncio.get_running_loop().run_in_executor(
            None, self._sample, prompt_ids, float(sampling_params.get("temperature", 1.0)))
        self.calls += 1
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")

    def _sample(self, prompt_ids: list[int], temperature: float) -> tuple[list[int], list[float]]:
        import torch

        x = torch.tensor([prompt_ids])
        with self.lock, torch.no_grad():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=self.max_new_tokens,
                                      do_sample=temperature > 0, temperature=max(temperature, 1e-5), top_k=0,
                                      output_scores=True, return_dict_in_generate=True,
                                      pad_token_id=self.tokenizer.pad_token_id,
                                      eos_token_id=self.tokenizer.eos_token_id)
        new = out.sequences[0, len(prompt_ids):].tolist()
        logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, new)]
        return new, logprobs


def response_logprobs(model: Any, batch: Any) -> Any:
    """Log-probs of the response tokens under the model (the actor's forward pass, in one process)."""
    import torch

    n_resp = batch["responses"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits[:, -n_resp - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    import torch

    torch.manual_seed(a.seed)
    work = Path(tempfile.mkdtemp(prefix="commbench-verl-"))  # the tiny model, the rows, the loop's config
    try:
        return train(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def train(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo import core_algos
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from commbench_env.cards import select_tasks
    from commbench_env.integrations.tiny import corpus, tiny_model, tiny_tokenizer
    from commbench_env.integrations.verl_adapter import (VERL_AGENT_LOOP_CONFIG, verl_config, verl_rows,
                                                      write_verl_dataset)

    tok = tiny_tokenizer(corpus(t.id for t in select_tasks(a.tasks)))
    model = tiny_model(tok, seed=a.seed)
    model.save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    data_file = write_verl_dataset(verl_rows(a.tasks, sandbox=a.sandbox, world_size=a.world), work / "train.parquet")
    loops = OmegaConf.load(VERL_AGENT_LOOP_CONFIG)
    for entry in loops:
        entry.sandbox, entry.max_turns = a.sandbox, a.max_turns
    OmegaConf.save(loops, work / "agent_loops.yaml")
    cfg = verl_config(work / "model", data_file, loop_config=work / "agent_loops.yaml", overrides=[
        f"data.max_response_length={a.response_tokens}", f"data.train_batch_size={a.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={a.prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", f"actor_rollout_ref.rollout.n={a.generations}"])

    server = LocalGenerationServer(model, tok, a.reply_tokens)
    worker = AgentLoopWorker(cfg, llm_client=server)
    dataset = RLHFDataset(data_files=[str(data_file)], tokenizer=worker.tokenizer, config=cfg.data)
    actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    optim = torch.optim.AdamW(model.parameters(), lr=a.lr)
    summary: dict[str, Any] = {"steps": 0, "rewards": [], "verdicts": {}, "turns": [], "losses": []}
    for step in range(a.steps):
        t0 = time.monotonic()
        rows = [dataset[(step * a.prompts + i) % len(dataset)] for i in range(a.prompts)]
        batch = DataProto.from_single_dict(collate_fn(rows))
        batch.non_tensor_batch["uid"] = np.array([f"{step}-{i}" for i in range(len(batch))], dtype=object)
        batch = batch.repeat(repeat_times=a.generations, interleave=True)
        gen_batch = batch.select(non_tensor_batch_keys=[k for k in batch.non_tensor_batch if k != "uid"])
        out = asyncio.run(worker.generate_sequences(gen_batch))  # every trajectory: a CommBench episode
        rewards = out.batch["rm_scores"]
        mask = out.batch["response_mask"]
        adv, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask,
                                                           index=batch.non_tensor_batch["uid"])
        model.train()
        logp = response_logprobs(model, out.batch)
        loss, _ = core_algos.compute_policy_loss_vanilla(old_log_prob=logp.detach(), log_prob=logp, advantages=adv,
                                                         response_mask=mask, config=actor_cfg)
        optim.zero_grad()
        loss.backward()
        optim.step()
        model.eval()
        scores = rewards.sum(-1).tolist()
        verdicts = list(out.non_tensor_batch["commbench_verdict"])
        for v in verdicts:
            summary["verdicts"][v or "no code"] = summary["verdicts"].get(v or "no code", 0) + 1
        summary["steps"] += 1
        summary["rewards"].append(scores)
        summary["turns"].append(out.non_tensor_batch["__num_turns__"].tolist())
        summary["losses"].append(loss.item())
        print(f"step {step + 1}/{a.steps}: {len(scores)} episodes, rewards {[round(s, 3) for s in scores]}, "
              f"verdicts {verdicts}, turns {summary['turns'][-1]}, loss {loss.item():.4f} "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
    summary["generate_calls"] = server.calls
    print(f"done: {summary['steps']} GRPO steps, {server.calls} model replies, verdicts {summary['verdicts']}")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
