"""The `commbench` command line: one verb per job."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import CommBenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="CommBench-Env: LLM agents writing multi-GPU communication code, judged in sandboxes.")
trace_app = typer.Typer(no_args_is_help=True, help="Inspect episode traces.")
app.add_typer(trace_app, name="trace")
console = Console()
err = Console(stderr=True)


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


def _fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


@app.command("tasks")
def tasks_cmd(category: Optional[str] = typer.Option(None, help="p2p | collective | ep | fusion | utility"),
              difficulty: Optional[str] = typer.Option(None, help="easy | medium | hard"),
              language: Optional[str] = typer.Option(None, help="torch | cuda | triton"),
              device_mode: Optional[str] = typer.Option(None, "--device-mode", help="cpu | cuda | cuda-shared"),
              as_json: bool = typer.Option(False, "--json", help="machine-readable list")) -> None:
    """List tasks, with filters."""
    from .cards import broken_tasks, select_tasks

    try:
        tasks = select_tasks("all", category=category, difficulty=difficulty, language=language, device_mode=device_mode)
        broken = broken_tasks()
    except CommBenchError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps([{"id": t.id, "title": t.card.title, "category": t.card.category.value,
                           "difficulty": t.card.difficulty.value, "language": t.card.language.value,
                           "device_modes": [m.value for m in t.card.world.device_modes], "hash": t.hash}
                          for t in tasks] + [{"id": i, "broken": why} for i, why in broken.items()], indent=1))
        return
    table = Table(title=f"{len(tasks)} tasks")
    table.add_column("id", no_wrap=True)
    table.add_column("title", ratio=1)
    for col in ("category", "difficulty", "language", "world", "device modes"):
        table.add_column(col, no_wrap=True)
    for t in tasks:
        c = t.card
        table.add_row(t.id, c.title, c.category.value, c.difficulty.value, c.language.value,
                      ",".join(map(str, c.world.sizes)), ",".join(m.value for m in c.world.device_modes))
    console.print(table)
    for task_id, why in broken.items():
        console.print(f"[red]broken card[/red] {task_id}: {why}", markup=True, highlight=False)


@app.command("show")
def show_cmd(task: str = typer.Argument(..., help="task id, e.g. collective/allreduce_ring"),
             hints: bool = typer.Option(False, help="include the task's design hints (the env's hints=True level)")) -> None:
    """Print exactly what the agent sees for a task."""
    from .cards import load_task

    try:
        print(load_task(task).agent_view(hints=hints))
    except CommBenchError as exc:
        _fail(exc)


@app.command("judge")
def judge_cmd(task: str = typer.Argument(..., help="task id"),
              file: Optional[Path] = typer.Argument(None, help="candidate file (default: the task's reference)"),
              mode: str = typer.Option("check", help="compile | check | benchmark | profile | full | sanitize"),
              world: Optional[int] = typer.Option(None, help="world size (default: the card's)"),
              sandbox: str = typer.Option("local-cpu", help="sandbox profile"),
              worlds: int = typer.Option(2, help="world sizes a passing check is judged at, as in an episode"),
              as_json: bool = typer.Option(False, "--json", help="print the whole JudgeResult as JSON (hidden cases "
                                           "included: the host's view, not the agent's)")) -> None:
    """Judge one file once and print the agent's feedback (or the whole JudgeResult)."""
    from .cards import load_task
    from .judge.host.client import JudgeClient
    from .judge.host.result import MODES
    from .sandbox import open_sandbox

    if mode not in MODES:
        _fail(CommBenchError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}"))
    try:
        t = load_task(task)
        source = file.read_text() if file else t.reference_source()
        w = world or t.card.world.default_size
        with open_sandbox(sandbox) as sb:
            client = JudgeClient(sb)
            modes = [m.value for m in t.card.world.device_modes]
            # compile needs no device: a cuda task can be built on a CPU machine
            device_mode = modes[0] if mode == "compile" and sb.profile.device_mode not in modes else None
            try:
                res = client.evaluate(t, {t.card.entry.file: source}, mode, w,  # type: ignore[arg-type]
                                      device_mode=device_mode, worlds=worlds)
            finally:
                client.close()
    except (CommBenchError, OSError) as exc:
        _fail(exc)
    if as_json:
        print(res.model_dump_json(indent=1))
    else:
        print(res.feedback(max_chars=20000))
    raise typer.Exit(0 if res.verdict.value in ("pass", "compiled") else 1)


@app.command("run")
def run_cmd(tasks: str = typer.Option("smoke", help="selector: smoke | all | a category | ids, comma-separated, globs"),
            agent: str = typer.Option("reference", help="agent card name or path"),
            sandbox: str = typer.Option("local-cpu", help="sandbox profile"),
            world: Optional[int] = typer.Option(None, help="world size where a task allows it (default: each card's)"),
            max_turns: Optional[int] = typer.Option(None, "--max-turns", help="turn budget (default: the agent card's)"),
            out: Optional[Path] = typer.Option(None, help="run folder for traces and results (default: runs/<time>)")) -> None:
    """Play episodes of an agent on tasks and print verdicts, bandwidth and rewards."""
    from .agents import load_agent_card
    from .cards import select_tasks
    from .run.runner import run_tasks

    try:
        selected = select_tasks(tasks)
        card = load_agent_card(agent)
    except CommBenchError as exc:
        _fail(exc)
    if not selected:
        _fail(CommBenchError(f"no task matches {tasks!r}"))
    out = out or Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]{len(selected)} episode(s)[/] agent [cyan]{card.name}[/], sandbox [cyan]{sandbox}[/], "
                  f"traces in {out / 'traces'}")
    t0 = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        overall = progress.add_task("episodes", total=len(selected))
        turn_bar = progress.add_task("", total=None)

        def start(task) -> None:
            progress.update(turn_bar, description=f"  {task.id}: resetting", completed=0)

        def turn(n: int, info: dict) -> None:
            progress.update(turn_bar, description=f"  {info['task_id']}: turn {n} {info.get('tool', '?')} -> "
                                                  f"{info.get('verdict') or 'no verdict'}")

        def end(summary) -> None:
            progress.advance(overall)

        try:
            results = run_tasks(selected, card, sandbox=sandbox, world=world, max_turns=max_turns, out_dir=out,
                                on_episode_start=start, on_turn=turn, on_episode_end=end)
        except CommBenchError as exc:
            _fail(exc)
        progress.update(turn_bar, visible=False)
    table = Table(title="episodes")
    for col in ("task", "world", "turns", "verdict", "busbw GB/s", "size", "speedup", "band", "reward"):
        table.add_column(col, justify="right" if col not in ("task", "verdict", "band") else "left")
    for r in results:
        table.add_row(r.task_id, str(r.world_size), str(r.turns), r.verdict or "-", _fmt(r.busbw_gbps),
                      "-" if r.size_bytes is None else f"{r.size_bytes}", _fmt(r.speedup, ".2f"), r.band or "-",
                      f"{r.reward:.3f}")
    console.print(table)
    passed = sum(r.correct for r in results)
    console.print(f"[bold]summary:[/] {len(results)} episodes, pass rate {passed}/{len(results)}, mean reward "
                  f"{statistics.mean(r.reward for r in results):.3f}, {time.monotonic() - t0:.1f} s")
    (out / "results.jsonl").write_text("".join(json.dumps(r.as_dict()) + "\n" for r in results))
    console.print(f"results: {out / 'results.jsonl'}")


@app.command("eval")
def eval_cmd(agent: str = typer.Option(..., help="agent card name or path"),
             tasks: str = typer.Option("all", help="task selector: all | smoke | a category | ids | globs"),
             sandbox: str = typer.Option("local-cpu", help="sandbox profile"),
             parallel: Optional[int] = typer.Option(None, help="episodes at once; threads: default 1, capped by the "
                                                    "sandbox's GPUs; ray: default no cap (free resources decide)"),
             samples: int = typer.Option(1, help="episodes per task (for pass@k)"),
             world: Optional[int] = typer.Option(None, help="world size where a task allows it"),
             max_turns: Optional[int] = typer.Option(None, "--max-turns", help="turn budget (default: the card's)"),
             out: Path = typer.Option(..., help="run folder; re-running the same command resumes it"),
             backend: str = typer.Option("threads", help="threads (this host) | ray (a Ray cluster's nodes)"),
             ray_address: Optional[str] = typer.Option(None, "--ray-address", help="ray: the cluster to join ('auto': "
                                                       "the one `ray start` set up here); default: a one-node instance "
                                                       "on 127.0.0.1"),
             gpu_share: float = typer.Option(1.0, "--gpu-share", help="ray, cuda-shared sandboxes: the fraction of a "
                                             "GPU each episode asks for")) -> None:
    """Evaluate an agent: traces and results.jsonl in OUT; finished episodes are skipped on restart."""
    from .cards import select_tasks
    from .run.evaluation import run_eval

    ray_options = None
    try:
        selected = select_tasks(tasks)
        if backend == "ray":
            from .agents import load_agent_card
            from .run.ray_backend import RayOptions, agent_env_vars, require_ray

            require_ray()
            ray_options = RayOptions(address=ray_address, gpu_share=gpu_share, max_in_flight=parallel,
                                     env_vars=agent_env_vars(load_agent_card(agent)))
        elif backend != "threads":
            raise CommBenchError(f"--backend must be threads or ray, not {backend!r}")
    except CommBenchError as exc:
        _fail(exc)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task("episodes", total=len(selected) * samples)

        def on_event(kind: str, data: dict) -> None:
            if kind == "plan":
                progress.update(bar, completed=data["skipped"])
                if data["skipped"]:
                    console.print(f"resuming: {data['skipped']} episode(s) already done, {data['todo']} to go")
            elif kind == "done":
                progress.advance(bar)
                status = data.get("verdict") or data.get("status")
                progress.console.print(f"  {data['key']}: {status}, reward {data.get('reward', 0.0):.3f}"
                                       + (f" ({data['status']}: {data.get('error', '')[:80]})" if data["status"] != "done" else ""))
            elif kind == "stopping":
                progress.console.print("[yellow]stopping: queued episodes cancelled, playing ones closed[/]")
            elif kind == "infra_error":
                progress.console.print(f"  [yellow]{data['key']}: infrastructure error, retrying[/] ({data['error'][:100]})")

        try:
            run_eval(agent, selected, sandbox=sandbox, out=out, parallel=parallel or 1, samples=samples, world=world,
                     max_turns=max_turns, on_event=on_event, backend=backend, ray_options=ray_options)
        except CommBenchError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            progress.stop()
            err.print(f"stopped: finished episodes are in {out / 'results.jsonl'}, the others marked interrupted; "
                      "run the same command again to play only those")
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(130)  # an agent call still in flight (an LLM request) is not waited for
    console.print(f"done: {out / 'results.jsonl'}; `commbench report {out}` summarises it")


@app.command("report")
def report_cmd(runs: list[Path] = typer.Argument(..., help="one or more run folders (side by side)"),
               out: Optional[Path] = typer.Option(None, help="where report.md and the plots go (default: first run)"),
               as_json: bool = typer.Option(False, "--json", help="also write the leaderboard file, leaderboard.json "
                                            "beside report.md: metrics, per-task results, versions"),
               json_file: Optional[Path] = typer.Option(None, "--json-file", help="write the leaderboard file here "
                                                        "instead ('-': print it alone on stdout); implies --json")) -> None:
    """Leaderboard metrics of runs, recomputed from their traces, with plots and a Markdown summary."""
    from .run.report import build_report

    for r in runs:
        if not (r / "traces").is_dir():
            _fail(CommBenchError(f"{r} is not a run folder (no traces/ inside)"))
    target = out or runs[0] / "report"
    all_metrics, md, pngs = build_report(runs, target)
    if as_json or json_file is not None:
        from .run.leaderboard import write_leaderboard

        board = json_file or target / "leaderboard.json"
        text = write_leaderboard(runs, all_metrics, board)
        if str(board) == "-":
            print(text, end="")
            return
    ks = sorted({k for m in all_metrics for k in m.pass_at})
    table = Table(title="runs")
    for col in ("run", "agent", "episodes", "mean reward", "pass rate", "PASS+Good", "GM speedup", "Pass x GM",
                *[f"pass@{k}" for k in ks], "turns to pass", "tokens/ep", "cost/ep $"):
        table.add_column(col)
    for m in all_metrics:
        table.add_row(m.run, m.agent, str(m.episodes), f"{m.mean_reward:.3f}", f"{m.pass_rate:.3f}",
                      f"{m.pass_good:.3f}", f"{m.gm_speedup:.3f}", f"{m.pass_x_gm:.3f}",
                      *[f"{m.pass_at[k]:.3f}" if k in m.pass_at else "-" for k in ks],
                      _fmt(m.turns_to_first_pass, ".2f"), f"{m.tokens_per_episode:.0f}", f"{m.cost_per_episode:.4f}")
    console.print(table)
    console.print(f"written {md} and {', '.join(str(p) for p in pngs)}"
                  + (f"; leaderboard file {json_file or target / 'leaderboard.json'}" if as_json or json_file else ""))


@app.command("rows")
def rows_cmd(out: Path = typer.Option(..., help="file to write: .parquet (verl's data.train_files) or .jsonl"),
             tasks: str = typer.Option("smoke", help="task selector"),
             trainer: str = typer.Option("verl", help="verl (its RLHFDataset's columns, multi-turn) | trl"),
             world: Optional[int] = typer.Option(None, help="world size where a task allows it"),
             repeats: int = typer.Option(1, help="rows per task"),
             sandbox: str = typer.Option("local-cpu", help="tasks that cannot run in this profile are left out"),
             multi_turn: bool = typer.Option(False, "--multi-turn",
                                             help="trl: the tool-calling system prompt")) -> None:
    """Write training rows (one per task and repeat: the prompt the agent sees, the task id, the world size)."""
    from .integrations.common import task_rows, verl_rows, write_rows

    if trainer not in ("verl", "trl"):
        _fail(CommBenchError(f"--trainer must be verl or trl, not {trainer!r}"))
    try:
        if trainer == "verl":
            rows = verl_rows(tasks, sandbox=sandbox, world_size=world, repeats=repeats)
        else:
            rows = task_rows(tasks, sandbox=sandbox, world_size=world, repeats=repeats, multi_turn=multi_turn)
        if not rows:
            raise CommBenchError(f"no task of {tasks!r} runs in sandbox {sandbox!r}")
        write_rows(rows, out)
    except CommBenchError as exc:
        _fail(exc)
    console.print(f"{len(rows)} rows ({len({r.get('task') or r['extra_info']['task'] for r in rows})} tasks) "
                  f"for {trainer} written to {out}")


@app.command("serve")
def serve_cmd(host: str = typer.Option("127.0.0.1", help="address to listen on (no authentication: keep it local)"),
              port: int = typer.Option(8000, help="port; 0 picks a free one"),
              sandbox: str = typer.Option("local-cpu", help="sandbox profile every session judges in"),
              max_sessions: int = typer.Option(4, help="concurrent sessions (each with its own episode)"),
              max_sandboxes: Optional[int] = typer.Option(None, help="pooled sandboxes (default: --max-sessions)"),
              hold: str = typer.Option("episode", help="episode | turn: how long a session keeps its sandbox"),
              task: str = typer.Option("collective/allreduce_ring", help="task of a reset that names none"),
              tasks: Optional[str] = typer.Option(None, help="selector: resets that name no task draw one"),
              max_turns: int = typer.Option(8, help="turn budget per episode"),
              world: Optional[int] = typer.Option(None, help="world size (default: the task's)"),
              trace_dir: Optional[Path] = typer.Option(None, help="traces (default ~/.cache/commbench/traces)"),
              session_timeout: Optional[float] = typer.Option(None, help="close sessions idle this long (s)")) -> None:
    """Serve CommBench as an OpenEnv environment: sessions over WebSocket (/ws), reset/step/state, typed
    actions and observations, rewards computed here."""
    try:
        from .integrations.openenv_server import ServerSettings, serve

        settings = ServerSettings(sandbox=sandbox, max_sessions=max_sessions, max_sandboxes=max_sandboxes,
                                  hold=hold, task=task, tasks=tasks, max_turns=max_turns, world_size=world,
                                  trace_dir=str(trace_dir) if trace_dir else None, session_timeout_s=session_timeout)
        if host not in ("127.0.0.1", "localhost", "::1"):
            err.print(f"[yellow]warning:[/] listening on {host}: anyone who reaches this port can run code in your "
                      "sandboxes (the server has no authentication)")
        serve(settings, host, port, on_ready=lambda url: console.print(
            f"CommBench OpenEnv server on {url} (sandbox {sandbox}, {max_sessions} sessions); Ctrl-C stops it",
            soft_wrap=True))
    except (CommBenchError, ValueError) as exc:  # ValueError: a setting out of range (pydantic says which)
        _fail(exc)


@app.command("validate")
def validate_cmd(tasks: str = typer.Option("all", help="task selector"),
                 worlds: str = typer.Option("2,4", help="world sizes to check, where each task allows them"),
                 sandbox: str = typer.Option("local-cpu", help="sandbox profile"),
                 mode: str = typer.Option("check", help="check | full")) -> None:
    """Load every card and run every reference through the judge: all must pass."""
    from .cards import broken_tasks, select_tasks, selected_ids
    from .judge.host.client import JudgeClient
    from .sandbox import load_profile, open_sandbox

    try:
        mode_of_sandbox = load_profile(sandbox).device_mode
        chosen = select_tasks(tasks)
        broken = broken_tasks(ids=selected_ids(tasks)[0])  # the selection's broken cards, whatever selects them
        sizes = [int(w) for w in worlds.split(",") if w.strip()]
    except (CommBenchError, ValueError) as exc:
        _fail(exc)
    selected = [t for t in chosen if mode_of_sandbox in {m.value for m in t.card.world.device_modes}]
    skipped = [(t.id, f"runs in {', '.join(m.value for m in t.card.world.device_modes)}; sandbox {sandbox!r} is "
                      f"{mode_of_sandbox!r}") for t in chosen if t not in selected]
    skipped += [(t.id, f"world {w} is not among its sizes {t.card.world.sizes}") for t in selected for w in sizes
                if w not in t.card.world.sizes and not any(x in t.card.world.sizes for x in sizes)]
    failures = len(broken)
    table = Table(title="references")
    for col in ("task", "world", "verdict", "seconds"):
        table.add_column(col)
    with open_sandbox(sandbox) as sb, Progress(console=console, transient=True) as progress:
        client = JudgeClient(sb)
        bar = progress.add_task("validating", total=len(selected) * len(sizes))
        for t in selected:
            for w in sizes:
                progress.advance(bar)
                if w not in t.card.world.sizes:
                    continue
                res = client.evaluate(t, {t.card.entry.file: t.reference_source()}, mode, w)  # type: ignore[arg-type]
                ok = res.verdict.value == "pass"
                failures += not ok
                table.add_row(t.id, str(w), res.verdict.value if ok else f"[red]{res.verdict.value}: {res.summary[:80]}[/]",
                              f"{res.timings.total_s:.2f}")
        client.close()
    console.print(table)
    for task_id, why in skipped:
        console.print(f"skipped {task_id}: {why}", highlight=False)
    for task_id, why in broken.items():
        err.print(f"[red]broken card[/] {task_id}: {why}", highlight=False)
    console.print(f"{len(selected)} task(s) validated, {len(skipped)} skipped, {len(broken)} broken card(s)")
    if failures:
        err.print(f"[bold red]{failures} reference run(s) failed or card(s) broken[/]")
        raise typer.Exit(1)


@trace_app.command("show")
def trace_show(path: Path = typer.Argument(..., help="a trace .jsonl file"),
               source: bool = typer.Option(False, help="print the code of every turn too")) -> None:
    """Print a readable turn-by-turn summary of a trace."""
    from .trace.records import format_trace, read_trace

    try:
        print(format_trace(read_trace(path), show_source=source))
    except (OSError, ValueError) as exc:
        _fail(exc)


@app.command("view")
def view_cmd(paths: list[Path] = typer.Argument(..., help="traces, run folders or folders of runs"),
             port: int = typer.Option(0, help="port on 127.0.0.1 (0: any free one)"),
             export: Optional[Path] = typer.Option(None, "--export", help="write static pages here instead of serving")) -> None:
    """Browse episodes: a run overview (filter, sort, pages) and episode pages turn by turn."""
    from .trace.viewer import export_static, serve

    for p in paths:
        if not p.exists():
            _fail(CommBenchError(f"{p} does not exist"))
    if export:
        console.print(f"written {export_static(paths, export)} (opens from disk)")
        return
    server = serve(paths, port)
    console.print(f"serving {len(paths)} path(s) at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command("replay")
def replay_cmd(trace: Path = typer.Argument(..., help="a trace .jsonl file"),
               sandbox: Optional[str] = typer.Option(None, help="sandbox profile (default: the recorded one)"),
               turn: Optional[int] = typer.Option(None, help="replay only this turn"),
               tolerance: float = typer.Option(0.5, help="relative tolerance on benchmark times")) -> None:
    """Re-run a trace's recorded actions through the judge; say per turn whether verdict and figures match."""
    from .trace.replay import replay_trace

    try:
        task_id, turns = replay_trace(trace, sandbox=sandbox, turn=turn, tolerance=tolerance)
    except (CommBenchError, OSError, ValueError) as exc:
        _fail(exc)
    table = Table(title=f"replay of {trace.name} ({task_id})")
    for col in ("turn", "tool", "recorded", "replayed", "times us (recorded -> replayed)", "match"):
        table.add_column(col)
    for t in turns:
        figs = ", ".join(f"{s}: {a:.0f} -> {b:.0f}" for s, a, b in t.figures) or "-"
        table.add_row(str(t.turn), t.tool or "-", t.recorded or "-", t.replayed or "-", figs,
                      ("[green]yes[/]" if t.match else "[red]no[/]") + (f" ({t.note})" if t.note else ""))
    console.print(table)
    raise typer.Exit(0 if all(t.match for t in turns) else 1)


@trace_app.command("list")
def trace_list(folder: Path = typer.Argument(..., help="a run folder or a traces folder")) -> None:
    """List the traces in a folder with task, turns, verdict and reward."""
    from .trace.records import read_trace

    files = sorted(folder.rglob("*.jsonl"))
    table = Table(title=f"{len(files)} files")
    for col in ("trace", "task", "turns", "verdict", "reward"):
        table.add_column(col)
    for f in files:
        try:
            t = read_trace(f)
        except (OSError, ValueError):
            continue
        e = t.end
        table.add_row(f.name, t.task_id, str(len(t.steps)),
                      (e.final_verdict or e.status) if e else "unfinished", _fmt(e.reward if e else None))
    console.print(table)


sandbox_app = typer.Typer(no_args_is_help=True, help="Sandbox profiles, images and containers.")
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("build")
def sandbox_build(profile: str = typer.Argument(..., help="a docker profile, e.g. docker-cpu"),
                  force: bool = typer.Option(False, help="rebuild even if the image is up to date")) -> None:
    """Build the image a docker profile needs (the CPU image needs no registry)."""
    from .sandbox import load_profile
    from .sandbox.images import build_image

    try:
        prof = load_profile(profile)
        with console.status(f"building the image of {profile}") as status:
            def progress(line: str) -> None:
                status.update(f"building the image of {profile}: {line[:100]}")
                if line.startswith(("$", "Step", "debootstrap", "docker", "collecting", "base", "profile")) or "up to date" in line:
                    console.print(f"  {line[:160]}", markup=False, highlight=False)

            tag = build_image(prof, progress, force=force)
    except CommBenchError as exc:
        _fail(exc)
    console.print(f"[green]ready:[/] {tag}")


@sandbox_app.command("prune")
def sandbox_prune(all_: bool = typer.Option(False, "--all", help="remove every commbench container, not only orphans")) -> None:
    """Remove what a killed run left: commbench containers and local sandbox folders whose owner process is gone."""
    from .sandbox.local import prune_folders

    folders = prune_folders()
    console.print(f"removed {len(folders)} local sandbox folder(s)" + (f": {', '.join(folders)}" if folders else ""))
    try:
        from .sandbox.docker_backend import prune

        removed = prune(all_containers=all_)
    except (CommBenchError, ImportError) as exc:
        console.print(f"no containers looked at: {str(exc).splitlines()[0]}")
        return
    console.print(f"removed {len(removed)} container(s)" + (f": {', '.join(removed)}" if removed else ""))


@sandbox_app.command("list")
def sandboxes_cmd() -> None:
    """List sandbox profiles."""
    from .sandbox import list_profiles, load_profile

    table = Table(title="sandbox profiles")
    for col in ("name", "backend", "device mode", "description"):
        table.add_column(col)
    for name in list_profiles():
        try:
            p = load_profile(name)
            table.add_row(p.name, p.backend, p.device_mode, p.description)
        except CommBenchError as exc:
            table.add_row(name, "[red]invalid[/]", "", str(exc).splitlines()[-1])
    console.print(table)


@app.command("agents")
def agents_cmd() -> None:
    """List agent cards."""
    from .agents import list_agent_cards, load_agent_card

    table = Table(title="agent cards")
    for col in ("name", "kind", "max turns", "description"):
        table.add_column(col)
    for name in list_agent_cards():
        c = load_agent_card(name)
        table.add_row(c.name, c.kind, str(c.max_turns or "-"), c.description)
    console.print(table)


export_app = typer.Typer(no_args_is_help=True, help="Write tasks in other frameworks' formats.")
app.add_typer(export_app, name="export")


@export_app.command("harbor")
def export_harbor_cmd(out: Path = typer.Argument(..., help="folder to write one Harbor task folder per task into"),
                      tasks: str = typer.Option("all", help="task selector"),
                      sandbox: Optional[str] = typer.Option(None, help="profile the check tool and the grader use "
                                                            "(default: local-cpu, local-gpu for GPU-only tasks)"),
                      world: Optional[int] = typer.Option(None, help="world size where a task allows it"),
                      package: Optional[str] = typer.Option(None, help="pip requirement both images install "
                                                            "commbench-env from, or a wheel file to copy in "
                                                            "(default: commbench-env==<this version>)"),
                      base_image: Optional[str] = typer.Option(None, "--base-image", help="FROM of both images"),
                      oracle: bool = typer.Option(False, help="also write solution/solve.sh with the reference, for "
                                                  "Harbor's oracle agent")) -> None:
    """Harbor task folders: public statement and starter for the agent, the judge in a separate grading step."""
    from .integrations.harbor import export_harbor

    try:
        written = export_harbor(out, tasks, sandbox=sandbox, world=world, package=package, base_image=base_image,
                                oracle=oracle)
    except CommBenchError as exc:
        _fail(exc)
    console.print(f"{len(written)} Harbor task(s) in {out}; run one with: harbor run -p {written[0]} -a <agent> "
                  "-m <model>", highlight=False)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops a command the way Ctrl-C does: queued episodes cancelled, sandboxes closed, records written."""
    raise KeyboardInterrupt


def main() -> None:  # pragma: no cover
    import signal

    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
