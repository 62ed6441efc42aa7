"""Harbor task folders: `commbench export harbor DIR`, and the two scripts those folders run.

Harbor (the task format CLI coding agents are evaluated in, and that TRL, SkyRL, rLLM, verifiers and NeMo Gym read)
gives an agent a container, an `instruction.md` and a time budget, then runs `tests/test.sh` to grade what the agent
left. One exported folder per task:

    instruction.md            the statement, exactly what `commbench show` prints, and how to work in the container
    task.toml                 Harbor's card: the verifier in a separate container, /app/solution.py carried over
    environment/Dockerfile    the agent's image: commbench-env without the bundled tasks, the public card, the starter
    environment/commbench/    the public card (visible cases only, no reference) and `commbench-check`
    environment/app/          the starter, copied to /app/solution.py
    tests/Dockerfile          the grading image (separate mode)
    tests/test.sh             grading: one CommBench episode that submits /app/solution.py (`grade` below)
    tests/task/<id>/          the whole task folder: hidden cases and reference, never in the agent's image

Both sides play through `Episode`: `check` (the agent's turn-by-turn feedback) is a check turn on the public card,
`grade` is a one-turn episode that submits the agent's file, rewarded as every episode is. Nothing secret (hidden
cases, references, seeds) is written under environment/ or into instruction.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import __version__
from ..cards import CARD_FILE, PROMPT_FILE, Task, TaskCard, load_task_dir, select_tasks
from ..errors import CardError, CommBenchError

PUBLIC_CARD = "card.json"  # the public card: JSON, so the agent's side needs no TOML writer or reader
CHECK_TOOL = "commbench-check"
SOLUTION_DIR = "/app"
DEFAULT_CPU_BASE = "python:3.11-slim"
DEFAULT_GPU_BASE = "nvcr.io/nvidia/pytorch:25.09-py3"  # the base of dockerfiles/cuda
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


# -- the public card ---------------------------------------------------------------------------------------------
def public_card(task: Task) -> dict[str, Any]:
    """The card with its visible cases only. A card must hold a hidden case to load, so one visible case (one whose
    shape no other visible case has) is labelled hidden; where every visible case has the same shape, a public case
    of another shape is made from the first. Either way nothing in it is secret: `check` shows them all by name."""
    from ..golden import get_op

    data = task.card.model_dump(mode="json")
    visible = [c for c in data["cases"] if c["visible"]]
    hidden_shapes = {tuple(c["shape"]) for c in data["cases"] if not c["visible"]}
    candidates: list[list[dict[str, Any]]] = []
    for i, c in enumerate(visible):
        if all(tuple(o["shape"]) != tuple(c["shape"]) for j, o in enumerate(visible) if j != i):
            candidates.append([*visible[:i], {**c, "visible": False}, *visible[i + 1:]])
    first = visible[0]
    for shape in _other_shapes(first["shape"]):
        if tuple(shape) not in hidden_shapes and all(tuple(shape) != tuple(v["shape"]) for v in visible):
            candidates.append([*visible, {**first, "name": f"{first['name']}-public-variant", "shape": shape,
                                          "visible": False}])
    op = get_op(task.card.semantics.op)
    for cases in candidates:
        try:
            card = TaskCard.model_validate({**data, "cases": cases})
            op.validate_card(card)
        except ValueError:
            continue
        return card.model_dump(mode="json")
    raise CardError(f"{task.id}: no public card could be made from its visible cases (each needs a shape of its own)")


def _other_shapes(shape: list[int]) -> list[list[int]]:
    out = []
    for i in range(len(shape)):
        for n in (shape[i] * 2, shape[i] + 1, max(1, shape[i] // 2)):
            if n != shape[i]:
                out.append([*shape[:i], n, *shape[i + 1:]])
    return out


def load_public_task(root: Path) -> Task:
    """The public card of an exported task (folder with card.json, prompt.md and the starter) as a Task."""
    try:
        card = TaskCard.model_validate(json.loads((root / PUBLIC_CARD).read_text()))
    except (OSError, ValueError) as exc:
        raise CardError(f"{root / PUBLIC_CARD}: not a public CommBench card ({exc})") from None
    return Task(card, root)


# -- the export ---------------------------------------------------------------------------------------------------
def folder_name(task_id: str) -> str:
    return task_id.replace("/", "__")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a TOML basic string


def _toml(tables: dict[str, dict[str, Any]], top: dict[str, Any]) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _gpu_only(task: Task) -> bool:
    return "cpu" not in {m.value for m in task.card.world.device_modes}


def _package_lines(package: str, dest: Path) -> tuple[str, str]:
    """(COPY line or "", pip requirement) for `package`: a wheel or sdist file is copied into the build context."""
    p = Path(package)
    if p.is_file():
        (dest / "pkg").mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest / "pkg" / p.name)
        return "COPY pkg /tmp/pkg\n", f"/tmp/pkg/{p.name}"
    return "", package


def _dockerfile(task: Task, dest: Path, package: str, base: str | None, agent: bool) -> str:
    gpu = _gpu_only(task)
    base = base or (DEFAULT_GPU_BASE if gpu else DEFAULT_CPU_BASE)
    copy_pkg, req = _package_lines(package, dest)
    torch = "" if gpu else f"RUN python3 -m pip install --no-cache-dir --index-url {TORCH_CPU_INDEX} torch\n"
    lines = [f"# {'The agent' if agent else 'The grader'}'s image for CommBench task {task.id} "
             f"(written by commbench-env {__version__}).", f"FROM {base}", torch + copy_pkg
             + f"RUN python3 -m pip install --no-cache-dir {json.dumps(req)}"]
    if agent:
        lines += ["# the package bundles every task's card, hidden cases and reference: none of it stays here",
                  "RUN python3 -c \"import commbench_env, pathlib, shutil; shutil.rmtree(pathlib.Path(commbench_env"
                  ".__file__).parent / '_cards' / 'tasks', ignore_errors=True)\"",
                  "COPY commbench /opt/commbench",
                  f"RUN chmod +x /opt/commbench/{CHECK_TOOL} && ln -s /opt/commbench/{CHECK_TOOL} "
                  f"/usr/local/bin/{CHECK_TOOL}",
                  f"COPY app/ {SOLUTION_DIR}/", f"WORKDIR {SOLUTION_DIR}"]
    else:
        lines += ["WORKDIR /"]
    return "\n".join(line for line in lines if line) + "\n"


def _instruction(task: Task, tools: str) -> str:
    entry = task.card.entry.file
    return (task.agent_view() + "\n## Working in this container\n"
            f"- Write your solution in `{SOLUTION_DIR}/{entry}` (the starter is there now). That file, as you leave "
            "it, is graded when you finish: every visible and hidden case, then timed against the expert "
            "reference on the grader's hardware.\n"
            f"- `{CHECK_TOOL}` judges `{SOLUTION_DIR}/{entry}` (or the file you name) on the visible cases and prints "
            f"the judge's feedback: verdict, first mismatch, rank output. `{CHECK_TOOL} --tool compile` only "
            f"checks syntax, imports and forbidden APIs. Tools: {tools}. Run it as often as you like.\n"
            "- Passing the visible cases is not enough: hidden cases of other shapes and sizes are checked at "
            "grading.\n")


def export_task(task: Task, out: Path, *, sandbox: str | None = None, world: int | None = None,
                package: str | None = None, base_image: str | None = None, oracle: bool = False) -> Path:
    """Write one Harbor task folder for `task` under `out`; returns it. `package`: the pip requirement (or a wheel
    file) both images install commbench-env from; `oracle`: also write solution/solve.sh (the reference, for
    Harbor's oracle agent: it is never given to other agents)."""
    package = package or f"commbench-env=={__version__}"
    sandbox = sandbox or ("local-gpu" if _gpu_only(task) else "local-cpu")
    w = task.world_for(world)
    dest = out / folder_name(task.id)
    if dest.exists():
        shutil.rmtree(dest)
    env_dir, tests_dir = dest / "environment", dest / "tests"
    pub_dir = env_dir / "commbench" / "task"
    pub_dir.mkdir(parents=True)
    (pub_dir / PUBLIC_CARD).write_text(json.dumps(public_card(task), indent=1) + "\n")
    (pub_dir / PROMPT_FILE).write_text(task.prompt)
    (pub_dir / task.card.entry.starter).write_text(task.starter)
    tools = "compile, check" + (", sanitize" if task.card.language.value == "cuda" else "")
    (env_dir / "commbench" / CHECK_TOOL).write_text(
        "#!/bin/sh\n# Judge your solution on this task's visible cases (the grader also runs hidden ones).\n"
        f"exec \"${{COMMBENCH_PYTHON:-python3}}\" -m commbench_env.integrations.harbor check "
        f"--task \"$(dirname \"$(readlink -f \"$0\")\")/task\" --sandbox {sandbox} --world {w} "
        f"--default-file {SOLUTION_DIR}/{task.card.entry.file} \"$@\"\n")
    (env_dir / "commbench" / CHECK_TOOL).chmod(0o755)
    (env_dir / "app").mkdir()
    (env_dir / "app" / task.card.entry.file).write_text(task.starter)
    (env_dir / "Dockerfile").write_text(_dockerfile(task, env_dir, package, base_image, agent=True))
    (dest / "instruction.md").write_text(_instruction(task, tools))

    full = tests_dir / "task" / task.id
    shutil.copytree(task.root, full, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (tests_dir / "Dockerfile").write_text(_dockerfile(task, tests_dir, package, base_image, agent=False))
    (tests_dir / "test.sh").write_text(
        "#!/bin/bash\n# Harbor's grading step: one CommBench episode that submits the agent's file; the reward goes to\n"
        "# $LOGS/reward.json (Harbor reads it), the details and the episode's trace beside it.\n"
        "HERE=\"$(cd \"$(dirname \"$0\")\" && pwd)\"\n"
        "LOGS=\"${COMMBENCH_LOGS:-/logs/verifier}\"\n"
        f"SOLUTION=\"${{COMMBENCH_SOLUTION:-{SOLUTION_DIR}/{task.card.entry.file}}}\"\n"
        "mkdir -p \"$LOGS\"\n"
        f"exec \"${{COMMBENCH_PYTHON:-python3}}\" -m commbench_env.integrations.harbor grade "
        f"--task \"$HERE/task/{task.id}\" --task-hash {task.hash} --solution \"$SOLUTION\" --logs \"$LOGS\" "
        f"--sandbox \"${{COMMBENCH_SANDBOX:-{sandbox}}}\" --world {w}\n")
    (tests_dir / "test.sh").chmod(0o755)
    if oracle:
        (dest / "solution").mkdir()
        ref = task.reference_source()
        marker = "COMMBENCH_REFERENCE_EOF"
        (dest / "solution" / "solve.sh").write_text(
            f"#!/bin/bash\n# Harbor's oracle: the expert reference (never shown to other agents).\n"
            f"cat > {SOLUTION_DIR}/{task.card.entry.file} <<'{marker}'\n{ref.rstrip()}\n{marker}\n")
        (dest / "solution" / "solve.sh").chmod(0o755)

    c = task.card
    timeout = float(c.limits.timeout_s)
    gpus = w if _gpu_only(task) else 0
    resources = {"cpus": max(2, w), "memory_mb": 8192, "storage_mb": 20480, "gpus": gpus}
    (dest / CARD_FILE).write_text(_toml(
        {"task": {"name": f"commbench/{task.id.replace('/', '-')}", "description": c.title,
                  "keywords": [c.category.value, c.difficulty.value, c.language.value, *c.tags]},
         "metadata": {"commbench_task": task.id, "commbench_task_hash": task.hash, "category": c.category.value,
                      "difficulty": c.difficulty.value, "language": c.language.value, "source": c.source,
                      "world_size": w, "sandbox": sandbox, "commbench_version": __version__},
         "agent": {"timeout_sec": 3600.0},
         "verifier": {"timeout_sec": max(900.0, 10 * timeout), "environment_mode": "separate"},
         "verifier.environment": {**resources, "build_timeout_sec": 1800.0},  # built from tests/Dockerfile
         "environment": {**resources, "build_timeout_sec": 1800.0}},
        {"schema_version": "1.1", "artifacts": [f"{SOLUTION_DIR}/{task.card.entry.file}"]}))
    return dest


def export_harbor(out: Path, tasks: str = "all", **options: Any) -> list[Path]:
    """Export every task of a selector; a task whose public card cannot be made is an error naming it."""
    selected = select_tasks(tasks)
    if not selected:
        raise CommBenchError(f"no task matches {tasks!r}")
    out.mkdir(parents=True, exist_ok=True)
    return [export_task(t, out, **options) for t in selected]


# -- the two scripts the folders run ------------------------------------------------------------------------------
def check(task_dir: Path, source: str, *, tool: str = "check", sandbox: str = "local-cpu",
          world: int | None = None) -> tuple[str, bool]:
    """One check (or compile) turn on the public card: (the judge's feedback, passed). Every case here is public,
    so the feedback names them all and shows their mismatches in full."""
    from ..episode.core import Episode

    task = load_public_task(task_dir)
    with tempfile.TemporaryDirectory(prefix="commbench-check-") as traces:
        ep = Episode(task=task, sandbox=sandbox, max_turns=1_000_000, world_size=world, reference="none",
                     submit_on_truncation=False, trace_dir=traces, agent={"name": "harbor-check"})
        try:
            ep.start()
            outcome = ep.step({"tool": tool, "source": source})
        finally:
            ep.close()
    res = outcome.result
    if res is None:
        return outcome.feedback, False
    public = res.model_copy(update={"cases": [c.model_copy(update={"visible": True, "mismatch": c.mismatch.model_copy(
        update={"hidden": False}) if c.mismatch else None}) for c in res.cases]})
    return public.feedback(20000), res.verdict.value in ("pass", "compiled")


def grade(task_dir: Path, solution: Path, logs: Path, *, sandbox: str = "local-cpu", world: int | None = None,
          task_hash: str | None = None) -> dict[str, Any]:
    """Harbor's grading step: a one-turn episode that submits `solution`. Writes `logs`/reward.json (the episode's
    reward and whether it was correct), result.json (verdict, reward parts, the final feedback) and traces/."""
    from ..episode.core import Episode

    task = load_task_dir(task_dir)
    if task_hash and task.hash != task_hash:
        raise CardError(f"{task_dir}: task hash {task.hash} differs from the exported {task_hash}: the task folder "
                        "was changed after export")
    source = solution.read_text() if solution.is_file() else ""
    logs.mkdir(parents=True, exist_ok=True)
    ep = Episode(task=task, sandbox=sandbox, max_turns=1, world_size=world, trace_dir=str(logs / "traces"),
                 agent={"name": "harbor", "kind": "harbor"})
    try:
        ep.start()
        outcome = ep.step({"tool": "submit", "source": source})
    finally:
        ep.close()
    res, parts = outcome.result, outcome.parts
    reward = float(outcome.final_reward or 0.0)
    correct = bool(res is not None and res.correct)
    (logs / "reward.json").write_text(json.dumps({"reward": reward, "correct": float(correct)}) + "\n")
    details = {"task": task.id, "task_hash": task.hash, "solution": str(solution), "found": solution.is_file(),
               "world_size": ep.world_size, "sandbox": sandbox, "verdict": res.verdict.value if res else None,
               "correct": correct, "reward": reward, "reward_parts": parts.model_dump(mode="json") if parts else None,
               "feedback": outcome.feedback, "trace": str(ep.trace_path)}
    (logs / "result.json").write_text(json.dumps(details, indent=1) + "\n")
    return details


def main(argv: list[str] | None = None) -> int:
    """`python -m commbench_env.integrations.harbor check|grade ...`: the entry points the exported scripts call."""
    parser = argparse.ArgumentParser(prog="commbench_env.integrations.harbor")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="judge a file on the public cases (the agent's tool)")
    c.add_argument("file", nargs="?", type=Path)
    c.add_argument("--task", type=Path, required=True)
    c.add_argument("--tool", default="check", choices=["compile", "check", "sanitize"])
    c.add_argument("--sandbox", default="local-cpu")
    c.add_argument("--world", type=int)
    c.add_argument("--default-file", type=Path, default=Path(SOLUTION_DIR) / "solution.py")
    g = sub.add_parser("grade", help="score the agent's file: one episode that submits it (Harbor's test.sh)")
    g.add_argument("--task", type=Path, required=True)
    g.add_argument("--solution", type=Path, required=True)
    g.add_argument("--logs", type=Path, required=True)
    g.add_argument("--sandbox", default="local-cpu")
    g.add_argument("--world", type=int)
    g.add_argument("--task-hash")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "check":
            path = args.file or args.default_file
            if not path.is_file():
                print(f"error: {path} does not exist; write your solution there or name a file", file=sys.stderr)
                return 2
            text, ok = check(args.task, path.read_text(), tool=args.tool, sandbox=args.sandbox, world=args.world)
            print(text)
            return 0 if ok else 1
        details = grade(args.task, args.solution, args.logs, sandbox=args.sandbox, world=args.world,
                        task_hash=args.task_hash)
        print(f"{details['task']}: {details['verdict'] or 'no verdict'}, reward {details['reward']:.3f}"
              + ("" if details["found"] else f" ({args.solution} not found)"))
        return 0
    except (CommBenchError, OSError) as exc:  # infrastructure: no reward written, Harbor reports a verifier error
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
