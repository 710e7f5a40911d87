// C51 distributional Q head: softmax over atoms, expected values, the greedy action, and the
// head's forward and backward on replayed transitions for each row's taken action only.
//
// Twins (service/backend/numpy_ops.py): c51_softmax, c51_q_values, c51_greedy,
// c51_taken_loss_bwd. Wrapped by service/backend/cuda/c51.py (C51Ops); the *_mean entry
// needs exactly one block of C51_REDUCE_THREADS, the c51_taken_* entries their own grids (below),
// the rest 256-thread blocks.
//
// Layouts (row-major, float32 unless noted):
//   logits, probs  [B, A, Z]   one "row" is one (b, a) pair: Z contiguous atoms
//   support        [Z]         z_i = v_min + i Δz
//   q              [B, A]
//   h              [B, H]      encoder features of the replayed observations
//   W, bias        [H, A·Z], [A·Z]   the head; action a owns columns a·Z .. a·Z + Z - 1
//   actions        [B] int32   the replayed action a_b
//   target         [B, Z]      projected target distribution m (categorical_projection.cu)
//   grad_taken     [B, Z]      dL/dlogits[b, a_b, :]; every other action's slice is zero
//   order          [B] int32   rows sorted by action, stably (c51_sort_counts, _place); rows whose
//                              action is outside [0, A) come last
//   offsets        [A + 2] int32   action a's rows are order[offsets[a] .. offsets[a + 1]);
//                              offsets[A] .. offsets[A + 1] the out-of-range ones
//
// Determinism: no atomics; each output has one writing thread and every sum runs in a fixed
// order (atoms and features in index order, fixed warp butterflies, rows in sorted order, the
// fixed 256-wide tree of c51_loss_mean, partials reduced by reduce_axis0). The loader compiles
// with --fmad=false and IEEE division, so each float32 operation rounds where written.
//
// An action outside [0, A) cannot index the head; its row gets a NaN loss (the trainer's
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

// One row's Z atoms x (+ bias, when given) as one warp holds them: lane l gets atoms l, l + 32,
// ... in e[] (-inf past Z).
static __device__ __forceinline__ void c51_warp_load(const float* __restrict__ x,
                                                     const float* __restrict__ bias, int lane,
                                                     float (&e)[C51_LANE_ATOMS])
{
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        const int z = lane + 32 * k;
        e[k] = z < TRIDENT_Z ? (bias ? x[z] + bias[z] : x[z]) : __int_as_float(0xff800000);
    }
}

// The softmax of c51_warp_load's atoms, in place: p at this lane's atoms (0 past Z).
static __device__ __forceinline__ void c51_warp_softmax(int lane, float (&e)[C51_LANE_ATOMS])
{
    float m = __int_as_float(0xff800000);  // -inf: NaN wins every c51_nanmax, as in np.max
    for (int k = 0; k < C51_LANE_ATOMS; ++k) m = c51_nanmax(m, e[k]);
    for (int offset = 16; offset > 0; offset >>= 1)
        m = c51_nanmax(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float sum = 0.0f;
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        e[k] = lane + 32 * k < TRIDENT_Z ? expf(e[k] - m) : 0.0f;
        sum += e[k];
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    for (int k = 0; k < C51_LANE_ATOMS; ++k) e[k] = e[k] / sum;
}

extern "C" __global__ void c51_softmax(const float* __restrict__ logits,
                                       float* __restrict__ probs, int rows)
{
    const long long row = c51_thread_index() >> 5;  // the same for the whole warp
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float e[C51_LANE_ATOMS];
    c51_warp_load(logits + row * TRIDENT_Z, nullptr, lane, e);
    c51_warp_softmax(lane, e);
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        const int z = lane + 32 * k;
        if (z < TRIDENT_Z) probs[row * TRIDENT_Z + z] = e[k];
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
//   p(a) = softmax_z(logits[b, a, :] + bias[a, :]), q(a) = Σ_z p(a)_z z_z, a* = argmax_a q(a)
//   (the bias add of the head's forward is done here: logits is the GEMM's output); (the first
//   maximum, and the first NaN if any, as np.argmax), probs_best[b] = p(a*).
// One warp per row; per action the softmax is c51_softmax's arithmetic (lane l holds atoms
// l, l + 32, ...; fixed xor butterflies), and q sums its lanes' products in double in a fixed
// butterfly, rounded once to float (c51_q_values sums the same products in double too). It
// replaces softmax + q-values + argmax + gather of the target network: [B, A, Z] probabilities
// are never written.
// Actions whose atoms c51_greedy loads at once: 4 or 3, whichever wastes fewer slots past A.
#define C51_GREEDY_WASTE(g) ((TRIDENT_A + (g) - 1) / (g) * (g) - TRIDENT_A)
#define C51_GREEDY_GROUP \
    (TRIDENT_A <= 3 ? TRIDENT_A : (C51_GREEDY_WASTE(4) <= C51_GREEDY_WASTE(3) ? 4 : 3))

extern "C" __global__ void c51_greedy(const float* __restrict__ logits,
                                      const float* __restrict__ bias,
                                      const float* __restrict__ support,
                                      int* __restrict__ best, float* __restrict__ probs_best,
                                      int B)
{
    const long long b = c51_thread_index() >> 5;  // the same for the whole warp
    const int lane = threadIdx.x & 31;
    if (b >= B) return;
    int chosen = 0;
    float chosen_q = 0.0f;
    float kept[C51_LANE_ATOMS];  // the chosen action's probabilities (this lane's atoms)
    // Actions in groups of C51_GREEDY_GROUP: a group's loads are all issued before its
    // softmaxes, whose butterflies are independent and interleave; the choice runs in order.
    for (int a0 = 0; a0 < TRIDENT_A; a0 += C51_GREEDY_GROUP) {
        float e[C51_GREEDY_GROUP][C51_LANE_ATOMS];
        double q[C51_GREEDY_GROUP];
#pragma unroll
        for (int g = 0; g < C51_GREEDY_GROUP; ++g) {
            const int a = min(a0 + g, TRIDENT_A - 1);  // past A: a repeat, never chosen
            c51_warp_load(logits + (b * TRIDENT_A + a) * TRIDENT_Z, bias + a * TRIDENT_Z, lane,
                          e[g]);
        }
#pragma unroll
        for (int g = 0; g < C51_GREEDY_GROUP; ++g) {
            c51_warp_softmax(lane, e[g]);
            q[g] = 0.0;
            for (int k = 0; k < C51_LANE_ATOMS; ++k) {
                const int z = lane + 32 * k;
                if (z < TRIDENT_Z) q[g] += (double)e[g][k] * (double)support[z];
            }
            q[g] = c51_warp_sum(q[g]);
        }
#pragma unroll
        for (int g = 0; g < C51_GREEDY_GROUP; ++g) {
            const int a = a0 + g;
            const float qf = (float)q[g];
            const bool take = a == 0 || (chosen_q == chosen_q && (qf != qf || qf > chosen_q));
            if (a < TRIDENT_A && take) {
                chosen = a;
                chosen_q = qf;
                for (int k = 0; k < C51_LANE_ATOMS; ++k) kept[k] = e[g][k];
            }
        }
    }
    for (int k = 0; k < C51_LANE_ATOMS; ++k) {
        const int z = lane + 32 * k;
        if (z < TRIDENT_Z) probs_best[b * TRIDENT_Z + z] = kept[k];
    }
    if (lane == 0) best[b] = chosen;
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
// The head on replayed transitions, each row's taken action only (twins: c51_taken_loss_bwd,
// c51_taken_grad_params).
// Rows are first sorted by action so a block works on rows that share their W columns.
//
// The sort: rows in chunks of C51_SORT_THREADS, one block per chunk, one row per thread.
// c51_sort_counts: counts[c, k] = the rows of chunk c with key k (k = A: actions outside
// [0, A)). c51_sort_place: block c sums the counts to the start of key k's rows of chunk c
// (offsets[k] = the rows with a smaller key, plus key k's rows of chunks before c), ranks its
// rows of each key by ballots and a scan over the warps, and writes order[start + rank] = row:
// each key's rows in index order. Block 0 writes offsets [A + 2]. Grid ceil(B / threads) for
// both (at least 1); scratch counts [chunks, A + 1] int32.
#define C51_SORT_THREADS 1024
#define C51_SORT_WARPS (C51_SORT_THREADS / 32)
#define C51_SORT_KEYS (TRIDENT_A + 1)

static __device__ __forceinline__ int c51_key(const int* actions, int row)
{
    const int a = actions[row];
    return (a >= 0 && a < TRIDENT_A) ? a : TRIDENT_A;
}

// This block's row, its key (-1 past B) and, per key, each warp's rows in warp_rows[k][warp];
// returns the row's rank among its warp's rows of its key.
static __device__ __forceinline__ int c51_chunk_ranks(const int* __restrict__ actions, int B,
                                                      int& row, int& key,
                                                      int (*warp_rows)[C51_SORT_WARPS])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    row = blockIdx.x * C51_SORT_THREADS + threadIdx.x;
    key = row < B ? c51_key(actions, row) : -1;
    int rank = 0;
    for (int k = 0; k < C51_SORT_KEYS; ++k) {
        const unsigned int ballot = __ballot_sync(0xffffffffu, key == k);
        if (key == k) rank = __popc(ballot & ((1u << lane) - 1u));
        if (lane == 0) warp_rows[k][warp] = __popc(ballot);
    }
    return rank;
}

extern "C" __global__ void __launch_bounds__(C51_SORT_THREADS)
c51_sort_counts(const int* __restrict__ actions, int* __restrict__ counts, int B)
{
    __shared__ int warp_rows[C51_SORT_KEYS][C51_SORT_WARPS];
    int row, key;
    c51_chunk_ranks(actions, B, row, key, warp_rows);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int k = warp; k < C51_SORT_KEYS; k += C51_SORT_WARPS) {  // warp k sums key k
        int n = lane < C51_SORT_WARPS ? warp_rows[k][lane] : 0;
        for (int offset = 16; offset > 0; offset >>= 1) n += __shfl_xor_sync(0xffffffffu, n, offset);
        if (lane == 0) counts[blockIdx.x * C51_SORT_KEYS + k] = n;
    }
}

extern "C" __global__ void __launch_bounds__(C51_SORT_THREADS)
c51_sort_place(const int* __restrict__ actions, const int* __restrict__ counts,
               int* __restrict__ order, int* __restrict__ offsets, int B)
{
    __shared__ int warp_rows[C51_SORT_KEYS][C51_SORT_WARPS];
    __shared__ int total[C51_SORT_KEYS], before[C51_SORT_KEYS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = (B + C51_SORT_THREADS - 1) / C51_SORT_THREADS;
    int row, key;
    const int rank = c51_chunk_ranks(actions, B, row, key, warp_rows);
    for (int k = warp; k < C51_SORT_KEYS; k += C51_SORT_WARPS) {  // warp k: key k's counts
        int all = 0, earlier = 0;  // over every chunk, over the chunks before this one
        for (int c = lane; c < chunks; c += 32) {
            const int n = counts[c * C51_SORT_KEYS + k];
            all += n;
            earlier += c < (int)blockIdx.x ? n : 0;
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            all += __shfl_xor_sync(0xffffffffu, all, offset);
            earlier += __shfl_xor_sync(0xffffffffu, earlier, offset);
        }
        if (lane == 0) {
            total[k] = all;
            before[k] = earlier;
        }
    }
    __syncthreads();
    // Warp k: key k's start (the smaller keys' totals, then the earlier chunks'), and its
    // warps' exclusive prefixes by an inclusive shuffle scan minus the own count.
    for (int k = warp; k < C51_SORT_KEYS; k += C51_SORT_WARPS) {
        int start = before[k];
        for (int j = 0; j < k; ++j) start += total[j];
        if (blockIdx.x == 0 && lane == 0) {
            offsets[k] = start;
            if (k == C51_SORT_KEYS - 1) offsets[C51_SORT_KEYS] = start + total[k];
        }
        const int own = lane < C51_SORT_WARPS ? warp_rows[k][lane] : 0;
        int scan = own;
        for (int offset = 1; offset < 32; offset <<= 1) {
            const int below = __shfl_up_sync(0xffffffffu, scan, offset);
            if (lane >= offset) scan += below;
        }
        __syncwarp();
        if (lane < C51_SORT_WARPS) warp_rows[k][lane] = start + scan - own;
    }
    __syncthreads();
    if (key >= 0) order[warp_rows[key][warp] + rank] = row;
}

// The tiles of `order`: each key's segment (key A: actions outside [0, A)) cut into tiles of
// `tile_rows` consecutive rows, keys in order; block j of a 1-D grid of at least
// ceil(B / tile_rows) + A + 1 blocks takes the j-th tile. Sets (key, tile); false past the last.
static __device__ __forceinline__ bool c51_segment_tile(const int* __restrict__ offsets,
                                                        int tile_rows, int j, int& key, int& tile)
{
    for (int k = 0; k <= TRIDENT_A; ++k) {
        const int tiles = (offsets[k + 1] - offsets[k] + tile_rows - 1) / tile_rows;
        if (j < tiles) {
            key = k;
            tile = j;
            return true;
        }
        j -= tiles;
    }
    return false;
}

// out[0..N) = p[0..N) from shared memory, as float4 loads when N is a multiple of 4 (p is then
// 16-byte aligned: the callers' rows are multiples of 4 floats from an aligned base).
template <int N>
static __device__ __forceinline__ void c51_load_shared(const float* p, float (&out)[N])
{
    if (N % 4 == 0) {
#pragma unroll
        for (int q = 0; q < N / 4; ++q) {
            const float4 v = reinterpret_cast<const float4*>(p)[q];
            out[4 * q] = v.x;
            out[4 * q + 1] = v.y;
            out[4 * q + 2] = v.z;
            out[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = p[k];
    }
}

// c51_taken_fwd_bwd: block j takes the j-th tile of up to C51_TILE_ROWS rows of one key's
// segment of `order` (c51_segment_tile; 1-D grid of ceil(B / C51_TILE_ROWS) + A + 1 blocks of
// C51_TAKEN_THREADS threads).
//   logits[r, z] = Σ_i h[r, i] W[i, a·Z + z] + bias[a·Z + z]
//       (C51_KSPLIT thread groups each sum the features i ≡ group mod C51_KSPLIT in index
//        order; the groups' sums are then added in group order)
//   loss_per_row[r] = -Σ_z m_z log p_z, grad_taken[r, z] = (p_z Σm - m_z) / B
//   grad_h[r, i] = Σ_z grad_taken[r, z] W[i, a·Z + z]            (z in index order)
// The tile's features are held transposed (features[i][r]: one float4 load gives four rows'
// feature i) and so are its gradients for grad_h (grads_t[z][r]); grad_h reads the head's
// columns from shared memory, C51_BWD_I features at a time, staged with coalesced loads. The
// softmax and loss of a row run in one warp with c51_softmax's lane layout and butterflies.
// Rows of key A (no valid action): NaN loss, zero grad_taken and grad_h. Shared memory:
// C51_TILE_ROWS · C51_ROW_FLOATS + C51_STAGE_FLOATS floats, at most C51_SHARED_FLOATS (C51Ops
// checks that C51_TILE_ROWS is at least 4).
#define C51_TAKEN_THREADS 256
#define C51_Z_LANES (((TRIDENT_Z + 31) / 32) * 32 < 256 ? ((TRIDENT_Z + 31) / 32) * 32 : 256)
#define C51_KSPLIT (C51_TAKEN_THREADS / C51_Z_LANES)
#define C51_SHARED_FLOATS 12288  // 48 KB, the static shared-memory limit
#define C51_BWD_I 64             // features per staged chunk of the head's columns
#define C51_BWD_GROUPS (C51_TAKEN_THREADS / C51_BWD_I)
#define C51_ZS (TRIDENT_Z | 1)   // odd row stride: lanes on consecutive features, distinct banks
#define C51_STAGE_FLOATS (C51_BWD_I * C51_ZS)
#define C51_ROW_FLOATS (TRIDENT_H + 2 * TRIDENT_Z)
#define C51_TILE_FIT ((C51_SHARED_FLOATS - C51_STAGE_FLOATS) / C51_ROW_FLOATS)
#define C51_TILE_ROWS ((C51_TILE_FIT > 16 ? 16 : C51_TILE_FIT) / 4 * 4)  // a multiple of 4
#define C51_GROUP_ROWS (C51_TILE_ROWS / C51_BWD_GROUPS)  // grad_h rows per thread

extern "C" __global__ void __launch_bounds__(C51_TAKEN_THREADS)
c51_taken_fwd_bwd(const float* __restrict__ h, const float* __restrict__ W,
                  const float* __restrict__ bias, const float* __restrict__ target,
                  const int* __restrict__ order, const int* __restrict__ offsets,
                  float* __restrict__ loss_per_row, float* __restrict__ grad_taken,
                  float* __restrict__ grad_h, int B)
{
    __shared__ __align__(16) float features[TRIDENT_H][C51_TILE_ROWS];
    __shared__ float grads[C51_TILE_ROWS][TRIDENT_Z];
    __shared__ __align__(16) float grads_t[TRIDENT_Z][C51_TILE_ROWS];
    __shared__ float staged[C51_BWD_I][C51_ZS];
    __shared__ int rows[C51_TILE_ROWS];
    int key, tile;
    if (!c51_segment_tile(offsets, C51_TILE_ROWS, blockIdx.x, key, tile)) return;
    const int first = offsets[key] + tile * C51_TILE_ROWS;
    const int count = min(C51_TILE_ROWS, offsets[key + 1] - first);
    const int t = threadIdx.x;
    if (t < count) rows[t] = order[first + t];
    __syncthreads();
    if (key == TRIDENT_A) {  // no head columns to read
        for (int r = 0; r < count; ++r) {
            for (int z = t; z < TRIDENT_Z; z += C51_TAKEN_THREADS)
                grad_taken[(long long)rows[r] * TRIDENT_Z + z] = 0.0f;
            for (int i = t; i < TRIDENT_H; i += C51_TAKEN_THREADS)
                grad_h[(long long)rows[r] * TRIDENT_H + i] = 0.0f;
            if (t == 0) loss_per_row[rows[r]] = c51_nan();
        }
        return;
    }
    for (int e = t; e < C51_TILE_ROWS * TRIDENT_H; e += C51_TAKEN_THREADS) {
        const int r = e / TRIDENT_H, i = e % TRIDENT_H;  // rows past `count`: zeros, never stored
        features[i][r] = r < count ? h[(long long)rows[r] * TRIDENT_H + i] : 0.0f;
    }
    __syncthreads();
    const float* columns = W + key * TRIDENT_Z;  // W[i, a·Z + z] = columns[i·A·Z + z]
    {
        // Thread (group, z) sums its features for every row of the tile; with C51_KSPLIT > 1
        // each thread has at most one z (Z <= C51_Z_LANES) and the groups add their sums into
        // grads one group after the other.
        const int group = t / C51_Z_LANES, z0 = t % C51_Z_LANES;
        float acc[C51_TILE_ROWS];
        for (int z = z0; group < C51_KSPLIT && z < TRIDENT_Z; z += C51_Z_LANES) {
            for (int r = 0; r < C51_TILE_ROWS; ++r) acc[r] = 0.0f;
#pragma unroll 8
            for (int i = group; i < TRIDENT_H; i += C51_KSPLIT) {
                const float w = columns[(long long)i * C51_WIDTH + z];
                float f[C51_TILE_ROWS];
                c51_load_shared(features[i], f);
#pragma unroll
                for (int r = 0; r < C51_TILE_ROWS; ++r) acc[r] += f[r] * w;
            }
            if (C51_KSPLIT == 1)
                for (int r = 0; r < C51_TILE_ROWS; ++r) grads[r][z] = acc[r];
        }
        if (C51_KSPLIT > 1) {
            for (int g = 0; g < C51_KSPLIT; ++g) {
                if (group == g && z0 < TRIDENT_Z)
                    for (int r = 0; r < C51_TILE_ROWS; ++r)
                        grads[r][z0] = g == 0 ? acc[r] : grads[r][z0] + acc[r];
                __syncthreads();
            }
        }
    }
    __syncthreads();
    for (int e = t; e < C51_TILE_ROWS * TRIDENT_Z; e += C51_TAKEN_THREADS) {
        const int r = e / TRIDENT_Z, z = e % TRIDENT_Z;
        // the logits (zeros past `count`); the loop below overwrites them with their gradients
        grads[r][z] = r < count ? grads[r][z] + bias[key * TRIDENT_Z + z] : 0.0f;
    }
    __syncthreads();
    const int lane = t & 31, warp = t >> 5;
    const float batch = (float)B;
    for (int r = warp; r < count; r += C51_TAKEN_THREADS / 32) {
        const float* m = target + (long long)rows[r] * TRIDENT_Z;
        float mx = __int_as_float(0xff800000);  // -inf: NaN wins every c51_nanmax
        for (int z = lane; z < TRIDENT_Z; z += 32) mx = c51_nanmax(mx, grads[r][z]);
        for (int offset = 16; offset > 0; offset >>= 1)
            mx = c51_nanmax(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
        float sum = 0.0f;
        double mass = 0.0;
        for (int z = lane; z < TRIDENT_Z; z += 32) {
            sum += expf(grads[r][z] - mx);
            mass += (double)m[z];
        }
        for (int offset = 16; offset > 0; offset >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        mass = c51_warp_sum(mass);
        const float log_norm = logf(sum);
        const float mass_f = (float)mass;
        double ce = 0.0;
        for (int z = lane; z < TRIDENT_Z; z += 32) {
            const float log_p = (grads[r][z] - mx) - log_norm;
            ce += (double)(m[z] * log_p);
            const float g = (expf(log_p) * mass_f - m[z]) / batch;
            grads_t[z][r] = g;
            grad_taken[(long long)rows[r] * TRIDENT_Z + z] = g;
        }
        ce = c51_warp_sum(ce);
        if (lane == 0) loss_per_row[rows[r]] = (float)(-ce);
    }
    // grad_h: thread (feature il of the chunk, row group rg) sums over z for its rows.
    const int il = t % C51_BWD_I, rg = t / C51_BWD_I;
    for (int i0 = 0; i0 < TRIDENT_H; i0 += C51_BWD_I) {
        const int n = min(C51_BWD_I, TRIDENT_H - i0);
        __syncthreads();  // grads_t is written; the previous chunk's readers are done
        for (int e = t; e < n * TRIDENT_Z; e += C51_TAKEN_THREADS) {
            const int i = e / TRIDENT_Z, z = e % TRIDENT_Z;
            staged[i][z] = columns[(long long)(i0 + i) * C51_WIDTH + z];
        }
        __syncthreads();
        if (il >= n) continue;
        float acc[C51_GROUP_ROWS];
        for (int k = 0; k < C51_GROUP_ROWS; ++k) acc[k] = 0.0f;
#pragma unroll 4
        for (int z = 0; z < TRIDENT_Z; ++z) {
            const float wz = staged[il][z];
            float g[C51_GROUP_ROWS];
            c51_load_shared(&grads_t[z][rg * C51_GROUP_ROWS], g);
#pragma unroll
            for (int k = 0; k < C51_GROUP_ROWS; ++k) acc[k] += g[k] * wz;
        }
        for (int k = 0; k < C51_GROUP_ROWS; ++k) {
            const int r = rg * C51_GROUP_ROWS + k;
            if (r < count) grad_h[(long long)rows[r] * TRIDENT_H + i0 + il] = acc[k];
        }
    }
}

// c51_taken_grad_partials: the head's weight and bias gradients, per chunk of `chunk_rows`
// rows of one action's segment. Block (j, y) takes the j-th chunk (c51_segment_tile over the
// actions' segments; grid (ceil(B / chunk_rows) + A + 1, ceil(H / C51_I_TILE)); the wrapper
// keeps ceil(B / chunk_rows) <= 64) and features y·C51_I_TILE onward; C51_GRAD_THREADS threads.
// Lanes run over atoms z (coalesced writes), warps over C51_I_PER_WARP features each (each
// staged atom feeds that many FMAs):
//   partial_W[c, i, a·Z + z] = Σ_{rows k of chunk c of action a} h[k, i] grad_taken[k, z]
//   partial_b[c, a·Z + z]    = Σ_k grad_taken[k, z]          (warp 0 of blocks y = 0)
// rows in sorted order. c51_taken_grad_reduce sums each action's ceil(rows / chunk_rows)
// chunks, in chunk order. Scratch: chunks · (H + 1) · A·Z floats, of which about
// (B / chunk_rows + A) · (H + 1) · Z are written.
#define C51_GRAD_THREADS 256
#define C51_GRAD_WARPS (C51_GRAD_THREADS / 32)
#define C51_I_PER_WARP 8
#define C51_I_TILE (C51_GRAD_WARPS * C51_I_PER_WARP)
#define C51_STAGE_ROWS 32  // one row index per lane while staging
static_assert(C51_STAGE_ROWS == 32 && C51_STAGE_ROWS % C51_GRAD_WARPS == 0, "stage layout");
#define C51_Z_PER_LANE ((TRIDENT_Z + 31) / 32)

extern "C" __global__ void __launch_bounds__(C51_GRAD_THREADS)
c51_taken_grad_partials(const float* __restrict__ h, const float* __restrict__ grad_taken,
                        const int* __restrict__ order, const int* __restrict__ offsets,
                        float* __restrict__ partial_W, float* __restrict__ partial_b,
                        int chunk_rows)
{
    __shared__ __align__(16) float hs[C51_STAGE_ROWS][C51_I_TILE];
    __shared__ float gs[C51_STAGE_ROWS][TRIDENT_Z];
    int key, chunk;  // the chunks of key A (actions outside [0, A)) are never read
    if (!c51_segment_tile(offsets, chunk_rows, blockIdx.x, key, chunk) || key == TRIDENT_A) return;
    const int i0 = blockIdx.y * C51_I_TILE;
    const bool with_bias = blockIdx.y == 0;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int begin = offsets[key] + chunk * chunk_rows;
    const int end = min(begin + chunk_rows, offsets[key + 1]);
    float acc[C51_I_PER_WARP][C51_Z_PER_LANE];
    float bacc[C51_Z_PER_LANE];
    for (int j = 0; j < C51_Z_PER_LANE; ++j) {
        bacc[j] = 0.0f;
        for (int u = 0; u < C51_I_PER_WARP; ++u) acc[u][j] = 0.0f;
    }
    for (int base = begin; base < end; base += C51_STAGE_ROWS) {
        const int n = min(C51_STAGE_ROWS, end - base);
        // Every warp reads the stage's row indices at once (lane k holds row k), then stages
        // its rows with all their loads in flight together.
        const int lane_row = lane < n ? order[base + lane] : 0;
#pragma unroll
        for (int q = 0; q < C51_STAGE_ROWS / C51_GRAD_WARPS; ++q) {
            const int k = warp + C51_GRAD_WARPS * q;
            const long long row = __shfl_sync(0xffffffffu, lane_row, k);
            if (k < n) {
                for (int c = lane; c < C51_I_TILE; c += 32)
                    hs[k][c] = i0 + c < TRIDENT_H ? h[row * TRIDENT_H + i0 + c] : 0.0f;
                for (int z = lane; z < TRIDENT_Z; z += 32)
                    gs[k][z] = grad_taken[row * TRIDENT_Z + z];
            }
        }
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < n; ++k) {
            float x[C51_I_PER_WARP];
#pragma unroll
            for (int u = 0; u < C51_I_PER_WARP; ++u) x[u] = hs[k][warp * C51_I_PER_WARP + u];
#pragma unroll
            for (int j = 0; j < C51_Z_PER_LANE; ++j) {
                const int z = lane + 32 * j;
                const float g = z < TRIDENT_Z ? gs[k][z] : 0.0f;
                if (with_bias) bacc[j] += g;
#pragma unroll
                for (int u = 0; u < C51_I_PER_WARP; ++u) acc[u][j] += x[u] * g;
            }
        }
        __syncthreads();
    }
    const long long plane = (long long)chunk * TRIDENT_H * C51_WIDTH;
    for (int u = 0; u < C51_I_PER_WARP; ++u) {
        const int i = i0 + warp * C51_I_PER_WARP + u;
        if (i >= TRIDENT_H) break;
        for (int j = 0; j < C51_Z_PER_LANE; ++j) {
            const int z = lane + 32 * j;
            if (z < TRIDENT_Z)
                partial_W[plane + (long long)i * C51_WIDTH + key * TRIDENT_Z + z] = acc[u][j];
        }
    }
    if (with_bias && warp == 0) {
        for (int j = 0; j < C51_Z_PER_LANE; ++j) {
            const int z = lane + 32 * j;
            if (z < TRIDENT_Z) partial_b[(long long)chunk * C51_WIDTH + key * TRIDENT_Z + z] = bacc[j];
        }
    }
}

// grad_W[i, a·Z + z] = Σ_{c < chunks_a} partial_W[c, i, a·Z + z] and grad_b[a·Z + z] likewise,
// chunks_a = ceil(rows of action a / chunk_rows) (0 for an action no row took: a zero column),
// c ascending. One thread per output of grad_W and grad_b ((H + 1)·A·Z threads, grid-stride).
extern "C" __global__ void c51_taken_grad_reduce(const float* __restrict__ partial_W,
                                                 const float* __restrict__ partial_b,
                                                 const int* __restrict__ offsets, int chunk_rows,
                                                 float* __restrict__ grad_W,
                                                 float* __restrict__ grad_b)
{
    const long long plane = (long long)TRIDENT_H * C51_WIDTH;
    const long long total = plane + C51_WIDTH;
    for (long long o = c51_thread_index(); o < total; o += (long long)gridDim.x * blockDim.x) {
        const int column = (int)(o % C51_WIDTH), a = column / TRIDENT_Z;
        const int chunks = (offsets[a + 1] - offsets[a] + chunk_rows - 1) / chunk_rows;
        const bool bias = o >= plane;
        const float* src = bias ? partial_b + column : partial_W + o;
        const long long stride = bias ? C51_WIDTH : plane;
        float sum = 0.0f;
#pragma unroll 4
        for (int c = 0; c < chunks; ++c) sum += src[c * stride];
        if (bias) {
            grad_b[column] = sum;
        } else {
            grad_W[o] = sum;
        }
    }
}
