// Several narrow linear heads on one input h [rows, TRIDENT_H], fused: the policy, value and
// perception heads (widths A, 1, 1, K) are each far too narrow for a GEMM to pay, and run as
// one launch per pass instead of a GEMM, a bias add, a weight GEMM and a bias reduction each.
// Twins: numpy_ops.linear_heads_fwd, linear_heads_bwd_input (grad_h_accumulate of the heads'
// linear_bwd_input) and linear_heads_bwd_params (linear_bwd_params per head). Up to
// LINEAR_HEADS_MAX heads; head j has W_j [TRIDENT_H, w_j], b_j [w_j], output and gradient
// [rows, w_j], all row-major; the heads' S = Σ w_j columns are numbered s = 0..S-1, head 0's
// first. Unused pointer slots are never read.
// The backward kernels work on tiles of rows staged in dynamic shared memory (the wrapper sizes
// them); no atomics, and every sum runs in an order fixed by the shapes.
#include "common.cuh"

#define LINEAR_HEADS_MAX 4
#define LINEAR_HEADS_TILE 16  // rows per tile: linear_heads_bwd_input's accumulators
#define LINEAR_HEADS_COLS 16  // columns per register pass (the default heads have 14)

#define LINEAR_HEADS_TABLE(type, name) \
    type const name[LINEAR_HEADS_MAX] = {name##0, name##1, name##2, name##3}

// head[s], col[s]: the head of column s and its column within that head; returns S.
__device__ __forceinline__ int linear_heads_columns(const int* width, int count, int* head,
                                                    int* col) {
    int columns = 0;
    for (int j = 0; j < count; ++j) columns += width[j];
    for (int s = threadIdx.x; s < columns; s += blockDim.x) {
        int j = 0, c = s;
        while (c >= width[j]) c -= width[j++];
        head[s] = j;
        col[s] = c;
    }
    return columns;
}

// out_j[r, c] = Σ_k h[r, k] W_j[k, c] + b_j[c], k summed in four partial sums p_m (the
// features k ≡ m mod 4 below H rounded down to 4, in index order; the last H mod 4 features
// then go to p_0 in order), added as ((p_0 + p_1) + (p_2 + p_3)) + b. Block (x, y) takes rows
// x·FWD_ROWS onward and the heads' columns y·FWD_COLS onward (grid (ceil(rows / FWD_ROWS),
// ceil(S / FWD_COLS)), FWD_THREADS threads): thread (row, m) sums p_m of its row for every
// column of the group, each feature read once from h and the group's W columns staged
// (transposed, FWD_KC features at a time) in shared memory; the four threads of a row are
// adjacent lanes and add their sums by shuffles.
#define LINEAR_HEADS_FWD_ROWS 32
#define LINEAR_HEADS_FWD_THREADS (4 * LINEAR_HEADS_FWD_ROWS)
#define LINEAR_HEADS_FWD_COLS 16
#define LINEAR_HEADS_FWD_KC 128  // a multiple of 4: a chunk keeps each feature's residue

extern "C" __global__ void __launch_bounds__(LINEAR_HEADS_FWD_THREADS)
linear_heads_fwd(const float* __restrict__ h, const float* W0, const float* W1, const float* W2,
                 const float* W3, const float* b0, const float* b1, const float* b2,
                 const float* b3, float* out0, float* out1, float* out2, float* out3, int width0,
                 int width1, int width2, int width3, int count, int rows) {
    __shared__ float ws[LINEAR_HEADS_FWD_KC][LINEAR_HEADS_FWD_COLS + 1];  // odd stride
    __shared__ int head[LINEAR_HEADS_FWD_COLS], col[LINEAR_HEADS_FWD_COLS];
    LINEAR_HEADS_TABLE(const float*, W);
    LINEAR_HEADS_TABLE(const float*, b);
    LINEAR_HEADS_TABLE(float*, out);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    int columns = 0;
    for (int j = 0; j < count; ++j) columns += width[j];
    const int s0 = blockIdx.y * LINEAR_HEADS_FWD_COLS;
    const int group = min(LINEAR_HEADS_FWD_COLS, columns - s0);
    const int t = threadIdx.x, m = t & 3;
    if (t < group) {
        int j = 0, c = s0 + t;
        while (c >= width[j]) c -= width[j++];
        head[t] = j;
        col[t] = c;
    }
    const long long row = (long long)blockIdx.x * LINEAR_HEADS_FWD_ROWS + (t >> 2);
    const bool live = row < rows;
    const float* x = h + (live ? row : 0) * TRIDENT_H;
    const int paired = TRIDENT_H / 4 * 4;  // features in the four interleaved sums
    float p[LINEAR_HEADS_FWD_COLS];
#pragma unroll
    for (int c = 0; c < LINEAR_HEADS_FWD_COLS; ++c) p[c] = 0.0f;
    for (int k0 = 0; k0 < TRIDENT_H; k0 += LINEAR_HEADS_FWD_KC) {
        const int kn = min(LINEAR_HEADS_FWD_KC, TRIDENT_H - k0);
        __syncthreads();  // head and col are written; the previous chunk's readers are done
        for (int e = t; e < kn * LINEAR_HEADS_FWD_COLS; e += LINEAR_HEADS_FWD_THREADS) {
            const int k = e / LINEAR_HEADS_FWD_COLS, c = e % LINEAR_HEADS_FWD_COLS;
            ws[k][c] = c < group ? W[head[c]][(long long)(k0 + k) * width[head[c]] + col[c]] : 0.0f;
        }
        __syncthreads();
        const int stop = min(kn, paired - k0);
#pragma unroll 4
        for (int k = m; k < stop; k += 4) {
            const float xv = x[k0 + k];
#pragma unroll
            for (int c = 0; c < LINEAR_HEADS_FWD_COLS; ++c) p[c] += xv * ws[k][c];
        }
        if (m == 0) {
            for (int k = stop; k < kn; ++k) {  // the last H mod 4 features, in order
                const float xv = x[k0 + k];
#pragma unroll
                for (int c = 0; c < LINEAR_HEADS_FWD_COLS; ++c) p[c] += xv * ws[k][c];
            }
        }
    }
#pragma unroll
    for (int c = 0; c < LINEAR_HEADS_FWD_COLS; ++c) {
        const float pair = p[c] + __shfl_down_sync(0xffffffffu, p[c], 1);  // m = 0: p0 + p1
        const float other = __shfl_down_sync(0xffffffffu, pair, 2);        // m = 0: p2 + p3
        if (m == 0 && live && c < group) {
            const int j = head[c];
            out[j][row * width[j] + col[c]] = (pair + other) + b[j][col[c]];
        }
    }
}

// Stages tile rows [row0, row0 + n) of the heads' gradients, concatenated, into gs [n, S]
// (each scaled by its head's λ when `lambda` is given).
__device__ __forceinline__ void linear_heads_stage(const float* const* g, const int* width,
                                                   const int* head, const int* col,
                                                   const float* lambda, int columns, int row0,
                                                   int n, float* gs) {
    for (int i = threadIdx.x; i < n * columns; i += blockDim.x) {
        const int r = i / columns, s = i % columns, j = head[s];
        const float v = g[j][(long long)(row0 + r) * width[j] + col[s]];
        gs[i] = lambda ? lambda[j] * v : v;
    }
}

// grad_h[r, k] = Σ_s (λ_j(s) g[r, s]) W[k, s]: the heads' encoder gradients, each head's weight
// λ (rounded to float32, as grad_h_accumulate does) applied to its gradient rows. Grid: x over
// tiles of LINEAR_HEADS_TILE rows (grid-stride), y over blocks of k; thread k keeps
// LINEAR_HEADS_COLS of its W row in registers per pass. Shared: TILE·S floats + 2·S ints.
extern "C" __global__ void linear_heads_bwd_input(
    const float* g0, const float* g1, const float* g2, const float* g3, const float* W0,
    const float* W1, const float* W2, const float* W3, int width0, int width1, int width2,
    int width3, const double* __restrict__ weights, int count, float* __restrict__ grad_h,
    int rows) {
    extern __shared__ float shared[];
    LINEAR_HEADS_TABLE(const float*, g);
    LINEAR_HEADS_TABLE(const float*, W);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    float lambda[LINEAR_HEADS_MAX];
#pragma unroll
    for (int j = 0; j < LINEAR_HEADS_MAX; ++j) lambda[j] = j < count ? (float)weights[j] : 0.0f;
    const int all = width0 + width1 + width2 + width3;
    float* gs = shared;
    int* head = (int*)(shared + LINEAR_HEADS_TILE * all);
    int* col = head + all;
    const int columns = linear_heads_columns(width, count, head, col);
    const int k = blockIdx.y * blockDim.x + threadIdx.x;
    for (int row0 = blockIdx.x * LINEAR_HEADS_TILE; row0 < rows;
         row0 += gridDim.x * LINEAR_HEADS_TILE) {
        const int n = min(LINEAR_HEADS_TILE, rows - row0);
        __syncthreads();
        linear_heads_stage(g, width, head, col, lambda, columns, row0, n, gs);
        __syncthreads();
        if (k >= TRIDENT_H) continue;
        float acc[LINEAR_HEADS_TILE];
#pragma unroll
        for (int r = 0; r < LINEAR_HEADS_TILE; ++r) acc[r] = 0.0f;
        for (int s0 = 0; s0 < columns; s0 += LINEAR_HEADS_COLS) {
            float wk[LINEAR_HEADS_COLS];
#pragma unroll
            for (int c = 0; c < LINEAR_HEADS_COLS; ++c) {
                const int s = s0 + c;
                wk[c] = s < columns ? W[head[s]][k * width[head[s]] + col[s]] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < LINEAR_HEADS_TILE; ++r) {
                if (r < n) {
#pragma unroll
                    for (int c = 0; c < LINEAR_HEADS_COLS; ++c) {
                        if (s0 + c < columns) acc[r] += gs[r * columns + s0 + c] * wk[c];
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < LINEAR_HEADS_TILE; ++r) {
            if (r < n) grad_h[(long long)(row0 + r) * TRIDENT_H + k] = acc[r];
        }
    }
}

// partials[q, k, s] = Σ_{r in chunk q} x[r, k] g[r, s], rows ascending, with x = h for
// k < TRIDENT_H and x = 1 for k = TRIDENT_H (the bias row). Chunk q = rows
// [q·chunk_rows, (q+1)·chunk_rows); one block per chunk (grid-stride), threads over k.
// Shared: chunk_rows·S floats + 2·S ints.
extern "C" __global__ void linear_heads_grad_partials(
    const float* __restrict__ h, const float* g0, const float* g1, const float* g2,
    const float* g3, int width0, int width1, int width2, int width3, int count, int rows,
    int chunk_rows, float* __restrict__ partials) {
    extern __shared__ float shared[];
    LINEAR_HEADS_TABLE(const float*, g);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    const int all = width0 + width1 + width2 + width3;
    float* gs = shared;
    int* head = (int*)(shared + chunk_rows * all);
    int* col = head + all;
    const int columns = linear_heads_columns(width, count, head, col);
    const int chunks = (rows + chunk_rows - 1) / chunk_rows;
    for (int q = blockIdx.x; q < chunks; q += gridDim.x) {
        const int begin = q * chunk_rows;
        const int n = min(chunk_rows, rows - begin);
        __syncthreads();
        linear_heads_stage(g, width, head, col, nullptr, columns, begin, n, gs);
        __syncthreads();
        for (int k = threadIdx.x; k <= TRIDENT_H; k += blockDim.x) {
            float* out = partials + ((long long)q * (TRIDENT_H + 1) + k) * columns;
            for (int s0 = 0; s0 < columns; s0 += LINEAR_HEADS_COLS) {
                float acc[LINEAR_HEADS_COLS];
#pragma unroll
                for (int c = 0; c < LINEAR_HEADS_COLS; ++c) acc[c] = 0.0f;
#pragma unroll 4
                for (int r = 0; r < n; ++r) {
                    const float x =
                        k < TRIDENT_H ? h[(long long)(begin + r) * TRIDENT_H + k] : 1.0f;
#pragma unroll
                    for (int c = 0; c < LINEAR_HEADS_COLS; ++c) {
                        if (s0 + c < columns) acc[c] += x * gs[r * columns + s0 + c];
                    }
                }
#pragma unroll
                for (int c = 0; c < LINEAR_HEADS_COLS; ++c) {
                    if (s0 + c < columns) out[s0 + c] = acc[c];
                }
            }
        }
    }
}

// grad_W_j[k, c] = Σ_q partials[q, k, s] (k < TRIDENT_H), grad_b_j[c] = the same at
// k = TRIDENT_H, chunks ascending, s the column of (j, c). One thread per output.
extern "C" __global__ void linear_heads_grad_reduce(const float* __restrict__ partials,
                                                    int chunks, int width0, int width1,
                                                    int width2, int width3, int count,
                                                    float* gW0, float* gW1, float* gW2,
                                                    float* gW3, float* gb0, float* gb1,
                                                    float* gb2, float* gb3) {
    LINEAR_HEADS_TABLE(float*, gW);
    LINEAR_HEADS_TABLE(float*, gb);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    int columns = 0;
    for (int j = 0; j < count; ++j) columns += width[j];
    const long long outputs = (long long)(TRIDENT_H + 1) * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < outputs;
         i += stride) {
        float sum = 0.0f;
#pragma unroll 8  // the loads issue together; the adds stay in chunk order
        for (int q = 0; q < chunks; ++q) sum += partials[(long long)q * outputs + i];
        const int k = (int)(i / columns);
        int s = (int)(i % columns), j = 0;
        while (s >= width[j]) s -= width[j++];
        if (k < TRIDENT_H) {
            gW[j][k * width[j] + s] = sum;
        } else {
            gb[j][s] = sum;
        }
    }
}
