// PPO policy head: log-softmax, the clipped surrogate with entropy bonus (loss rows, statistics
// and dL/dlogits in one pass), and advantage normalisation.
//
// Twins (service/backend/numpy_ops.py): log_softmax, ppo_surrogate_fwd_bwd, normalize_advantages.
// Wrapped by service/backend/cuda/ppo.py (PpoOps): 256-thread blocks; ppo_stats_mean and
// normalize_advantages_stats need exactly one block of PPO_REDUCE_THREADS.
//
// Not here, by design:
// - ppo_policy_logits_fwd: logits [B, A] = h W + b is a GEMM; the Python side runs it with cuBLAS
//   (cupy.matmul) plus the bias add — no hand-written kernel would beat that.
// - ppo_grad_w_b_h_t: the head's backward from grad_logits [B, A] is the generic linear backward
//   (grad_h = g Wᵀ and grad_W = hᵀ g by cuBLAS, grad_b by the fixed-order reduce_axis0), the
//   same op every dense head uses; nothing about it is PPO-specific.
//
// Layouts: logits / grad_logits [B, A] float32, actions [B] int32, behavior_log_probs and
// advantages [B] float32. clip_eps (ε) and ent_coef (c_ent) are float64 device scalars (one
// double each, e.g. slices of the device hyper-parameter vector, as in every op), used as the
// twin uses its Python floats: float32(ε) in compares and clips, float32(1 ± ε), float32(c_ent
// / B). row_stats [B, PPO_ROW_STATS]:
//   0 pg_loss_row  = -min(ratio Â, clip(ratio, 1-ε, 1+ε) Â)
//   1 entropy_row  = H(π(·|s)) = -Σ_a π_a log π_a
//   2 kl_row       = (ratio - 1) - log ratio          (k3 estimator)
//   3 clipped      = 1 if |ratio - 1| > ε else 0
//   4 unclipped_is_min = 1 if ratio Â <= clip(ratio) Â else 0  (the gradient flows)
// stats [PPO_STATS] in the twin's dict order: loss, pg_loss, entropy, approx_kl, clip_fraction.
//
// Determinism: no atomics; one thread per row (actions in index order) and single-block
// reductions over the batch with a fixed order (thread t adds rows t, t + 256, ... in order in
// double, then a fixed-shape shared-memory tree: common.cuh's block sums). The loader compiles
// with --fmad=false and IEEE division and square root, so each float32 operation written here
// rounds where the twin's does.

#include "common.cuh"

#define PPO_ROW_STATS 5
#define PPO_STATS 5
#define PPO_REDUCE_THREADS 256  // block size of the single-block reductions (a power of two)

static __device__ __forceinline__ float ppo_nan() { return __int_as_float(0x7fc00000); }

static __device__ __forceinline__ float ppo_nanmax(float m, float v)  // as np.max / np.maximum
{
    return (v > m || v != v) ? v : m;
}

static __device__ __forceinline__ float ppo_nanmin(float m, float v)  // as np.minimum
{
    return (v < m || v != v) ? v : m;
}

static __device__ __forceinline__ float ppo_clip(float x, float lo, float hi)  // as np.clip
{
    return x < lo ? lo : (x > hi ? hi : x);
}

static __device__ __forceinline__ long long ppo_thread_index()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// max_a l_a and log Σ_a exp(l_a - max), actions in index order.
static __device__ __forceinline__ void ppo_log_norm(const float* x, float* max_out,
                                                    float* log_norm_out)
{
    float m = x[0];
    for (int a = 1; a < TRIDENT_A; ++a) m = ppo_nanmax(m, x[a]);
    float sum = 0.0f;
    for (int a = 0; a < TRIDENT_A; ++a) sum += expf(x[a] - m);
    *max_out = m;
    *log_norm_out = logf(sum);
}

// ---------------------------------------------------------------------------------------------
// out[row, a] = (l_a - max l) - log Σ exp(l - max l) over the last axis (A); rows = size / A.
extern "C" __global__ void ppo_log_softmax(const float* __restrict__ logits,
                                           float* __restrict__ out, int rows)
{
    const long long row = ppo_thread_index();
    if (row >= rows) return;
    const float* x = logits + row * TRIDENT_A;
    float m, log_norm;
    ppo_log_norm(x, &m, &log_norm);
    for (int a = 0; a < TRIDENT_A; ++a) out[row * TRIDENT_A + a] = (x[a] - m) - log_norm;
}

// ---------------------------------------------------------------------------------------------
// One thread per row b. With log π = log_softmax(l), π = exp(log π), a = actions[b]:
//   ratio = exp(log π_a - log π_old),  Â = advantages[b]
//   d     = (ratio Â <= clip(ratio, 1-ε, 1+ε) Â ? -Â ratio : 0) / B     (dL/d log π_a)
//   grad_j = -π_j d + [j = a] d + (c_ent / B) π_j (log π_j + H)
// which is numpy_ops.ppo_surrogate_fwd_bwd's gradient, term for term and in its order.
// An action outside [0, A) gives NaN row statistics (the non-finite guard skips the update)
// and only the entropy term of the gradient.
extern "C" __global__ void ppo_surrogate_fwd_bwd(const float* __restrict__ logits,
                                                 const int* __restrict__ actions,
                                                 const float* __restrict__ behavior_log_probs,
                                                 const float* __restrict__ advantages,
                                                 const double* __restrict__ clip_eps,
                                                 const double* __restrict__ ent_coef,
                                                 float* __restrict__ grad_logits,
                                                 float* __restrict__ row_stats, int B)
{
    const long long b = ppo_thread_index();
    if (b >= B) return;
    const float* x = logits + b * TRIDENT_A;
    float* g = grad_logits + b * TRIDENT_A;
    float* s = row_stats + b * PPO_ROW_STATS;
    const float eps = (float)clip_eps[0];
    const float lo = (float)(1.0 - clip_eps[0]), hi = (float)(1.0 + clip_eps[0]);  // 1 ∓ ε
    const float batch = (float)B;
    const float ent_scale = (float)(ent_coef[0] / (double)B);  // c_ent / B

    float m, log_norm;
    ppo_log_norm(x, &m, &log_norm);
    // H = -Σ_a π_a log π_a, actions in index order.
    float entropy = 0.0f;
    for (int a = 0; a < TRIDENT_A; ++a) {
        const float log_p = (x[a] - m) - log_norm;
        entropy += expf(log_p) * log_p;
    }
    entropy = -entropy;

    const int act = actions[b];
    const bool valid = act >= 0 && act < TRIDENT_A;
    const float log_p_act = valid ? (x[act] - m) - log_norm : ppo_nan();
    const float log_ratio = log_p_act - behavior_log_probs[b];
    const float ratio = expf(log_ratio);
    const float adv = advantages[b];
    const float unclipped = ratio * adv;
    const float clipped = ppo_clip(ratio, lo, hi) * adv;
    const bool flows = unclipped <= clipped;  // the unclipped term is the minimum
    // Where the clipped term is strictly smaller, ratio lies outside [1-ε, 1+ε] and the clip is
    // flat there: the gradient through log π_a is 0.
    const float d = (flows ? -adv * ratio : 0.0f) / batch;

    for (int j = 0; j < TRIDENT_A; ++j) {
        const float log_p = (x[j] - m) - log_norm;
        const float p = expf(log_p);
        float grad = -p * d;  // d log π_a / d l_j = [j = a] - π_j
        if (j == act) grad += d;
        grad += (ent_scale * p) * (log_p + entropy);  // -c_ent dH/dl_j = c_ent π_j (log π_j + H)
        g[j] = grad;
    }

    s[0] = -ppo_nanmin(unclipped, clipped);
    s[1] = entropy;
    s[2] = (ratio - 1.0f) - log_ratio;
    s[3] = valid ? (fabsf(ratio - 1.0f) > eps ? 1.0f : 0.0f) : ppo_nan();
    s[4] = valid ? (flows ? 1.0f : 0.0f) : ppo_nan();
}

// stats = [loss, pg_loss, entropy, approx_kl, clip_fraction] from row_stats [B, 5]: the means of
// columns 0..3 over the batch, and loss = pg_loss - c_ent entropy. One block.
extern "C" __global__ void ppo_stats_mean(const float* __restrict__ row_stats,
                                          const double* __restrict__ ent_coef,
                                          float* __restrict__ stats, int B)
{
    __shared__ double partial[PPO_REDUCE_THREADS];
    float mean[4];
    for (int col = 0; col < 4; ++col) {
        // Column col of row_stats [B, PPO_ROW_STATS]: rows t, t + 256, ... in order, then the tree.
        const double total = trident_block_strided_sum<PPO_REDUCE_THREADS>(
            row_stats + col, B, PPO_ROW_STATS, partial);
        mean[col] = (float)(total / (double)B);
    }
    if (threadIdx.x == 0) {
        stats[0] = mean[0] - (float)ent_coef[0] * mean[1];  // pg_loss - c_ent entropy
        stats[1] = mean[0];
        stats[2] = mean[1];
        stats[3] = mean[2];
        stats[4] = mean[3];
    }
}

// ---------------------------------------------------------------------------------------------
// Advantage normalisation (Â - mean) / (std + 1e-8), population std (a batch of one gives 0).
// normalize_advantages_stats (one block) writes stats = [mean, std + 1e-8] in two fixed-order
// passes as the twin: mean = ΣÂ / B; c = Â - mean (float32); var = Σc² / B; std = sqrt(var).
// normalize_advantages_apply (one thread per row) writes out = (Â - mean) / (std + 1e-8).
extern "C" __global__ void normalize_advantages_stats(const float* __restrict__ advantages,
                                                      float* __restrict__ stats, int B)
{
    __shared__ double partial[PPO_REDUCE_THREADS];
    const double sum = trident_block_strided_sum<PPO_REDUCE_THREADS>(advantages, B, 1, partial);
    const float mean = (float)(sum / (double)B);
    double acc = 0.0;
    for (int b = threadIdx.x; b < B; b += PPO_REDUCE_THREADS) {
        const float c = advantages[b] - mean;
        acc += (double)(c * c);
    }
    const float var = (float)(trident_block_tree_sum<PPO_REDUCE_THREADS>(acc, partial) / (double)B);
    if (threadIdx.x == 0) {
        stats[0] = mean;
        stats[1] = sqrtf(var) + 1e-8f;
    }
}

extern "C" __global__ void normalize_advantages_apply(const float* __restrict__ advantages,
                                                      const float* __restrict__ stats,
                                                      float* __restrict__ out, int B)
{
    const long long b = ppo_thread_index();
    if (b >= B) return;
    out[b] = (advantages[b] - stats[0]) / stats[1];
}
