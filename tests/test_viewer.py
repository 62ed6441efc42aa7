"""The trace viewer's server and static export, against real traces (HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from commbench_env.agents.base import AgentCard
from commbench_env.cards import select_tasks
from commbench_env.run.evaluation import run_eval
from commbench_env.trace.viewer import EpisodeIndex, export_static, serve

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    card = AgentCard(name="reference", kind="reference", max_turns=4,
                     params={"plan": ["check:starter", "check:reference", "submit:reference"]})
    run_eval(card, select_tasks("p2p/ring_shift,collective/allreduce_ring"), sandbox="local-cpu", out=out, world=2)
    return out


def get(server, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=30) as r:
        return r.status, r.read()


def test_server_lists_filters_sorts_and_shows_episodes(run_dir):
    server = serve([run_dir], background=True)
    try:
        status, page = get(server, "/")
        assert status == 200 and b"CommBench-Env traces" in page
        _, body = get(server, "/api/episodes?limit=10")
        data = json.loads(body)
        assert data["total"] == 2 and {r["task"] for r in data["rows"]} == {"p2p/ring_shift", "collective/allreduce_ring"}
        _, body = get(server, "/api/episodes?q=ring_shift")
        rows = json.loads(body)["rows"]
        assert [r["task"] for r in rows] == ["p2p/ring_shift"]
        _, body = get(server, f"/api/episode/{rows[0]['id']}")
        ep = json.loads(body)
        turns = ep["turns"]
        assert [t["verdict"] for t in turns] == ["runtime_error", "pass", "pass"]
        assert "+" in turns[1]["diff"] and "NotImplementedError" in turns[1]["diff"]  # the starter line removed
        assert turns[2]["benchmark"] and turns[2]["reward"] > 0.5
        with pytest.raises(urllib.error.HTTPError):
            get(server, "/api/episode/nope")
    finally:
        server.shutdown()
        server.server_close()


def test_static_export_embeds_everything(run_dir, tmp_path):
    index = export_static([run_dir], tmp_path / "site")
    html = index.read_text()
    assert 'src="data/episodes.js"' in html and "fetch(" in html  # fetch only when served, scripts when static
    data = (tmp_path / "site" / "data" / "episodes.js").read_text()
    assert data.startswith("window.COMMBENCH_STATIC") and "allreduce_ring" in data
    assert len(list((tmp_path / "site" / "data").glob("ep-*.js"))) == 2


def test_index_of_many_episodes_pages_quickly(tmp_path, run_dir):
    """5,000 episodes: the overview is served a page at a time."""
    src = next((run_dir / "traces").glob("*.jsonl")).read_text()
    big = tmp_path / "big" / "traces"
    big.mkdir(parents=True)
    for i in range(5000):
        (big / f"e{i}.jsonl").write_text(src)
    t0 = time.monotonic()
    index = EpisodeIndex([tmp_path / "big"])
    built = time.monotonic() - t0
    page = index.page(offset=4900, limit=100, query="ring", sort="reward", descending=True)
    assert page["total"] == 5000 and len(page["rows"]) == 100
    print(f"indexed 5000 episodes in {built:.1f} s")
