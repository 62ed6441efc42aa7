"""Trace records are typed models shared by the writer (the episode core) and every reader: what is written reads
back as the same objects, a broken record is an error naming its file and line, and odd agent meta never costs a
turn."""

from __future__ import annotations

import json

import pytest

from commbench_env.cards import load_task
from commbench_env.episode import Episode
from commbench_env.judge.host.result import JudgeResult
from commbench_env.trace.records import (EpisodeEnd, EpisodeStart, TraceAction, TraceStep, TraceWriter,
                                         format_trace, read_trace)

TASK = "p2p/ring_shift"


def test_what_is_written_reads_back_as_the_same_records(tmp_path):
    path = tmp_path / "t.jsonl"
    start = EpisodeStart(task_id=TASK, task_hash="h", agent={"name": "a"}, config={"world_size": 3})
    result = JudgeResult(task_id=TASK, task_hash="h", mode="check", world_size=3, device_mode="cpu",
                         verdict="wrong_answer", summary="case 2 differs")
    step = TraceStep(turn=1, action=TraceAction(tool="check", files={"solution.py": "x = 1\n"}), judge_result=result,
                     observation="feedback")
    end = EpisodeEnd(status="finished", reward=0.0, episode_return=0.0, turns=1, final_verdict="wrong_answer")
    w = TraceWriter(path)
    for rec in (start, step, end):
        w.write(rec)
    w.close()
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert raw[0]["schema"] == "commbench-trace/1" and "return" in raw[2]  # the on-disk names stay the schema's
    t = read_trace(path)
    assert t.start == start and t.steps == [step] and t.end == end
    assert t.start.world_size == 3 and t.steps[0].verdict == "wrong_answer"
    assert "turn 1: check" in format_trace(t) and "case 2 differs" in format_trace(t)


def test_a_broken_record_names_its_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "episode_start", "schema": "commbench-trace/1", "task_id": TASK}) + "\n"
                    + json.dumps({"type": "step", "turn": "first"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: not a valid step record \(turn"):
        read_trace(path)


def test_a_trace_of_another_schema_is_refused(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"type": "episode_start", "schema": "commbench-trace/0", "task_id": TASK}) + "\n")
    with pytest.raises(ValueError, match="schema 'commbench-trace/0'"):
        read_trace(path)


def test_meta_that_is_not_usage_is_kept_and_the_turn_recorded(tmp_path):
    ep = Episode(task=TASK, max_turns=2, world_size=2, trace_dir=str(tmp_path))
    try:
        ep.start()
        out = ep.step({"tool": "compile", "source": load_task(TASK).reference_source(),
                       "meta": {"tokens_in": "many", "message": 7, "note": {"nested": [1, 2]}}})
        assert out.turn == 1
        meta = read_trace(ep.trace_path).steps[0].meta
        assert meta.tokens_in == 0 and meta.model_extra["agent_tokens_in"] == "many"
        assert meta.model_extra["note"] == {"nested": [1, 2]}
    finally:
        ep.close()
