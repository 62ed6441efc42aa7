"""The viewer in a real headless browser (Debian's chromium driven by Playwright): open a run, filter, open an
episode, step through turns, see the diff, the mismatch and the plot; the exported pages open from disk."""

from __future__ import annotations

import os
import shutil

import pytest

from commbench_env.cards import load_task
from commbench_env.episode.gym_env import CommBenchEnv
from commbench_env.trace.viewer import export_static, serve

from .conftest import SUBMISSIONS

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _browser_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if not CHROMIUM or sync_playwright is None:
        why = "needs chromium and the playwright package"
        if os.environ.get("COMMBENCH_REQUIRE_BROWSER"):
            pytest.fail(why + " (COMMBENCH_REQUIRE_BROWSER is set)")
        pytest.skip(why)
    return sync_playwright


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Two episodes: ring_shift with a wrong first try (a mismatch), then the fix and a submit; and a plain one."""
    out = tmp_path_factory.mktemp("browser-run")
    task = load_task("p2p/ring_shift")
    env = CommBenchEnv(task=task, world_size=3, max_turns=4, trace_dir=str(out / "traces"))
    try:
        env.reset()
        env.step({"tool": "check", "source": (SUBMISSIONS / "p2p" / "ring_shift" / "wrong.py").read_text()})
        env.step({"tool": "check", "source": task.reference_source()})
        env.step({"tool": "submit", "source": ""})
        env.reset(options={"task": "utility/barrier_p2p", "world_size": 2})
        env.step({"tool": "submit", "source": load_task("utility/barrier_p2p").reference_source()})
    finally:
        env.close()
    return out


def test_browse_a_run(run_dir, tmp_path):
    sync_playwright = _browser_or_skip()
    server = serve([run_dir], background=True)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.goto(url)
            page.wait_for_selector("tr.row")
            assert page.locator("tr.row").count() == 2
            page.fill("#q", "ring_shift")
            page.wait_for_function("document.querySelectorAll('tr.row').length === 1")
            page.screenshot(path=str(tmp_path / "overview.png"))
            page.click("tr.row")
            page.wait_for_selector("#verdict")
            assert page.inner_text("#verdict") == "wrong_answer"
            assert "rank" in page.inner_text("#mismatch") and "expected" in page.inner_text("#mismatch")
            assert page.locator("#plot polyline").count() == 2
            page.click("#n")
            page.wait_for_function("document.querySelector('#verdict').innerText === 'pass'")
            diff = page.inner_text("#diff")
            lines = diff.splitlines()
            assert any(ln.startswith("-") and "(rank - 1) % world), dist.irecv" in ln for ln in lines)  # bug removed
            assert any(ln.startswith("+") and "batch_isend_irecv" in ln for ln in lines)  # the fix added
            page.click("#n")
            assert "Submitted. Reward" in page.inner_text("#feedback")
            assert "reference us" in page.inner_text("#bench")  # figures against the reference, per size
            assert "of roofline" in page.inner_text("#bench")  # and against the roofline (none on CPU)
            assert "the link model h200-nvswitch" in page.inner_text("#roofline")  # CPU figures are modelled
            page.screenshot(path=str(tmp_path / "episode.png"))
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert (tmp_path / "episode.png").stat().st_size > 10_000


def test_exported_pages_open_from_disk(run_dir, tmp_path):
    sync_playwright = _browser_or_skip()
    index = export_static([run_dir], tmp_path / "site")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(index.as_uri())
        page.wait_for_selector("tr.row")
        page.fill("#q", "barrier")
        page.wait_for_function("document.querySelectorAll('tr.row').length === 1")
        page.click("tr.row")
        page.wait_for_selector("#verdict")
        assert page.inner_text("#verdict") == "pass"
        browser.close()


def test_an_emulated_all_gather_turn_says_why_busbw_cannot_reach_the_whole_share(run_dir, tmp_path):
    """A GPU trace cannot be made here, so the ring_shift episode's benchmarked turns are given the roofline a
    cuda-shared all-gather at world 2 gets: 1000 GB/s per rank, of which busbw can reach 500."""
    import json

    sync_playwright = _browser_or_skip()
    src = next(p for p in (run_dir / "traces").glob("*.jsonl") if "ring_shift" in p.name)
    records = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    for rec in records:
        jr = rec.get("judge_result") or {}
        if jr.get("benchmark"):
            jr["device_mode"] = "cuda-shared"
            jr["roofline"] = {"name": "device copy bandwidth (cuda-shared: emulated, not NVLink)", "gbps": 2000.0,
                              "per_rank_gbps": 1000.0, "emulated": True}
            for b in jr["benchmark"]:
                b["roofline_gbps"], b["roofline_pct"] = 500.0, 88.0
                b["modelled"] = None  # GPU figures are measured, never modelled
    run = tmp_path / "gpu-run" / "traces"
    run.mkdir(parents=True)
    (run / src.name).write_text("".join(json.dumps(r) + "\n" for r in records))
    server = serve([run.parent], background=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
            page.wait_for_selector("tr.row")
            page.click("tr.row")
            page.wait_for_selector("#verdict")
            page.click("#n")
            page.click("#n")
            page.wait_for_selector("#roofline")
            text = page.inner_text("#roofline")
            assert "1000 GB/s per rank" in text and "busbw can reach only 500 GB/s per rank" in text, text
            assert "88%" in page.inner_text("#bench")
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
