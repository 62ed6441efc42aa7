"""Task cards: the shipped set, and validation errors that name the file and the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from commbench_env.cards import Category, load_all_tasks, load_task, select_tasks
from commbench_env.errors import CardError, NotFoundError
from commbench_env.paths import tasks_dir

REPO_TASKS = tasks_dir()


def test_at_least_16_tasks_covering_every_category():
    tasks = load_all_tasks()
    assert len(tasks) >= 16
    cats = {t.card.category for t in tasks}
    assert cats == set(Category)
    for c in Category:
        assert sum(t.card.category == c for t in tasks) >= 2, c
    assert {t.card.difficulty.value for t in tasks} >= {"easy", "medium", "hard"}


@pytest.mark.parametrize("task", [t.id for t in load_all_tasks()])
def test_card_is_complete(task):
    t = load_task(task)
    view = t.agent_view()
    assert view.isascii(), "prompts are plain ASCII (the observation space is printable ASCII)"
    for fn in t.card.entry.functions:
        assert fn in t.starter and fn in view
        if t.card.language.value == "torch":
            assert f"def {fn}" in t.starter
    if t.card.language.value == "torch" and "debugging" not in t.card.tags:  # debugging tasks start from broken code
        assert "NotImplementedError" in t.starter
    assert t.reference_source() not in view
    hidden = [c for c in t.card.cases if not c.visible]
    assert hidden and all(f"- {c.name}: shape=" not in view for c in hidden)
    assert all(f"- {c.name}: shape=" in view for c in t.card.visible_cases())
    assert t.card.performance.sizes


def _copy_task(tmp_path: Path, task_id: str) -> Path:
    dst = tmp_path / "tasks" / task_id
    shutil.copytree(REPO_TASKS / task_id, dst)
    return tmp_path / "tasks"


def _edit(base: Path, task_id: str, old: str, new: str) -> None:
    p = base / task_id / "task.toml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("old,new,field", [
    ('difficulty = "medium"', 'difficulty = "impossible"', "difficulty"),
    ('difficulty = "medium"', 'difficulty = "medium"\ncolour = "red"', "colour"),
    ('op = "all_reduce_sum"', 'op = "all_reduce_max"', "semantics.op"),
    ('dtype = "float64"', 'dtype = "float128"', "cases.1.dtype"),
    ('id = "collective/allreduce_ring"', 'id = "collective/other"', "id"),
    ('name = "odd-length"\nvisible = false\nshape = [4099]', 'name = "odd-length"\nvisible = false\nshape = [1024]', "hidden case"),
])
def test_validation_names_file_and_field(tmp_path, old, new, field):
    base = _copy_task(tmp_path, "collective/allreduce_ring")
    _edit(base, "collective/allreduce_ring", old, new)
    with pytest.raises(CardError) as exc:
        load_task("collective/allreduce_ring", base)
    msg = str(exc.value)
    assert "task.toml" in msg and field in msg


def test_bad_toml_is_reported(tmp_path):
    base = _copy_task(tmp_path, "collective/allreduce_ring")
    (base / "collective/allreduce_ring/task.toml").write_text("id = [unclosed")
    with pytest.raises(CardError, match="not valid TOML"):
        load_task("collective/allreduce_ring", base)


def test_missing_reference_is_reported(tmp_path):
    base = _copy_task(tmp_path, "collective/allreduce_ring")
    (base / "collective/allreduce_ring/reference.py").unlink()
    with pytest.raises(CardError, match="entry.reference"):
        load_task("collective/allreduce_ring", base)


def test_task_hash_changes_with_content(tmp_path):
    base = _copy_task(tmp_path, "collective/allreduce_ring")
    before = load_task("collective/allreduce_ring", base).hash
    p = base / "collective/allreduce_ring/prompt.md"
    p.write_text(p.read_text() + "\n")
    assert load_task("collective/allreduce_ring", base).hash != before


def test_selectors():
    assert [t.id for t in select_tasks("collective/allreduce_ring")] == ["collective/allreduce_ring"]
    assert all(t.id.startswith("p2p/") for t in select_tasks("p2p"))
    assert len(select_tasks("smoke")) == 5
    assert {t.card.category.value for t in select_tasks("smoke")} == {c.value for c in Category}
    assert all(t.card.difficulty.value == "easy" for t in select_tasks("all", difficulty="easy"))
    assert select_tasks("collective/*", device_mode="cpu")
    with pytest.raises(NotFoundError):
        select_tasks("nope/nothing")


def test_gpu_modes_time_with_nccl_tests_iteration_counts():
    from commbench_env.cards import PerformanceSpec

    perf = PerformanceSpec(sizes=[1024], warmup=1, iters=4)
    cpu = perf.for_device("cpu")
    assert (cpu.warmup, cpu.iters) == (1, 4)
    for mode in ("cuda", "cuda-shared"):
        gpu = perf.for_device(mode)
        assert (gpu.warmup, gpu.iters) == (5, 20)  # nccl-tests' -w 5 -n 20
    custom = PerformanceSpec(sizes=[1024], gpu_warmup=0, gpu_iters=3).for_device("cuda")
    assert (custom.warmup, custom.iters) == (0, 3)


def test_the_statement_says_what_a_forbidden_preset_covers():
    from commbench_env.cards import load_task

    text = load_task("ep/expert_rebalance").agent_view()
    line = next(ln for ln in text.splitlines() if ln.startswith("- Forbidden:"))
    assert "@collectives (torch.distributed.all_reduce/" in line and "all_to_all_single" in line
    assert "anything in torch.distributed.nn" in line
    assert "Tolerance:" in text and "Integer and bool outputs must be exact" in text
    hinted = load_task("ep/expert_rebalance").agent_view(hints=True)
    assert "## Hints" in hinted and "## Hints" not in text


def test_a_roofline_bound_below_one_needs_its_reason_and_is_shown_with_the_figures():
    from commbench_env.cards import PerformanceSpec
    from commbench_env.judge.host.result import JudgeResult, Roofline, SizeResult, Verdict

    with pytest.raises(ValueError, match="roofline_bound below 1 needs a roofline_reason"):
        PerformanceSpec(sizes=[1024], roofline_bound=0.5)
    size = SizeResult(size_bytes=1024, dtype="float32", count=256, iters=1, warmup=0, time_us=1.0,
                      time_us_median=1.0, time_us_min=1.0, per_rank_mean_us=[1.0], algbw_gbps=1.0, busbw_gbps=1.0,
                      roofline_gbps=200.0, roofline_pct=0.5)
    res = JudgeResult(task_id="t", task_hash="h", mode="benchmark", world_size=2, device_mode="cuda-shared",
                      verdict=Verdict.passed, benchmark=[size], roofline_bound=0.5,
                      roofline_reason="an LL line stores 8 bytes per 4 of data",
                      roofline=Roofline(name="device copy", gbps=800.0, per_rank_gbps=400.0, emulated=True))
    assert "this task's bound is 0.5 of it (an LL line stores 8 bytes per 4 of data)" in res.feedback()


def test_a_roofline_bound_can_depend_on_the_world_size_and_must_name_every_world():
    from commbench_env.cards import PerformanceSpec, load_task

    perf = PerformanceSpec(sizes=[1024], roofline_bound={2: 0.667, 4: 0.4}, roofline_reason="x and recv are moved")
    assert perf.bound_at(2) == 0.667 and perf.bound_at(4) == 0.4
    assert perf.bound_at(3) == 0.667 and perf.bound_at(16) == 0.4  # a world the table does not name: the nearest
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\]"):
        PerformanceSpec(sizes=[1024], roofline_bound={2: 1.5}, roofline_reason="r")
    with pytest.raises(ValueError, match="needs a roofline_reason"):
        PerformanceSpec(sizes=[1024], roofline_bound={2: 1.0, 4: 0.5})
    with pytest.raises(ValueError, match="empty table"):
        PerformanceSpec(sizes=[1024], roofline_bound={})
    card = load_task("ep/dispatch_cuda").card
    assert [card.performance.bound_at(w) for w in card.world.sizes] == [0.667, 0.4, 0.222]
    data = card.model_dump()
    data["performance"]["roofline_bound"] = {2: 0.667, 4: 0.4}  # world 8 missing
    with pytest.raises(ValueError, match=r"names worlds \[2, 4\] but not \[8\]: give a bound for every world"):
        type(card).model_validate(data)


def test_an_evaluation_reports_the_bound_of_its_own_world_size(evaluate, tmp_path):
    """A card's per-world bound reaches the result of each world's evaluation and the figures it explains."""
    import shutil

    from commbench_env.cards import load_task_dir
    from commbench_env.paths import tasks_dir
    from commbench_env.judge.host.result import Verdict

    root = tmp_path / "collective" / "allreduce_ring"
    shutil.copytree(tasks_dir() / "collective" / "allreduce_ring", root)
    card = root / "task.toml"
    table = "{ " + ", ".join(f"{w} = {1 / w:g}" for w in range(2, 9)) + " }"
    card.write_text(card.read_text().replace("[performance]\n", f"[performance]\nroofline_bound = {table}\n"
                                             'roofline_reason = "a test bound of 1 / world"\n'))
    task = load_task_dir(root)
    for world in (2, 4):
        res = evaluate(task, mode="benchmark", world=world)
        assert res.verdict == Verdict.passed, res.feedback()
        assert res.roofline_bound == 1 / world


def test_a_link_model_a_card_names_must_be_a_preset():
    from commbench_env.cards import PerformanceSpec

    with pytest.raises(ValueError, match="'infiniband' is not a preset; choose one of"):
        PerformanceSpec(sizes=[1024], link_model="infiniband")
    assert PerformanceSpec(sizes=[1024], link_model="host-posted-cluster").link_model == "host-posted-cluster"
