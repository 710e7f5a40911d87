// The device-resident replay ring's uniform draw and gather, and a minibatch's rows of several
// arrays. The ring is written by service/trainer/replay.py (ReplayBuffer.insert).
//
// Wrapped by service/backend/cuda/replay.py (ReplayOps); 256-thread blocks.
//
// Storage (capacity C rows): obs [C, D] float32, actions [C] int32, rewards [C] float32,
// dones [C] uint8, horizons [C] int32, next_obs [C, D] float32 (D = TRIDENT_D).
// size: int64 [1] in device memory (ReplayBuffer.size_on_device).
//
// Sample: slot_i = below(word 0 of Philox counter (i, seq_lo, REPLAY = 2, seq_hi), size) =
// ⌊word0 · size / 2^32⌋, as numpy_ops.replay_sample_indices (size < 2^32; the wrapper checks
// C < 2^31). key: uint32 [2] = (seed low, seed high); sequence: int64 [1] = the
// updates_attempted counter.
// Gather: one thread per (sample i, feature d) copies storage row slots[i].
//
// Determinism: no atomics; every output element has exactly one writing thread.

#include "common.cuh"

static constexpr unsigned int kReplayStream = 2u;  // philox.Stream.REPLAY

static __device__ __forceinline__ long long replay_thread_index()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// count threads: slots[i] = below(philox(i, seq_lo, 2, seq_hi).word0, size).
extern "C" __global__ void replay_sample_indices(const long long* __restrict__ size,
                                                 const unsigned int* __restrict__ key,
                                                 const long long* __restrict__ sequence,
                                                 int* __restrict__ slots, int count)
{
    const long long i = replay_thread_index();
    if (i >= count) return;
    const unsigned long long seq = (unsigned long long)sequence[0];
    const uint4 counter = make_uint4((unsigned int)i, (unsigned int)(seq & 0xffffffffull),
                                     kReplayStream, (unsigned int)(seq >> 32));
    const uint4 w = trident_philox4x32_10(counter, make_uint2(key[0], key[1]));
    slots[i] = (int)trident_below(w.x, (unsigned int)size[0]);
}

// count·D threads: out_*[i] = storage row slots[i].
extern "C" __global__ void replay_gather(const int* __restrict__ slots,
                                         const float* __restrict__ obs,
                                         const int* __restrict__ actions,
                                         const float* __restrict__ rewards,
                                         const unsigned char* __restrict__ dones,
                                         const int* __restrict__ horizons,
                                         const float* __restrict__ next_obs,
                                         float* __restrict__ out_obs, int* __restrict__ out_actions,
                                         float* __restrict__ out_rewards,
                                         unsigned char* __restrict__ out_dones,
                                         int* __restrict__ out_horizons,
                                         float* __restrict__ out_next_obs, int count)
{
    const long long idx = replay_thread_index();
    if (idx >= (long long)count * TRIDENT_D) return;
    const long long i = idx / TRIDENT_D;
    const int d = (int)(idx % TRIDENT_D);
    const long long slot = slots[i];
    out_obs[idx] = obs[slot * TRIDENT_D + d];
    out_next_obs[idx] = next_obs[slot * TRIDENT_D + d];
    if (d == 0) {
        out_actions[i] = actions[slot];
        out_rewards[i] = rewards[slot];
        out_dones[i] = dones[slot];
        out_horizons[i] = horizons[slot];
    }
}

// A minibatch's rows of several per-row arrays in one launch: dst_j[r, :] = src_j[rows[r], :]
// for j < count (twin: numpy_ops.gather_rows). Each array is [B_j, width_j] of 4-byte elements
// (float32 or int32, copied as bits), row-major; dst_j is [n, width_j]. Up to GATHER_MAX
// arrays; unused pointer slots are never read. rows must lie in every src's [0, B_j) (the
// wrapper's caller, the trainer, passes its own permutation). Grid-stride over each array's
// n·width_j elements.
#define GATHER_MAX 8

extern "C" __global__ void gather_rows(const unsigned int* s0, const unsigned int* s1,
                                       const unsigned int* s2, const unsigned int* s3,
                                       const unsigned int* s4, const unsigned int* s5,
                                       const unsigned int* s6, const unsigned int* s7,
                                       unsigned int* d0, unsigned int* d1, unsigned int* d2,
                                       unsigned int* d3, unsigned int* d4, unsigned int* d5,
                                       unsigned int* d6, unsigned int* d7, int w0, int w1,
                                       int w2, int w3, int w4, int w5, int w6, int w7,
                                       int count, const int* __restrict__ rows, int n) {
    const unsigned int* const src[GATHER_MAX] = {s0, s1, s2, s3, s4, s5, s6, s7};
    unsigned int* const dst[GATHER_MAX] = {d0, d1, d2, d3, d4, d5, d6, d7};
    const int width[GATHER_MAX] = {w0, w1, w2, w3, w4, w5, w6, w7};
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int j = 0; j < count && j < GATHER_MAX; ++j) {
        const int w = width[j];
        const long long total = (long long)n * w;
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
             i += stride) {
            const long long r = i / w;
            dst[j][i] = src[j][(long long)rows[r] * w + (i - r * w)];
        }
    }
}
