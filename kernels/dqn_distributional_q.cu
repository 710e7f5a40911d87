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
//   h [B, H], W [H, A·Z], grad_W [H, A·Z], grad_b [A·Z], grad_h [B, H]
//
// Determinism: no atomics; each output has one writing thread and every sum runs in a fixed
// order (atoms in index order, batch rows in index order, or the fixed 256-wide tree of
// c51_loss_mean). The loader compiles with --fmad=false and IEEE division, so each float32
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
// p = softmax_z(logits) per (b, a) row; rows = B·A. One thread per row, atoms in index order:
//   p_z = exp(l_z - max_z l) / Σ_z exp(l_z - max_z l)
extern "C" __global__ void c51_softmax(const float* __restrict__ logits,
                                       float* __restrict__ probs, int rows)
{
    const long long row = c51_thread_index();
    if (row >= rows) return;
    const float* x = logits + row * TRIDENT_Z;
    float* p = probs + row * TRIDENT_Z;
    float m = x[0];
    for (int z = 1; z < TRIDENT_Z; ++z) m = c51_nanmax(m, x[z]);
    float sum = 0.0f;
    for (int z = 0; z < TRIDENT_Z; ++z) {
        const float e = expf(x[z] - m);
        p[z] = e;  // e_z, normalised below by this same thread
        sum += e;
    }
    for (int z = 0; z < TRIDENT_Z; ++z) p[z] = p[z] / sum;
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

// ---------------------------------------------------------------------------------------------
// Cross-entropy of the taken action, one thread per batch row b (a = actions[b]):
//   log p_z = (l_z - max l) - log Σ exp(l - max l)          l = logits[b, a, :]
//   loss_per_row[b] = -Σ_z m_z log p_z                       (atoms in index order)
//   grad_taken[b, z] = (p_z Σm - m_z) / B                    (Σm = 1 for a projected target)
// The batch loss Σ_b loss_per_row[b] / B is c51_loss_mean's.
extern "C" __global__ void c51_cross_entropy_fwd_bwd(const float* __restrict__ logits,
                                                     const int* __restrict__ actions,
                                                     const float* __restrict__ target,
                                                     float* __restrict__ loss_per_row,
                                                     float* __restrict__ grad_taken, int B)
{
    const long long b = c51_thread_index();
    if (b >= B) return;
    const int a = actions[b];
    const float* m = target + b * TRIDENT_Z;
    float* g = grad_taken + b * TRIDENT_Z;
    if (a < 0 || a >= TRIDENT_A) {  // no logits to read: NaN loss, zero gradient
        loss_per_row[b] = c51_nan();
        for (int z = 0; z < TRIDENT_Z; ++z) g[z] = 0.0f;
        return;
    }
    const float* x = logits + (b * TRIDENT_A + a) * TRIDENT_Z;
    float mx = x[0];
    for (int z = 1; z < TRIDENT_Z; ++z) mx = c51_nanmax(mx, x[z]);
    float sum = 0.0f;
    double mass = 0.0;
    for (int z = 0; z < TRIDENT_Z; ++z) {
        sum += expf(x[z] - mx);
        mass += (double)m[z];
    }
    const float log_norm = logf(sum);
    const float mass_f = (float)mass;  // Σ_z m_z
    const float batch = (float)B;
    double ce = 0.0;
    for (int z = 0; z < TRIDENT_Z; ++z) {
        const float log_p = (x[z] - mx) - log_norm;
        ce += (double)(m[z] * log_p);
        g[z] = (expf(log_p) * mass_f - m[z]) / batch;
    }
    loss_per_row[b] = (float)(-ce);
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
// (twin: c51_head_bwd). Three launches, no [B, A·Z] dense gradient and no O(B·H·A·Z) scratch:
//
// 1. c51_head_bwd_rows: one thread per action a lists the rows that took it, in index order:
//      row_lists[a·B + k] = k-th row b with actions[b] = a,   row_counts[a] = how many.
//    (scratch [A·B] + [A] int32; rows with an out-of-range action are in no list.)
// 2. c51_head_bwd_w_b: one thread per output, looping over its action's rows in index order
//    (double accumulation):
//      grad_W[h, a·Z + z] = Σ_{b: a_b = a} h[b, h] g[b, z]      (H·A·Z threads)
//      grad_b[a·Z + z]    = Σ_{b: a_b = a} g[b, z]              (A·Z threads after those)
// 3. c51_head_bwd_h: one thread per (b, h), atoms in index order:
//      grad_h[b, h] = Σ_z g[b, z] W[h, a_b·Z + z]
//
// Cost and large B: step 2 does B·H·Z multiply-adds in all (each row feeds only its action's
// columns) over H·A·Z + A·Z threads (~118k at H = 256, A·Z = 459) of about B/A iterations each
// (~1800 at B = 16384, A = 9): enough parallelism that per-block partials (chunks of B summed
// in order, then the chunks in order) are not needed up to B ~ 10^5. Step 1 is A threads each
// scanning all B actions serially: latency-bound, on the order of 0.1 ms at B = 16384; if it
// shows in profiles, replace it by one block per action with a fixed-order ballot/prefix scan
// (same lists, same order, so the same bits).
extern "C" __global__ void c51_head_bwd_rows(const int* __restrict__ actions,
                                             int* __restrict__ row_lists,
                                             int* __restrict__ row_counts, int B)
{
    const long long a = c51_thread_index();
    if (a >= TRIDENT_A) return;
    int* list = row_lists + a * B;
    int count = 0;
    for (int b = 0; b < B; ++b) {
        if (actions[b] == a) list[count++] = b;
    }
    row_counts[a] = count;
}

extern "C" __global__ void c51_head_bwd_w_b(const float* __restrict__ h,
                                            const float* __restrict__ grad_taken,
                                            const int* __restrict__ row_lists,
                                            const int* __restrict__ row_counts,
                                            float* __restrict__ grad_W,
                                            float* __restrict__ grad_b, int B)
{
    const long long idx = c51_thread_index();
    const long long weights = (long long)TRIDENT_H * C51_WIDTH;
    if (idx >= weights + C51_WIDTH) return;
    const bool is_bias = idx >= weights;
    const int col = (int)(is_bias ? idx - weights : idx % C51_WIDTH);  // a·Z + z
    const int hid = is_bias ? 0 : (int)(idx / C51_WIDTH);
    const int a = col / TRIDENT_Z;
    const int z = col % TRIDENT_Z;
    const int* list = row_lists + (long long)a * B;
    const int count = row_counts[a];
    double acc = 0.0;
    if (is_bias) {
        for (int k = 0; k < count; ++k)
            acc += (double)grad_taken[(long long)list[k] * TRIDENT_Z + z];
        grad_b[col] = (float)acc;
    } else {
        for (int k = 0; k < count; ++k) {
            const long long b = list[k];
            acc += (double)h[b * TRIDENT_H + hid] * (double)grad_taken[b * TRIDENT_Z + z];
        }
        grad_W[idx] = (float)acc;
    }
}

extern "C" __global__ void c51_head_bwd_h(const float* __restrict__ W,
                                          const int* __restrict__ actions,
                                          const float* __restrict__ grad_taken,
                                          float* __restrict__ grad_h, int B)
{
    const long long idx = c51_thread_index();
    if (idx >= (long long)B * TRIDENT_H) return;
    const long long b = idx / TRIDENT_H;
    const int hid = (int)(idx % TRIDENT_H);
    const int a = actions[b];
    if (a < 0 || a >= TRIDENT_A) {  // its loss row is NaN already; no weight column to read
        grad_h[idx] = 0.0f;
        return;
    }
    const float* g = grad_taken + b * TRIDENT_Z;
    const float* w = W + (long long)hid * C51_WIDTH + a * TRIDENT_Z;
    double acc = 0.0;
    for (int z = 0; z < TRIDENT_Z; ++z) acc += (double)g[z] * (double)w[z];
    grad_h[idx] = (float)acc;
}
