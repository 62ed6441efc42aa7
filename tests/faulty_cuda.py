"""Broken CUDA kernels the judge must catch, made from the task references by one planted bug each.

Kept as edits of the references, not as copies, so a reference change carries over. Used by
tests/test_cuda_tasks.py (they must build everywhere) and benchmarks/gpu_feedback_demo.py (on a GPU: wrong
answers, a memcheck finding, a named hung rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from commbench_env.cards import load_task


@dataclass(frozen=True)
class Fault:
    task: str
    name: str
    bug: str
    edits: tuple[tuple[str, str], ...]  # (text in the reference, its replacement); each must occur exactly once

    def source(self) -> str:
        text = load_task(self.task).reference_source()
        for old, new in self.edits:
            if text.count(old) != 1:
                raise ValueError(f"{self.task} reference: {old!r} occurs {text.count(old)} times; update {self.name}")
            text = text.replace(old, new)
        return f"// Faulty on purpose ({self.bug}). BUG marks the change.\n{text}"


FAULTS = {f.name: f for f in (
    Fault("p2p/ipc_pull_copy", "off_by_one_peer", "off-by-one in the peer index: pulls from rank - 2", (
        ("const int left = (args->rank - 1 + args->world) % args->world;",
         "const int left = (args->rank - 2 + 2 * args->world) % args->world;  // BUG: should be rank - 1"),)),
    Fault("p2p/ipc_pull_copy", "out_of_bounds", "copies 64 bytes past the peer's input and its own output", (
        ("const int64_t nbytes = args->count * esz;", "const int64_t nbytes = args->count * esz + 64;  // BUG"),)),
    Fault("p2p/ipc_pull_copy", "deadlock", "rank 0 waits for a flag that no rank ever sets", (
        ("pull_kernel(char* dst, const char* src, int64_t nbytes) {",
         ("pull_kernel(char* dst, const char* src, int64_t nbytes, volatile uint32_t* wait_flag) {\n"
          "  if (wait_flag != nullptr) while (*wait_flag == 0) {  // BUG: nobody ever sets it\n  }")),
        ("static_cast<const char*>(args->peer_in[left]), nbytes);",
         "static_cast<const char*>(args->peer_in[left]), nbytes, args->rank == 0 ? args->flags : nullptr);"))),
    Fault("collective/allreduce_twoshot", "no_wait_race", "a race: the two-shot without its wait for the peers", (
        ("    while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {\n    }",
         "    (void)f;  // BUG: no wait, so peers' slices are read before they are reduced"),)),
    Fault("utility/vector_copy_widths", "tail_word_overrun",
          "the body rounds up: its last 16-byte store spills past the window", (
        ("const int64_t nb = (nbytes - head) / 16;",
         "const int64_t nb = (nbytes - head + 15) / 16;  // BUG: should round down"),)),
    Fault("utility/tma_bulk_copy", "stale_stage_phase",
          "waits on the wrong mbarrier phase: a reused stage is read before its new rows land", (
        ("mbar_wait(smem_u32(&bar[s]), static_cast<uint32_t>((i / kStages) & 1));",
         "mbar_wait(smem_u32(&bar[s]), 0u);  // BUG: should be parity (i / kStages) & 1"),)),
)}
