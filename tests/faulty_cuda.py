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
    Fault("p2p/put_with_signal", "no_signal_wait",
          "a race: the receiver reads its scratch without waiting for the sender's signal", (
        ("        while (seen < need) seen = ld_acquire_sys(a.recv_signal + warp);",
         "        (void)need;  // BUG: no wait, so the payload is read before it has arrived"),)),
    Fault("p2p/credit_ring_buffer", "no_credit_wait",
          "the producer refills ring slots without waiting for the consumer's credits", (
        ("          while (seen < need) seen = ld_acquire_sys(a.recv_credit + c);",
         "          (void)need;  // BUG: no credit wait, so slots are overwritten before they were read"),)),
    Fault("collective/allreduce_ll_small", "constant_ll_flag",
          "LL lines carry a constant flag instead of the epoch: lines left by an earlier call look fresh", (
        ("const uint64_t tag = static_cast<uint64_t>(a.epoch) << 32;",
         "const uint64_t tag = 1ull << 32;  // BUG: should carry args->epoch"),
        ("line_ready(v[u][s], a.epoch)", "line_ready(v[u][s], 1u)"))),
    Fault("p2p/bulk_async_peer_copy", "no_barrier_before_bulk_store",
          "a race: the shifted chunk is bulk-stored before the other threads have written it", (
        ("        __syncthreads();           // every thread has read stage[s] and written sendbuf[o]",
         "        // BUG: no __syncthreads(), so thread 0 stores sendbuf[o] while it is still being written"),)),
    Fault("fusion/allgather_gemm_tiles", "wrong_source_slot",
          "multiplies the rows of the next rank's slot instead of the source's: wrong rows in every peer block", (
        ("xs = reinterpret_cast<const uint16_t*>(a.scratch[a.rank] + s * a.slot_bytes);",
         "xs = reinterpret_cast<const uint16_t*>(a.scratch[a.rank] + ((s + 1) % a.world) * a.slot_bytes);  // BUG"),)),
    Fault("fusion/gemm_reduce_scatter", "partials_in_16_bits",
          "partials are rounded to the data type before the cross-rank sum: off by more than the tolerance", (
        ("=\n              *reinterpret_cast<const float4*>(cs + r * CS_LD + cc);",
         "=\n              round_to_16_bits<T>(*reinterpret_cast<const float4*>(cs + r * CS_LD + cc));  // BUG: float32"),
        ("struct RsArgs {",
         "template <typename T>\n__device__ __forceinline__ float4 round_to_16_bits(float4 v) {\n"
         "  const auto q = [](float f) { return static_cast<float>(T(f)); };  // rounded to T and back\n"
         "  return make_float4(q(v.x), q(v.y), q(v.z), q(v.w));\n}\n\nstruct RsArgs {"))),
    Fault("ep/router_topk_layout", "ticket_never_reset",
          "the last-block ticket counter is not reset: from the second call on no block publishes the counts", (
        ("  if (tid == 0) atomicExch(a.ticket, 0u);  // every block has taken its ticket: ready for the next call",
         "  // BUG: the ticket counter is left at gridDim.x, so the next call never finds its last block"),)),
    Fault("ep/fp8_dispatch", "scale_by_reciprocal",
          "the scale is amax times a rounded 1 / 448, not the correctly rounded division the contract defines", (
        ("        const float scale = amax / 448.0f;",
         "        const float scale = amax * (1.0f / 448.0f);  // BUG: not amax / 448 in float32"),)),
    Fault("ep/deterministic_slots", "atomic_slot_claim",
          "claims each entry's row with an atomic counter per expert: the right rows in a scheduling-dependent order", (
        ("        int s = base[e] + __popc(wmask[warp][e] & below);\n"
         "        for (int w = 0; w < warp; ++w) s += __popc(wmask[w][e]);\n",
         "        const int s = atomicAdd(&base[e], 1);  // BUG: a valid row, but not the token's stable rank\n"
         "        (void)below;\n"),)),
    Fault("ep/notify_counts", "epoch_not_checked",
          "accepts any non-zero word: from the second call on a rank may read the previous call's counts", (
        ("    while (static_cast<uint32_t>(w >> 32) != a.epoch) w = ld_word(mine + q);",
         "    while ((w >> 32) == 0) w = ld_word(mine + q);  // BUG: a word of the previous call also passes"),)),
    Fault("collective/alltoall_ll", "assumes_aligned_blocks",
          "moves 8-byte words whatever the block size: odd-sized blocks are accessed misaligned and past their end", (
        ("  if (block % 8 == 0) ll_alltoall_kernel<8><<<g, kThreads, 0, stream>>>(k);",
         "  if (block > 0) ll_alltoall_kernel<8><<<g, kThreads, 0, stream>>>(k);  // BUG: needs block % 8 == 0"),)),
    Fault("collective/alltoallv_ipc", "no_count_wait",
          "reads the count table without waiting for the count flags: offsets from zeros or from the previous call", (
        ("    while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {\n    }",
         "    (void)f;  // BUG: no wait, so the peers' counts may not have arrived"),)),
    Fault("collective/reduce_to_root", "ragged_end_dropped",
          "the last slice stops at the last whole 16-byte pack: the tail of an odd-sized tensor stays NaN", (
        ("const int64_t rest = idx == reducers - 1 ? n - all * N : 0;",
         "const int64_t rest = 0;  // BUG: the last slice must take the ragged end"),)),
    Fault("ep/low_latency_combine_cuda", "masked_weights_counted",
          "adds weight x 0 for masked entries instead of skipping them: their NaN weights poison the token's row", (
        ("          ok[jj] = false;\n          wt[jj] = 0.f;",
         "          ok[jj] = j < k;  // BUG: masked entries are not skipped\n"
         "          wt[jj] = j < k ? __ldg(a.weights + i * k + j) : 0.f;\n          v[jj].w = Wd{};"),
        ("              ok[jj] = true;\n", ""))),
    Fault("ep/expert_migration_cuda", "old_slot_from_new_slot",
          "copies the old owner's slot j instead of the expert's old slot: wrong experts wherever slots change", (
        ("const int p = src / a.k, slot = src - p * a.k;",
         "const int p = src / a.k, slot = j;  // BUG: should be src - p * a.k"),)),
    Fault("p2p/halo_exchange_2d_cuda", "corners_from_edge_neighbours",
          "fills the four h x h corners from the tile above or below instead of the diagonal neighbour", (
        ("  nb = di * 3 + dj;\n",
         "  nb = (di == 1 || dj == 1) ? di * 3 + dj : di * 3 + 1;  // BUG: corners need the diagonal tile\n"),)),
    Fault("p2p/peer_gather_indexed", "padding_fetches_row_zero",
          "an id of -1 fetches global row 0 instead of writing a zero row", (
        ("    const int64_t id = __ldg(a.ids + m);",
         "    const int64_t id = __ldg(a.ids + m) < 0 ? 0 : __ldg(a.ids + m);  // BUG: -1 must give zeros"),)),
    Fault("utility/grid_barrier_epoch", "barrier_does_not_wait",
          "the grid barrier counts the arrivals but never waits: blocks read maxima and w values not yet written", (
        ("    while (((ld_acquire_gpu(bar) ^ old) & 0x80000000u) == 0) {\n    }",
         "    (void)old;  // BUG: no wait for the last block's arrival"),)),
    Fault("utility/cross_rank_scan", "lower_totals_not_awaited",
          "adds the lower ranks' totals without waiting for their flags: offsets from zeros or the previous call", (
        ("      while (!reached(ld_acquire_sys(P.total_flags[lane]), P.epoch)) {\n      }",
         "      (void)reached;  // BUG: no wait for the lower rank's total"),)),
    Fault("fusion/dispatch_grouped_gemm", "no_chunk_wait",
          "multiplies a tile without waiting for the chunk flags of its tokens: rows from peers not yet arrived", (
        ("    for (int64_t c = ca + tid; c <= cb; c += THREADS) wait_flag(chunk_flags + c, a.epoch);",
         "    (void)ca, (void)cb, (void)chunk_flags;  // BUG: no wait for the tokens' chunks"),)),
    Fault("p2p/copy_engine_or_sm", "split_gap",
          "the SM part of a split copy starts 4 KiB after the copy engine's part ends: a gap stays NaN (large sizes)", (
        ("const int rc = launch_push(dst + ce, src + ce, nbytes - ce, sms, stream);",
         "const int rc = launch_push(dst + ce + 4096, src + ce + 4096, nbytes - ce - 4096, sms, stream);  // BUG"),)),
    Fault("fusion/ring_attention_kernel", "no_slot_free_wait",
          "forwards a K/V block without waiting for the next rank to release the slot: at world 4 and 8 a block is "
          "overwritten while that rank still attends to the one two steps earlier", (
        ("      wait_all(a.flags + cdone_word(a, t - 1), a.G, a.epoch);\n"
         "      wait_all(a.flags + fdone_word(a, t - 1, c), 1, a.epoch);\n",
         "      // BUG: no wait for the receiver to release its slot\n"),)),
    Fault("fusion/ring_attention_kernel", "unmasked_tail_keys",
          "does not mask the zero-filled keys past n in the last tile: each gets score 0 and weight exp(-m)", (
        ("const float x = col < valid ? s[j][i] * a.scale_log2 : -INFINITY;",
         "const float x = s[j][i] * a.scale_log2;  // BUG: keys at or beyond n must be -inf\n        (void)col;"),)),
    Fault("fusion/allreduce_bias_gelu", "bias_gelu_tail_dropped",
          "never computes the count % vector-width elements past the last full vector: they stay NaN", (
        ("  if (a.last) {  // fewer than V elements past the last full vector",
         "  if (false && a.last) {  // BUG: the ragged end must be computed"),)),
    Fault("utility/verified_transfer", "checksum_weight_off_by_one",
          "weights word j by j instead of j + 1 in the full chunks: every s1 of a full chunk is wrong", (
        ("        s1 += (j + 1u) * v[u].x + (j + 2u) * v[u].y + (j + 3u) * v[u].z + (j + 4u) * v[u].w;",
         "        s1 += j * v[u].x + (j + 1u) * v[u].y + (j + 2u) * v[u].z + (j + 3u) * v[u].w;  // BUG: j + 1"),)),
    Fault("utility/distributed_topk", "no_peer_list_wait",
          "merges without waiting for the peers' flags: their lists are read before (or while) they are published", (
        ("    while (static_cast<int32_t>(ld_acquire_sys(f) - a.epoch) < 0) {\n    }",
         "    (void)f;  // BUG: no wait for the peer's list"),)),
    Fault("fusion/matmul_allreduce_decode", "reduce_own_slot_first",
          "each rank adds the partial slots starting with its own: every y is within tolerance, but the ranks' bits "
          "differ", (
        ("        const float4 v = __ldcg(reinterpret_cast<const float4*>(src + j * stride));",
         "        const float4 v = __ldcg(reinterpret_cast<const float4*>(src + ((j + a.rank * a.S) % nf) * stride));"
         "  // BUG: the order must be the same on every rank"),)),
    Fault("fusion/matmul_allreduce_decode", "no_partial_wait",
          "reduces a tile without waiting for its flags: peers' partials of this call may not have arrived yet", (
        ("    for (int i = threadIdx.x; i < nf; i += kThreads) wait_flag(a.flags[a.rank] + tile * nf + i, a.epoch);",
         "    // BUG: no wait for the tile's partials"),)),
    Fault("fusion/vocab_embedding_allreduce", "padding_rows_left",
          "never writes the rows of padding ids (-1): they stay NaN", (
        ("    } else if (id < 0) {", "    } else if (false && id < 0) {  // BUG: padding rows must be zeroed"),)),
    Fault("collective/allreduce_two_level_kernel", "no_counterpart_total_wait",
          "never waits for the counterparts' \"total written\" flags: the inter-group all-gather reads totals that "
          "are not written yet (NaN) and overwrites partial sums the counterparts have not read", (
        ("    if (t - 2 >= 0 && t - 2 < a.rounds) wait_flag(f + word(t - 2, kF2), a.epoch);",
         "    // BUG: no wait for the counterpart's F2(t - 2)"),)),
)}
