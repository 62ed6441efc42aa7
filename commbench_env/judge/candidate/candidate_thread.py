"""Candidate code runs on a thread of its own, never on the harness's.

Why: any frame reaches every frame below it (`sys._getframe(n)`, `frame.f_back`, a traceback's `tb_frame`), and
the harness's frames hold what the candidate must never touch: the channel to the coordinator, the timing marks,
the seeds and staged inputs of later calls, the sandbox's state. A new thread's stack starts empty, so candidate
frames reach only `_serve` below them, whose locals carry no judge state; the frames of other threads are reachable
only through `sys._current_frames`, which the audit hook refuses (guard.py). Nothing the candidate hands back (an
exception, a result) is trusted or formatted on the harness's thread: exceptions become text on this thread.

Completion is read from the thread itself: a candidate can release `_serve`'s lock early to stop the clock while it
keeps working, so the harness believes a call ended only once the thread's top frame is `_park` called from the one
`_serve` frame the thread has had since it started.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

MAX_FRAMES = 8
THREAD_GRACE_S = 0.05
LEFT_THREAD_EXIT_CODE = 86
LEFT_THREAD_MESSAGE = (b"CommBench: the submission left a thread running after its call returned; join every thread "
                       b"you start before returning (the rank was stopped)\n")


class CandidateRaised(Exception):
    """The candidate's call raised; `text` is its traceback (candidate frames only), made on the candidate thread."""

    def __init__(self, text: str, denied: bool):
        super().__init__(text)
        self.text, self.denied = text, denied


def candidate_traceback(exc: BaseException, filename: str) -> str:
    """The traceback of `exc` limited to frames of the candidate's file: harness frames are not the agent's business."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    lines = ["Traceback (candidate frames only):"]
    for f in frames[-MAX_FRAMES:]:
        lines.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line}")
    lines.append(f"{type(exc).__name__}: {exc}")
    return "\n".join(lines)


def _park(go: Any, done: Any) -> None:
    """Where the candidate thread says the last job is over and waits for the next (its frame is how the harness
    knows the thread is idle)."""
    done.release()
    go.acquire()


def _serve(go: Any, done: Any, box: list, filename: str) -> None:
    """The whole stack below the candidate's frames: wait for a job, run it, describe how it ended, repeat."""
    while True:
        _park(go, done)
        try:
            box[1], box[2] = box[0](), None
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything, SystemExit included
            try:
                text = candidate_traceback(exc, filename)
            except BaseException:  # noqa: BLE001 - a hostile exception may refuse to be printed
                text = "the candidate raised an exception that cannot be printed"
            box[1], box[2] = None, (text, isinstance(exc, PermissionError))
        box[0] = None


def start(filename: str, settle: Callable[[], None], prepare: Callable[[], None] | None = None) -> Callable[..., Any]:
    """Start the candidate thread and return `run(job)`, which runs `job()` there and returns its result.

    When a job ends, `run` waits until the thread is parked back in `_serve` and exits the process if the candidate
    left a thread of its own running (it could change the harness's namespaces while the harness works). `run` is a
    closure over locals only, because after candidate code has run the harness must look up no module global and no
    class attribute before it calls `settle` (integrity.py: put back what the candidate changed). The caller settles
    once its clock has stopped; `run` settles itself only before raising the candidate's exception. `prepare` runs
    first on the new thread (the current CUDA device is per thread)."""
    go, done = _thread.allocate_lock(), _thread.allocate_lock()
    go.acquire()
    done.acquire()
    box: list = [None, None, None]
    thread = threading.Thread(target=_serve, args=(go, done, box, filename), name="candidate", daemon=True)
    thread.start()
    ident, park_code, current_frames = thread.ident, _park.__code__, sys._current_frames
    sleep, monotonic = time.sleep, time.monotonic
    threads_alive, write, exit_now = _thread._count, os.write, os._exit
    baseline = threads_alive()
    type_of, tuple_type, str_type, bool_type, length, raised = type, tuple, str, bool, len, CandidateRaised
    go_locked, done_acquire = go.locked, done.acquire
    serve_frame = None  # the thread's one _serve frame, once seen

    def wait_parked() -> None:
        nonlocal serve_frame
        polls = 0
        while True:
            frame = current_frames().get(ident)
            if (frame is not None and frame.f_code is park_code and go_locked()
                    and (serve_frame is None or frame.f_back is serve_frame)):
                serve_frame = frame.f_back
                return
            polls += 1
            sleep(0 if polls < 1000 else 0.0002)  # sleep(0) hands the interpreter to the candidate thread

    done_acquire()
    wait_parked()  # the thread's own _serve frame, recorded before any candidate code exists

    def run(job: Callable[[], Any]) -> Any:
        box[0] = job
        go.release()
        done_acquire()
        wait_parked()  # believe the end only once the thread is idle again in its own _serve
        done_acquire(False)  # a candidate that released `done` early left it released once more: take that back
        deadline = monotonic() + THREAD_GRACE_S
        while threads_alive() > baseline:  # a thread the candidate started and has just joined may linger briefly
            if monotonic() > deadline:
                write(2, LEFT_THREAD_MESSAGE)
                exit_now(LEFT_THREAD_EXIT_CODE)
            sleep(0.0005)
        result, failure = box[1], box[2]
        box[1] = box[2] = None
        if failure is not None:
            settle()
            text, denied = failure if type_of(failure) is tuple_type and length(failure) == 2 else ("", False)
            raise raised(text if type_of(text) is str_type else "the candidate raised an exception",
                         denied if type_of(denied) is bool_type else False)
        return result

    if prepare is not None:
        run(prepare)
        settle()
    return run
