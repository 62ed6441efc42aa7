"""CUDA tasks on a machine without a GPU: every reference and starter builds through the judge's compile mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from commbench_env.cards import load_all_tasks
from commbench_env.judge.host.result import Verdict

from .faulty_cuda import FAULTS

CUDA_TASKS = [t.id for t in load_all_tasks() if t.card.language.value == "cuda"]
pytestmark = pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")


def _mode(task_id: str) -> str:
    from commbench_env.cards import load_task

    return load_task(task_id).card.world.device_modes[0].value


@pytest.mark.parametrize("task", CUDA_TASKS)
@pytest.mark.parametrize("which", ["reference", "starter"])
def test_cuda_sources_compile(evaluate, task, which):
    from commbench_env.cards import load_task

    t = load_task(task)
    source = t.reference_source() if which == "reference" else t.starter
    res = evaluate(task, source, mode="compile", device_mode=_mode(task))
    assert res.verdict == Verdict.compiled, res.feedback()
    assert res.compile.ok and any("registers" in ln for ln in res.compile.log.splitlines())


def test_there_are_cuda_tasks():
    assert len(CUDA_TASKS) >= 8


def test_compile_error_feedback_has_line_numbers(evaluate):
    task = CUDA_TASKS[0]
    from commbench_env.cards import load_task

    t = load_task(task)
    broken = t.starter + "\n__global__ void oops() { int x = ; }\n"
    res = evaluate(task, broken, mode="compile", device_mode=_mode(task))
    assert res.verdict == Verdict.compile_error
    line = len(t.starter.splitlines()) + 2
    assert f"solution.cu({line})" in res.compile.log, res.compile.log


def test_unchanged_source_is_a_cache_hit(evaluate):
    task = CUDA_TASKS[0]
    from commbench_env.cards import load_task

    t = load_task(task)
    evaluate(task, t.reference_source(), mode="compile", device_mode=_mode(task))
    again = evaluate(task, t.reference_source(), mode="compile", device_mode=_mode(task))
    assert again.compile.cache_hit and again.compile.seconds < 0.1


def test_check_without_a_gpu_is_a_clear_error(evaluate):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from commbench_env.errors import UnservableError

    task = CUDA_TASKS[0]
    with pytest.raises(UnservableError, match=r"needs \d NVIDIA GPU.*sees 0.*local-gpu"):
        evaluate(task, mode="check", device_mode=_mode(task))  # said before anything runs, never a verdict


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_faulty_cuda_submissions_compile(evaluate, name):
    """The kernels benchmarks/gpu_feedback_demo.py shows being caught on a GPU must at least build everywhere."""
    fault = FAULTS[name]
    source = fault.source()
    assert "BUG" in source  # the planted change is marked
    res = evaluate(fault.task, source, mode="compile", device_mode=_mode(fault.task))
    assert res.verdict == Verdict.compiled, res.feedback()


_GPU_ATTACK_DIR = Path(__file__).parent / "attacks" / "cuda"
GPU_ATTACKS = sorted([*_GPU_ATTACK_DIR.glob("*.cu"), *_GPU_ATTACK_DIR.glob("*.py")])


def attack_header(path: Path, key: str) -> str:
    """A `// KEY: value` (CUDA) or `# KEY: value` (Python) line of a GPU attack file (TASK, EXPECT)."""
    for line in path.read_text().splitlines():
        if line.startswith((f"// {key}:", f"# {key}:")):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{path.name} has no '{key}:' line")


def test_gpu_attack_files_are_found():
    assert {p.suffix for p in GPU_ATTACKS} == {".cu", ".py"}


@pytest.mark.parametrize("path", GPU_ATTACKS, ids=lambda p: p.name)
def test_gpu_attacks_pass_the_build(evaluate, path):
    """They run only on GPUs (benchmarks/gpu_stream_checks.py); here they must get through the judge's build (nvcc
    and the symbol check, or the static check): an attack the build already rejects would show nothing there."""
    task = attack_header(path, "TASK")
    assert attack_header(path, "EXPECT") in ("timed", "open")
    res = evaluate(task, path.read_text(), mode="compile", device_mode=_mode(task))
    assert res.verdict == Verdict.compiled, res.feedback()
