// Several narrow linear heads on one input h [rows, TRIDENT_H], fused: the policy, value and
// perception heads (widths A, 1, 1, K) are each far too narrow for a GEMM to pay, and run as
// one launch per pass instead of a GEMM, a bias add, a weight GEMM and a bias reduction each.
// Twins: numpy_ops.linear_heads_fwd / linear_heads_bwd (linear_fwd, linear_bwd and
// grad_h_accumulate per head). Up to LINEAR_HEADS_MAX heads; head j has W_j [TRIDENT_H, w_j],
// b_j [w_j], output and gradient [rows, w_j], all row-major. Unused pointer slots are never read.
// No atomics; every sum runs in an order fixed by the shapes.
#include "common.cuh"

#define LINEAR_HEADS_MAX 4
#define LINEAR_HEADS_COLS 16  // output columns accumulated per pass of the partials kernel
#define LINEAR_HEADS_WARPS 8  // rows per block of the forward kernel (one warp per row)
#define LINEAR_HEADS_SLICE ((TRIDENT_H + 31) / 32)

#define LINEAR_HEADS_TABLE(type, name) \
    type const name[LINEAR_HEADS_MAX] = {name##0, name##1, name##2, name##3}

// out_j[r, c] = Σ_k h[r, k] W_j[k, c] + b_j[c]. One warp per row: lane l holds h[r, l + 32 i]
// and the warp sums its lanes' partial dot products with a fixed butterfly.
extern "C" __global__ void __launch_bounds__(32 * LINEAR_HEADS_WARPS)
    linear_heads_fwd(const float* __restrict__ h, const float* W0, const float* W1,
                     const float* W2, const float* W3, const float* b0, const float* b1,
                     const float* b2, const float* b3, float* out0, float* out1, float* out2,
                     float* out3, int width0, int width1, int width2, int width3, int count,
                     int rows) {
    LINEAR_HEADS_TABLE(const float*, W);
    LINEAR_HEADS_TABLE(const float*, b);
    LINEAR_HEADS_TABLE(float*, out);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    const int lane = threadIdx.x % 32;
    const int warps = gridDim.x * LINEAR_HEADS_WARPS;
    for (int r = blockIdx.x * LINEAR_HEADS_WARPS + threadIdx.x / 32; r < rows; r += warps) {
        float hv[LINEAR_HEADS_SLICE];
#pragma unroll
        for (int i = 0; i < LINEAR_HEADS_SLICE; ++i) {
            const int k = lane + 32 * i;
            hv[i] = k < TRIDENT_H ? h[(long long)r * TRIDENT_H + k] : 0.0f;
        }
        for (int j = 0; j < count; ++j) {
            const int w = width[j];
            for (int c = 0; c < w; ++c) {
                float partial = 0.0f;
#pragma unroll
                for (int i = 0; i < LINEAR_HEADS_SLICE; ++i) {
                    const int k = lane + 32 * i;
                    if (k < TRIDENT_H) partial += hv[i] * W[j][k * w + c];
                }
#pragma unroll
                for (int offset = 16; offset > 0; offset /= 2) {
                    partial += __shfl_xor_sync(0xffffffffu, partial, offset);
                }
                if (lane == 0) out[j][(long long)r * w + c] = partial + b[j][c];
            }
        }
    }
}

// grad_h[r, k] = Σ_j λ_j (Σ_c g_j[r, c] W_j[k, c]): the heads' encoder gradients, summed in head
// order with each λ rounded to float32 (grad_h_accumulate's arithmetic). One thread per element.
extern "C" __global__ void linear_heads_bwd_input(const float* g0, const float* g1,
                                                  const float* g2, const float* g3,
                                                  const float* W0, const float* W1,
                                                  const float* W2, const float* W3, int width0,
                                                  int width1, int width2, int width3,
                                                  const double* __restrict__ weights, int count,
                                                  float* __restrict__ grad_h, int rows) {
    LINEAR_HEADS_TABLE(const float*, g);
    LINEAR_HEADS_TABLE(const float*, W);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    float lambda[LINEAR_HEADS_MAX];
#pragma unroll
    for (int j = 0; j < LINEAR_HEADS_MAX; ++j) lambda[j] = j < count ? (float)weights[j] : 0.0f;
    const long long total = (long long)rows * TRIDENT_H;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long r = i / TRIDENT_H;
        const int k = (int)(i % TRIDENT_H);
        float sum = 0.0f;
        for (int j = 0; j < count; ++j) {
            const int w = width[j];
            float dot = 0.0f;
            for (int c = 0; c < w; ++c) dot += g[j][r * w + c] * W[j][k * w + c];
            sum = j == 0 ? lambda[0] * dot : sum + lambda[j] * dot;
        }
        grad_h[i] = sum;
    }
}

// partials[q, k, s] = Σ_{r in chunk q} x[r, k] g[r, s] for k < TRIDENT_H (x = h), and the same
// with x = 1 for k = TRIDENT_H (the bias row), rows ascending. s runs over the heads' columns
// concatenated (head 0's first). Chunk q = rows [q·chunk_rows, (q+1)·chunk_rows); one block per
// chunk (grid-stride), threads over k.
extern "C" __global__ void linear_heads_grad_partials(
    const float* __restrict__ h, const float* g0, const float* g1, const float* g2,
    const float* g3, int width0, int width1, int width2, int width3, int count, int rows,
    int chunk_rows, float* __restrict__ partials) {
    LINEAR_HEADS_TABLE(const float*, g);
    const int width[LINEAR_HEADS_MAX] = {width0, width1, width2, width3};
    int columns = 0;
    for (int j = 0; j < count; ++j) columns += width[j];
    const int chunks = (rows + chunk_rows - 1) / chunk_rows;
    for (int q = blockIdx.x; q < chunks; q += gridDim.x) {
        const int begin = q * chunk_rows;
        const int end = min(rows, begin + chunk_rows);
        for (int k = threadIdx.x; k <= TRIDENT_H; k += blockDim.x) {
            float* out = partials + ((long long)q * (TRIDENT_H + 1) + k) * columns;
            int s0 = 0;
            for (int j = 0; j < count; ++j) {
                const int w = width[j];
                for (int c0 = 0; c0 < w; c0 += LINEAR_HEADS_COLS) {
                    float acc[LINEAR_HEADS_COLS];
#pragma unroll
                    for (int c = 0; c < LINEAR_HEADS_COLS; ++c) acc[c] = 0.0f;
                    for (int r = begin; r < end; ++r) {
                        const float x = k < TRIDENT_H ? h[(long long)r * TRIDENT_H + k] : 1.0f;
                        const float* grow = g[j] + (long long)r * w + c0;
#pragma unroll
                        for (int c = 0; c < LINEAR_HEADS_COLS; ++c) {
                            if (c0 + c < w) acc[c] += x * grow[c];
                        }
                    }
#pragma unroll
                    for (int c = 0; c < LINEAR_HEADS_COLS; ++c) {
                        if (c0 + c < w) out[s0 + c0 + c] = acc[c];
                    }
                }
                s0 += w;
            }
        }
    }
}

// grad_W_j[k, c] = Σ_q partials[q, k, s_j + c] (k < TRIDENT_H), grad_b_j[c] = the same at
// k = TRIDENT_H, chunks ascending. One thread per output.
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
