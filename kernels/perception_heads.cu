// Perception heads: binary cross-entropy with logits and the K-target auxiliary MSE.
//
// Twins (service/backend/numpy_ops.py): bce_fwd_bwd, aux_mse_fwd_bwd. Wrapped by
// service/backend/cuda/perception.py (PerceptionOps): 256-thread blocks for the row kernels, one
// block of PERCEPTION_REDUCE_THREADS for perception_loss_mean.
//
// bce_fwd_bwd, u (logits) and y (labels in {0, 1}) [B] float32, one thread per row:
//   loss_row = softplus(u) - y u,  softplus(u) = max(u, 0) + log1p(exp(-|u|))  (never overflows)
//   grad     = (σ(u) - y) / B,      σ(u) = 0.5 (1 + tanh(u / 2))               (no exp overflow)
// aux_mse_fwd_bwd, pred and target [B, K] float32 (K = TRIDENT_K >= 1), one thread per row:
//   loss_row = Σ_k (p_k - t_k)²    (k in index order)
//   grad     = 2 (p - t) / (B K)
// perception_loss_mean: loss[0] = Σ_b loss_row[b] / divisor (B for BCE, B·K for aux).
//
// Determinism: no atomics; one writer per output; the batch sum adds rows t, t + 256, ... in
// index order (double) per thread, then a fixed-shape shared-memory tree. The loader compiles
// with --fmad=false and IEEE division: each float32 operation rounds as the twin's.

#include "common.cuh"

#define PERCEPTION_REDUCE_THREADS 256  // block size of perception_loss_mean (a power of two)

static __device__ __forceinline__ long long perception_thread_index()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

extern "C" __global__ void bce_fwd_bwd(const float* __restrict__ u, const float* __restrict__ y,
                                       float* __restrict__ loss_per_row,
                                       float* __restrict__ grad_u, int B)
{
    const long long b = perception_thread_index();
    if (b >= B) return;
    const float x = u[b];
    const float label = y[b];
    // max(u, 0) as np.maximum (NaN propagates), + log1p(exp(-|u|)), - y u
    const float relu = (x > 0.0f || x != x) ? x : 0.0f;
    loss_per_row[b] = (relu + log1pf(expf(-fabsf(x)))) - label * x;
    const float sigmoid = 0.5f * (1.0f + tanhf(0.5f * x));
    grad_u[b] = (sigmoid - label) / (float)B;
}

extern "C" __global__ void aux_mse_fwd_bwd(const float* __restrict__ pred,
                                           const float* __restrict__ target,
                                           float* __restrict__ loss_per_row,
                                           float* __restrict__ grad_pred, int B)
{
    const long long b = perception_thread_index();
    if (b >= B) return;
    // 2 / (B K) rounded once to float32, as the twin's (2.0 / diff.size) * diff.
    const float scale = (float)(2.0 / ((double)B * (double)TRIDENT_K));
    double acc = 0.0;
    for (int k = 0; k < TRIDENT_K; ++k) {
        const long long i = b * TRIDENT_K + k;
        const float diff = pred[i] - target[i];
        acc += (double)(diff * diff);
        grad_pred[i] = scale * diff;
    }
    loss_per_row[b] = (float)acc;
}

// loss[0] = Σ_{b < rows} loss_per_row[b] / divisor; one block of PERCEPTION_REDUCE_THREADS
// (trident_block_strided_sum, common.cuh).
extern "C" __global__ void perception_loss_mean(const float* __restrict__ loss_per_row,
                                                float* __restrict__ loss, int rows,
                                                long long divisor)
{
    __shared__ double partial[PERCEPTION_REDUCE_THREADS];
    const double total =
        trident_block_strided_sum<PERCEPTION_REDUCE_THREADS>(loss_per_row, rows, 1, partial);
    if (threadIdx.x == 0) loss[0] = (float)(total / (double)divisor);
}
