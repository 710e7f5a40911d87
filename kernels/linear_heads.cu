// Several narrow linear heads on one input h [rows, TRIDENT_H], fused: the policy, value and
// perception heads (widths A, 1, 1, K) are each far too narrow for a GEMM to pay, and run as
// one launch per pass instead of a GEMM, a bias add, a weight GEMM and a bias reduction each.
// Twins: numpy_ops.linear_heads_fwd, linear_heads_bwd_input (grad_h_accumulate of the heads'
// linear_bwd_input) and linear_heads_bwd_params (linear_bwd_params per head). Up to
// LINEAR_HEADS_MAX heads; head j has W_j [TRIDENT_H, w_j], b_j [w_j], output and gradient
// [rows, w_j], all row-major; the heads' S = Σ w_j columns are numbered s = 0..S-1, head 0's
// first. Unused pointer slots are never read.
// Every kernel works on tiles of rows staged in dynamic shared memory (the wrapper sizes them);
// no atomics, and every sum runs in an order fixed by the shapes.
#include "common.cuh"

#define LINEAR_HEADS_MAX 4
#define LINEAR_HEADS_TILE 16  // rows per tile: linear_heads_bwd_input's accumulators, and at most
                              // that many in linear_heads_fwd
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

// out_j[r, c] = Σ_k h[r, k] W_j[k, c] + b_j[c]. A block takes tile_rows rows at a time
// (grid-stride) and stages, k_chunk features at a time, those rows of h and the heads' W
// columns (transposed: column s is a row of ws) in dynamic shared memory, both with row
// stride k_chunk + 1 (no bank conflicts); each (row, column) output belongs to one thread (at
// most LINEAR_HEADS_OUT per thread: the wrapper keeps tile_rows·S within that many blocks'
// worth), which sums k in four interleaved partial sums added in a fixed order at the end.
// k_chunk is a multiple of 4. Shared: (tile_rows + S)·(k_chunk + 1) floats + 2·S ints.
#define LINEAR_HEADS_OUT 2

extern "C" __global__ void linear_heads_fwd(const float* __restrict__ h, const float* W0,
                                            const float* W1, const float* W2, const float* W3,
                                            const float* b0, const float* b1, const float* b2,
                                            const float* b3, float* out0, float* out1,
                                            float* out2, float* out3, int width0, int width1,
                                            int width2, int width3, int count, int rows,
                                            int tile_rows, int k_chunk) {
    extern __shared__ float shared[];
    LINEAR_HEADS_TABLE(const float*, W);
    LINEAR_HEADS_TABLE(const float*, b);
    LINEAR_HEADS_TABLE(float*, out);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    const int all = width0 + width1 + width2 + width3;
    const int stride = k_chunk + 1;
    float* hs = shared;
    float* ws = hs + tile_rows * stride;
    int* head = (int*)(ws + all * stride);
    int* col = head + all;
    const int columns = linear_heads_columns(width, count, head, col);
    for (int row0 = blockIdx.x * tile_rows; row0 < rows; row0 += gridDim.x * tile_rows) {
        const int n = min(tile_rows, rows - row0);
        float p[LINEAR_HEADS_OUT][4];
#pragma unroll
        for (int m = 0; m < LINEAR_HEADS_OUT; ++m)
            p[m][0] = p[m][1] = p[m][2] = p[m][3] = 0.0f;
        for (int k0 = 0; k0 < TRIDENT_H; k0 += k_chunk) {
            const int kn = min(k_chunk, TRIDENT_H - k0);
            __syncthreads();  // the table is written; the previous stage's readers are done
            for (int i = threadIdx.x; i < n * kn; i += blockDim.x) {
                const int r = i / kn, k = i % kn;
                hs[r * stride + k] = h[(long long)(row0 + r) * TRIDENT_H + k0 + k];
            }
            for (int i = threadIdx.x; i < columns * kn; i += blockDim.x) {
                const int c = i / kn, k = i % kn, j = head[c];
                ws[c * stride + k] = W[j][(long long)(k0 + k) * width[j] + col[c]];
            }
            __syncthreads();
#pragma unroll
            for (int m = 0; m < LINEAR_HEADS_OUT; ++m) {
                const int o = threadIdx.x + m * blockDim.x;
                if (o >= n * columns) continue;
                const float* x = hs + (o / columns) * stride;
                const float* w = ws + (o % columns) * stride;
                int k = 0;
                for (; k + 4 <= kn; k += 4) {
                    p[m][0] += x[k] * w[k];
                    p[m][1] += x[k + 1] * w[k + 1];
                    p[m][2] += x[k + 2] * w[k + 2];
                    p[m][3] += x[k + 3] * w[k + 3];
                }
                for (; k < kn; ++k) p[m][0] += x[k] * w[k];  // only in the last chunk
            }
        }
#pragma unroll
        for (int m = 0; m < LINEAR_HEADS_OUT; ++m) {
            const int o = threadIdx.x + m * blockDim.x;
            if (o >= n * columns) continue;
            const int r = o / columns, s = o % columns, j = head[s], c = col[s];
            out[j][(long long)(row0 + r) * width[j] + c] =
                ((p[m][0] + p[m][1]) + (p[m][2] + p[m][3])) + b[j][c];
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
