// C51 distributional Q head: softmax over atoms, expected values, the cross-entropy loss and
// its gradient for the taken action, and the head's backward from that gradient.
//
// Twins (service/backend/numpy_ops.py): c51_softmax, c51_q_values, c51_cross_entropy_fwd_bwd,
// c51_head_bwd. Wrapped by service/backend/cuda/head_ops.py (HeadOps), which launches every
// entry with 256-thread blocks; the *_mean entry needs exactly one block of C51_REDUCE_THREADS.
//
// Layouts (row-major, float32 unless noted):
//   logits, probs  [B, A, Z]   one "row" is one (b, a) pair: Z contiguous atoms
//   support        [Z]         z_i = v_min + i Δz
//   q              [B, A]
//   actions        [B] int32   the replayed action a_b
//   target         [B, Z]      projected target distribution m (categorical_projection.cu)
//   grad_taken     [B, Z]      dL/dlogits[b, a_b, :]; every other action's slice is zero
//   grad_logits    [B, A·Z]    grad_taken spread over the head's columns (c51_taken_to_dense)
//
// Determinism: no atomics; each output has one writing thread and every sum runs in a fixed
// order (atoms in index order, a fixed warp butterfly in c51_softmax, or the fixed 256-wide
// tree of c51_loss_mean). The loader compiles with --fmad=false and IEEE division, so each float32
// operation written here rounds where the twin's does; long sums accumulate in double.
//
// An action outside [0, A) cannot index the logits; its row gets a NaN loss (the trainer's
// non-finite guard then skips the update) and a zero gradient, and no weight column sees it.

#include "common.cuh"

#define C51_WIDTH (TRIDENT_A * TRIDENT_Z)  // columns of the head: A·Z (459 by default)
#define C51_REDUCE_THREADS 256             // block size of c51_loss_mean (a power of two)

static __device__ __forceinline__ float c51_nan() { return __int_as_float(0x7fc00000); }

// max that propagates NaN like np.max: once a NaN is seen the result stays NaN.
static __device__ __forceinline__ float c51_nanmax(float m, float v)
{
    return (v > m || v != v) ? v : m;
}

static __device__ __forceinline__ long long c51_thread_index()
{
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// ---------------------------------------------------------------------------------------------
// p = softmax_z(logits) per (b, a) row; rows = B·A. One warp per row (8 rows per 256-thread
// block): lane l holds atoms l, l + 32, ... (coalesced loads and stores). Each lane's max and
// sum run over its atoms in index order, then a fixed xor-butterfly combines the lanes (every
// lane ends with the same value: a + b == b + a exactly), so the result is fixed bit for bit:
//   p_z = exp(l_z - max_z l) / Σ_z exp(l_z - max_z l)
#define C51_LANE_ATOMS ((TRIDENT_Z + 31) / 32)

extern "C" __global__ void c51_softmax(const float* __restrict__ logits,
                                       float* __restrict__ probs, int rows)
{
    const long long row = c51_thread_index() >> 5;  // the same for the whole warp
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* x = logits + row * TRIDENT_Z;
    float* p = probs + row * TRIDENT_Z;
    float e[C51_LANE_ATOMS];
    const float minus_inf = __int_as_float(0xff800000);
    float m = minus_inf;  // NaN wins every c51_nanmax, as in np.max
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        const int z = lane + 32 * k;
        e[k] = z < TRIDENT_Z ? x[z] : minus_inf;
        m = c51_nanmax(m, e[k]);
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        m = c51_nanmax(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float sum = 0.0f;
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        e[k] = lane + 32 * k < TRIDENT_Z ? expf(e[k] - m) : 0.0f;
        sum += e[k];
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        const int z = lane + 32 * k;
        if (z < TRIDENT_Z) p[z] = e[k] / sum;
    }
}

// ---------------------------------------------------------------------------------------------
// q[row] = E[Z(s, a)] = Σ_z p_z z_z for rows = B·A; one thread per row, atoms in index order,
// accumulated in double and rounded once.
extern "C" __global__ void c51_q_values(const float* __restrict__ probs,
                                        const float* __restrict__ support,
                                        float* __restrict__ q, int rows)
{
    const long long row = c51_thread_index();
    if (row >= rows) return;
    const float* p = probs + row * TRIDENT_Z;
    double acc = 0.0;
    for (int z = 0; z < TRIDENT_Z; ++z) acc += (double)p[z] * (double)support[z];
    q[row] = (float)acc;
}

// Sum of a double over the warp by a fixed xor butterfly (every lane gets the same value).
static __device__ __forceinline__ double c51_warp_sum(double v)
{
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// ---------------------------------------------------------------------------------------------
// The greedy action of each row by expected value, and its distribution (twin: c51_greedy):
//   p(a) = softmax_z(logits[b, a, :]), q(a) = Σ_z p(a)_z z_z, a* = argmax_a q(a) (the first
//   maximum, and the first NaN if any, as np.argmax), probs_best[b] = p(a*).
// One warp per row; per action the softmax is c51_softmax's arithmetic (lane l holds atoms
// l, l + 32, ...; fixed xor butterflies), and q sums its lanes' products in double in a fixed
// butterfly, rounded once to float (c51_q_values sums the same products in double too). It
// replaces softmax + q-values + argmax + gather of the target network: [B, A, Z] probabilities
// are never written.
extern "C" __global__ void c51_greedy(const float* __restrict__ logits,
                                      const float* __restrict__ support,
                                      int* __restrict__ best, float* __restrict__ probs_best,
                                      int B)
{
    const long long b = c51_thread_index() >> 5;  // the same for the whole warp
    const int lane = threadIdx.x & 31;
    if (b >= B) return;
    const float minus_inf = __int_as_float(0xff800000);
    int chosen = 0;
    float chosen_q = 0.0f;
    float kept[C51_LANE_ATOMS];  // the chosen action's probabilities (this lane's atoms)
    for (int a = 0; a < TRIDENT_A; ++a) {
        const float* x = logits + (b * TRIDENT_A + a) * TRIDENT_Z;
        float e[C51_LANE_ATOMS];
        float m = minus_inf;
        for (int k = 0; k < C51_LANE_ATOMS; ++k) {
            const int z = lane + 32 * k;
            e[k] = z < TRIDENT_Z ? x[z] : minus_inf;
            m = c51_nanmax(m, e[k]);
        }
        for (int offset = 16; offset > 0; offset >>= 1)
            m = c51_nanmax(m, __shfl_xor_sync(0xffffffffu, m, offset));
        float sum = 0.0f;
        for (int k = 0; k < C51_LANE_ATOMS; ++k) {
            e[k] = lane + 32 * k < TRIDENT_Z ? expf(e[k] - m) : 0.0f;
            sum += e[k];
        }
        for (int offset = 16; offset > 0; offset >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        double q = 0.0;
        for (int k = 0; k < C51_LANE_ATOMS; ++k) {
            const int z = lane + 32 * k;
            e[k] = e[k] / sum;
            if (z < TRIDENT_Z) q += (double)e[k] * (double)support[z];
        }
        const float qf = (float)c51_warp_sum(q);
        const bool take = a == 0 || (chosen_q == chosen_q && (qf != qf || qf > chosen_q));
        if (take) {
            chosen = a;
            chosen_q = qf;
            for (int k = 0; k < C51_LANE_ATOMS; ++k) kept[k] = e[k];
        }
    }
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        const int z = lane + 32 * k;
        if (z < TRIDENT_Z) probs_best[b * TRIDENT_Z + z] = kept[k];
    }
    if (lane == 0) best[b] = chosen;
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy of the taken action, one warp per batch row b (a = actions[b]); launch 32·B
// threads. Lane l holds atoms l, l + 32, ...; lanes combine by the fixed xor butterfly (as in
// c51_softmax), so every lane holds the same max, sums and loss:
//   log p_z = (l_z - max l) - log Σ exp(l - max l)          l = logits[b, a, :]
//   loss_per_row[b] = -Σ_z m_z log p_z                       (lane partials in double)
//   grad_taken[b, z] = (p_z Σm - m_z) / B                    (Σm = 1 for a projected target)
// The batch loss Σ_b loss_per_row[b] / B is c51_loss_mean's.
extern "C" __global__ void c51_cross_entropy_fwd_bwd(const float* __restrict__ logits,
                                                     const int* __restrict__ actions,
                                                     const float* __restrict__ target,
                                                     float* __restrict__ loss_per_row,
                                                     float* __restrict__ grad_taken, int B)
{
    const long long b = c51_thread_index() >> 5;  // the same for the whole warp
    const int lane = threadIdx.x & 31;
    if (b >= B) return;
    const int a = actions[b];
    const float* m = target + b * TRIDENT_Z;
    float* g = grad_taken + b * TRIDENT_Z;
    if (a < 0 || a >= TRIDENT_A) {  // no logits to read: NaN loss, zero gradient
        for (int z = lane; z < TRIDENT_Z; z += 32) g[z] = 0.0f;
        if (lane == 0) loss_per_row[b] = c51_nan();
        return;
    }
    const float* x = logits + (b * TRIDENT_A + a) * TRIDENT_Z;
    float mx = __int_as_float(0xff800000);  // -inf: NaN wins every c51_nanmax
    for (int z = lane; z < TRIDENT_Z; z += 32) mx = c51_nanmax(mx, x[z]);
    for (int offset = 16; offset > 0; offset >>= 1)
        mx = c51_nanmax(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
    float sum = 0.0f;
    double mass = 0.0;
    for (int z = lane; z < TRIDENT_Z; z += 32) {
        sum += expf(x[z] - mx);
        mass += (double)m[z];
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    mass = c51_warp_sum(mass);
    const float log_norm = logf(sum);
    const float mass_f = (float)mass;  // Σ_z m_z
    const float batch = (float)B;
    double ce = 0.0;
    for (int z = lane; z < TRIDENT_Z; z += 32) {
        const float log_p = (x[z] - mx) - log_norm;
        ce += (double)(m[z] * log_p);
        g[z] = (expf(log_p) * mass_f - m[z]) / batch;
    }
    ce = c51_warp_sum(ce);
    if (lane == 0) loss_per_row[b] = (float)(-ce);
}

// loss[0] = Σ_b loss_per_row[b] / B. One block of C51_REDUCE_THREADS threads: thread t adds rows
// t, t + 256, ... in index order (double), then a fixed-shape shared-memory tree
// (trident_block_strided_sum, common.cuh).
extern "C" __global__ void c51_loss_mean(const float* __restrict__ loss_per_row,
                                         float* __restrict__ loss, int B)
{
    __shared__ double partial[C51_REDUCE_THREADS];
    const double total = trident_block_strided_sum<C51_REDUCE_THREADS>(loss_per_row, B, 1, partial);
    if (threadIdx.x == 0) loss[0] = (float)(total / (double)B);
}

// ---------------------------------------------------------------------------------------------
// Backward of logits = h W + b when only the taken action's Z-slice of each row has a gradient
// (twin: c51_head_bwd). c51_taken_to_dense spreads grad_taken into the dense gradient
// grad_logits [B, A·Z] (zero outside each row's taken slice; a row whose action is outside
// [0, A) is all zero), one thread per element; the wrapper then runs two cuBLAS GEMMs and
// reduce_axis0 (grad_W = hᵀ G, grad_h = G Wᵀ, grad_b = Σ_b G): O(B·A·Z) scratch, no
// O(B·H·A·Z), and GEMM speed (measured on the H200, bench/gpu_profile.py: the three
// one-thread-per-output kernels this replaced took 352 µs of a 1.14 ms update at B = 4096).
extern "C" __global__ void c51_taken_to_dense(const float* __restrict__ grad_taken,
                                              const int* __restrict__ actions,
                                              float* __restrict__ grad_logits, int B)
{
    const long long idx = c51_thread_index();
    if (idx >= (long long)B * C51_WIDTH) return;
    const long long b = idx / C51_WIDTH;
    const int col = (int)(idx % C51_WIDTH);  // a·Z + z
    const bool taken = col / TRIDENT_Z == actions[b];
    grad_logits[idx] = taken ? grad_taken[b * TRIDENT_Z + col % TRIDENT_Z] : 0.0f;
}
