// Value head loss 0.5 (v - R)², optionally with PPO-style value clipping, and its gradient.
//
// Twin (service/backend/numpy_ops.py): value_fwd_bwd. Wrapped by service/backend/cuda/
// value.py (ValueOps): value_fwd_bwd with 256-thread blocks, value_loss_mean with exactly one
// block of VALUE_REDUCE_THREADS.
//
// Inputs: values v, returns R, old_values v_old [B] float32. `use_clip` (0/1, a run-time flag
// from ppo.clip_value_loss) turns clipping on; the clip range ε is a float64 device scalar
// (`clip_eps`, one double, e.g. a slice of the device hyper-parameter vector, as in every op),
// used as float32(ε) like the twin's Python float; not read when use_clip = 0.
//
//   err = v - R
//   use_clip = 0:  loss_row = 0.5 err²,  grad = err / B
//   use_clip = 1:  v_clip = v_old + clip(v - v_old, -ε, ε),  e_c = v_clip - R
//                  loss_row = 0.5 max(err², e_c²)
//                  grad = (e_c² > err² ? (|v - v_old| <= ε ? e_c : 0) : err) / B
//                  (the clipped branch moves with v only while |v - v_old| <= ε)
// loss = Σ_b loss_row[b] / B (value_loss_mean).
//
// Determinism: no atomics; one thread per row; the batch mean is one block that adds rows
// t, t + 256, ... in index order (double) and then a fixed-shape shared-memory tree. The loader
// compiles with --fmad=false and IEEE division: each float32 operation rounds as the twin's.

#include "common.cuh"

#define VALUE_REDUCE_THREADS 256  // block size of value_loss_mean (a power of two)

static __device__ __forceinline__ float value_clip(float x, float lo, float hi)  // as np.clip
{
    return x < lo ? lo : (x > hi ? hi : x);
}

static __device__ __forceinline__ float value_nanmax(float m, float v)  // as np.maximum
{
    return (v > m || v != v) ? v : m;
}

extern "C" __global__ void value_fwd_bwd(const float* __restrict__ values,
                                         const float* __restrict__ returns,
                                         const float* __restrict__ old_values,
                                         const double* __restrict__ clip_eps, int use_clip,
                                         float* __restrict__ loss_per_row,
                                         float* __restrict__ grad_values, int B)
{
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const float batch = (float)B;
    const float v = values[b];
    const float err = v - returns[b];
    if (!use_clip) {
        loss_per_row[b] = (0.5f * err) * err;
        grad_values[b] = err / batch;
        return;
    }
    const float eps = (float)clip_eps[0];
    const float v_old = old_values[b];
    const float delta = v - v_old;
    const float clipped_err = (v_old + value_clip(delta, -eps, eps)) - returns[b];
    const float err_sq = err * err;
    const float clipped_sq = clipped_err * clipped_err;
    const bool use_clipped = clipped_sq > err_sq;
    const bool clip_live = fabsf(delta) <= eps;  // the clipped branch still moves with v
    loss_per_row[b] = 0.5f * value_nanmax(err_sq, clipped_sq);
    grad_values[b] = (use_clipped ? (clip_live ? clipped_err : 0.0f) : err) / batch;
}

// loss[0] = Σ_b loss_per_row[b] / B; one block of VALUE_REDUCE_THREADS threads
// (trident_block_strided_sum, common.cuh).
extern "C" __global__ void value_loss_mean(const float* __restrict__ loss_per_row,
                                           float* __restrict__ loss, int B)
{
    __shared__ double partial[VALUE_REDUCE_THREADS];
    const double total =
        trident_block_strided_sum<VALUE_REDUCE_THREADS>(loss_per_row, B, 1, partial);
    if (threadIdx.x == 0) loss[0] = (float)(total / (double)B);
}
