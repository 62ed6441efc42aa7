"""GRPO with TRL on CommBench tasks, rewards from the real judge.

Runs end to end on a CPU in about a minute with a tiny randomly initialised model built offline (no download):

    python examples/trl_grpo.py --steps 2                  # single turn: CommBenchReward judges each completion
    python examples/trl_grpo.py --steps 2 --multi-turn     # tools: compile/check/.../submit, CommBenchToolEnv

The tiny model writes gibberish, so its rewards are 0 (the judge's verdicts are printed); the point is that the
whole loop runs: prompts from task cards, generation, judging in sandboxes, GRPO updates.

For real (a GPU host; install `pip install "commbench-env[rl]"`, plus vLLM for fast generation):

    python examples/trl_grpo.py --model Qwen/Qwen3-1.7B --tasks smoke --world 2 --steps 500 \\
        --batch 16 --generations 8 --completion-tokens 2048 --parallel 16 --sandbox local-cpu [--multi-turn]

`--model` is any causal LM on the Hugging Face hub or a local folder; rewards need no GPU (`--sandbox local-cpu`
judges over gloo), or use `local-gpu` / `docker-gpu` sandboxes on hosts with GPUs to spare, or `--ray-actors N` to
judge on a Ray cluster (`ray start --head` first; see README, "Many hosts with Ray"). Pass TRL's own options
(vLLM, DeepSpeed, LoRA) by editing `grpo_config` below; `accelerate launch` runs it on several GPUs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (random, offline) or a model id / local folder")
    ap.add_argument("--tasks", default="p2p/ring_shift,collective/allreduce_ring", help="task selector")
    ap.add_argument("--world", type=int, default=2, help="world size where a task allows it")
    ap.add_argument("--sandbox", default="local-cpu", help="sandbox profile that judges the code")
    ap.add_argument("--multi-turn", action="store_true", help="tool calls over several turns (environment_factory)")
    ap.add_argument("--max-turns", type=int, default=4, help="multi-turn: the env's turn budget")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4, help="completions per step (per device)")
    ap.add_argument("--generations", type=int, default=2, help="completions per prompt (the GRPO group)")
    ap.add_argument("--completion-tokens", type=int, default=48)
    ap.add_argument("--parallel", type=int, default=2, help="completions judged at once")
    ap.add_argument("--ray-actors", type=int, default=0, help="judge on Ray with this many sandbox actors")
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the summary (steps, logs, verdicts) to this file")
    return ap.parse_args(argv)


def model_and_tokenizer(name: str, tasks: str) -> tuple[Any, Any]:
    if name == "tiny":
        from commbench_env.cards import select_tasks
        from commbench_env.integrations.tiny import corpus, tiny_model, tiny_tokenizer

        tok = tiny_tokenizer(corpus(t.id for t in select_tasks(tasks)))
        return tiny_model(tok), tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name, padding_side="left")
    return AutoModelForCausalLM.from_pretrained(name), tok


def build_trainer(a: argparse.Namespace, out: str) -> tuple[Any, Any]:
    from trl import GRPOConfig, GRPOTrainer

    from commbench_env.integrations import task_rows
    from commbench_env.integrations.trl_adapter import (CommBenchEpisodeReward, CommBenchReward, CommBenchToolEnv,
                                                    task_dataset)

    model, tok = model_and_tokenizer(a.model, a.tasks)
    rows = task_rows(a.tasks, sandbox=a.sandbox, world_size=a.world, multi_turn=a.multi_turn,
                     repeats=max(1, a.steps * a.batch // a.generations))
    grpo_config = GRPOConfig(
        output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch, num_generations=a.generations,
        max_completion_length=a.completion_tokens, learning_rate=1e-5 if a.model != "tiny" else 1e-3,
        logging_steps=1, report_to="none", save_strategy="no", seed=a.seed, use_cpu=a.model == "tiny",
        bf16=False, max_tool_calling_iterations=a.max_turns if a.multi_turn else None, log_completions=False,
    )
    trace_dir = f"{out}/traces"
    if a.multi_turn:
        reward = CommBenchEpisodeReward(parallel=a.parallel)
        factory = CommBenchToolEnv.factory(sandbox=a.sandbox, max_turns=a.max_turns, trace_dir=trace_dir,
                                           remote=a.ray_actors > 0, world=a.world)
        trainer = GRPOTrainer(model=model, processing_class=tok, args=grpo_config, train_dataset=task_dataset(rows),
                              reward_funcs=reward, environment_factory=factory)
    else:
        scorer = None
        if a.ray_actors:
            from commbench_env.run.ray_backend import RayScorer

            scorer = RayScorer(a.sandbox, actors=a.ray_actors, world=a.world, trace_dir=trace_dir)
        reward = CommBenchReward(scorer, sandbox=a.sandbox, parallel=a.parallel, trace_dir=trace_dir)
        trainer = GRPOTrainer(model=model, processing_class=tok, args=grpo_config, train_dataset=task_dataset(rows),
                              reward_funcs=reward)
    return trainer, reward


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="commbench-grpo-") as tmp:
        out = a.out or tmp
        t0 = time.monotonic()
        trainer, reward = build_trainer(a, out)
        trainer.train()
        logs = [h for h in trainer.state.log_history if any(k.startswith("rewards/") for k in h)]
        for h in logs:
            rs = {k: round(v, 3) for k, v in h.items() if k.startswith("rewards/") and k.endswith("/mean")}
            print(f"step {h.get('step')}: loss {h.get('loss')}, reward {h.get('reward')}, {rs}")
        print("judge verdicts:", dict(reward.verdicts))
        if hasattr(reward, "close"):
            reward.close()
        print(f"{trainer.state.global_step} step(s) in {time.monotonic() - t0:.1f} s")
        summary = {"steps": trainer.state.global_step, "logs": logs, "verdicts": dict(reward.verdicts)}
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(summary, fh, indent=1)
        return summary


if __name__ == "__main__":
    main()
