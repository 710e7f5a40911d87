// Row-major float32 GEMMs on the tensor cores at float32 accuracy (3xTF32), with the encoder's
// epilogues fused. Twins: numpy_ops.matmul; bias_relu_fwd(matmul(x, W), b) for the bias_relu
// epilogue; bias_relu_bwd(h, linear_bwd_input(W, g)) for the relu_gate epilogue.
// A bench experiment, not shipped: bench/gemm.py (bench/README.md) measured it slower than
// cuBLAS SGEMM at the update's K = 256 products, and the update on it slower than on cuBLAS.
// Compiled by bench/tensor_core_gemm.py with the product's NVRTC options and kernels/ on the
// include path.
//
//   C = A B       A [M, K], B [K, N]  (gemm_tf32x3_nn_*)
//   C = A Bᵀ      A [M, K], B [N, K]  (gemm_tf32x3_nt_*)
//
// 3xTF32: each float x splits into big = tf32(x) (the top 11 significand bits) and
// small = tf32(x - big) (the next 11; x - big is exact), and a·b is accumulated as
// a_small·b_big + a_big·b_small + a_big·b_big on mma.sync.m16n8k8 (tf32 in, float32 out); the
// dropped a_small·b_small term is below 2^-22 of |a·b|. Accuracy is near a float32 GEMM's (at
// most 8.2e-7 of max Σ|a||b| measured, cuBLAS SGEMM 2.5e-7), far from plain TF32's (2^-11 a
// product). A non-finite input gives a non-finite output (inf splits into inf and NaN), never a
// finite one: the step's guard would still see it.
//
// Tiles: BM x 128 outputs per block of 256 threads (8 warps as 2 x 4, each a BM/2 x 32 tile of
// m16n8 fragments), K in steps of 16 through a 3-stage cp.async ring in dynamic shared memory.
// Every output element has one writer and the K order is fixed: the same inputs give the same
// bits, run after run, eager or replayed. Any M, N, K >= 0 work: out-of-range tile elements are
// zero-filled by cp.async and never stored. Rows are copied 16 bytes at a time when the row
// length is a multiple of 4 floats and the array starts on 16 bytes, 4 bytes at a time
// otherwise. Launch: grid (ceil(N / 128), ceil(M / BM)), block 256, dynamic shared memory
// shared_bytes(BM, layout) (bench/tensor_core_gemm.py; above 48 KB for BM = 128, so the
// caller opts in).
#include "common.cuh"

#define GEMM_THREADS 256
#define GEMM_BN 128
#define GEMM_BK 16
#define GEMM_STAGES 3
#define GEMM_KROW (GEMM_BK + 4)   // floats per row of a [rows][BK] tile: fragment reads hit 32 banks
#define GEMM_NROW (GEMM_BN + 8)   // floats per row of the NN layout's [BK][BN] tile of B

enum GemmEpilogue { GEMM_PLAIN = 0, GEMM_BIAS_RELU = 1, GEMM_RELU_GATE = 2 };

// ------------------------------------------------------------------------------- primitives
__device__ __forceinline__ unsigned gemm_shared_address(const void* p) {
    unsigned address;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(address) : "l"(p));
    return address;
}

// 16 bytes global -> shared; `bytes` < 16 zero-fills the rest (0: all zeros, nothing read).
__device__ __forceinline__ void gemm_copy16(float* dst, const float* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(gemm_shared_address(dst)), "l"(src), "r"(bytes));
}

// 4 bytes global -> shared; bytes = 0 writes a zero and reads nothing.
__device__ __forceinline__ void gemm_copy4(float* dst, const float* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(gemm_shared_address(dst)), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void gemm_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void gemm_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING));
}

__device__ __forceinline__ unsigned gemm_tf32(float x) {
    unsigned t;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(t) : "f"(x));
    return t;
}

// x = big + small, both tf32 (small from the exact remainder x - big).
__device__ __forceinline__ void gemm_split(float x, unsigned& big, unsigned& small) {
    big = gemm_tf32(x);
    small = gemm_tf32(x - __uint_as_float(big));
}

// d += a b on one m16n8k8 fragment (tf32 operands, float32 accumulators).
__device__ __forceinline__ void gemm_mma(float (&d)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ------------------------------------------------------------------------------- tile copies
// rows [row0, row0 + ROWS) x columns [col0, col0 + COLS) of a row-major [rows, cols] matrix into
// tile[ROWS][STRIDE]; elements outside the matrix become zeros. A's tile is ROWS x BK of
// [M, K] (also B's under nt, of [N, K]); B's under nn is BK x BN of [K, N].
template <int ROWS, int COLS, int STRIDE>
__device__ __forceinline__ void gemm_load_tile(float* tile, const float* src, int rows, int cols,
                                               int row0, int col0, bool vec) {
    const int t = threadIdx.x;
    if (vec) {
        constexpr int CHUNKS = ROWS * COLS / 4;
#pragma unroll
        for (int c = t; c < CHUNKS; c += GEMM_THREADS) {
            const int r = c / (COLS / 4), col = (c % (COLS / 4)) * 4;
            const int gr = row0 + r, gc = col0 + col;
            const bool in = gr < rows && gc < cols;  // cols % 4 == 0: all in or all out
            gemm_copy16(tile + r * STRIDE + col, in ? src + (long long)gr * cols + gc : src,
                        in ? 16 : 0);
        }
    } else {
        constexpr int ELEMENTS = ROWS * COLS;
#pragma unroll 4
        for (int e = t; e < ELEMENTS; e += GEMM_THREADS) {
            const int r = e / COLS, col = e % COLS;
            const int gr = row0 + r, gc = col0 + col;
            const bool in = gr < rows && gc < cols;
            gemm_copy4(tile + r * STRIDE + col, in ? src + (long long)gr * cols + gc : src,
                       in ? 4 : 0);
        }
    }
}

// ------------------------------------------------------------------------------- the kernel
template <int BM, bool B_NK>
struct GemmShape {
    static constexpr int MT = BM / 32;                  // m16 fragments per warp (2 warps in M)
    static constexpr int A_FLOATS = BM * GEMM_KROW;
    static constexpr int B_FLOATS = B_NK ? GEMM_BN * GEMM_KROW : GEMM_BK * GEMM_NROW;
    static constexpr int STAGE_FLOATS = A_FLOATS + B_FLOATS;
};

// B_NK: B is [N, K] (C = A Bᵀ), else [K, N]. `side` is the bias [N] (GEMM_BIAS_RELU) or the
// gate [M, N] (GEMM_RELU_GATE: C = (A Bᵀ) · 1[side > 0]); unused for GEMM_PLAIN.
template <int BM, bool B_NK, int EPILOGUE>
__device__ __forceinline__ void gemm_tf32x3(const float* __restrict__ A,
                                            const float* __restrict__ B,
                                            const float* __restrict__ side,
                                            float* __restrict__ C, int M, int N, int K) {
    using S = GemmShape<BM, B_NK>;
    extern __shared__ __align__(16) float gemm_shared[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;           // fragment row group, thread in group
    const int warp_m = warp >> 2, warp_n = warp & 3;     // 2 x 4 warps
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * GEMM_BN;
    const bool vec_a = (K % 4 == 0) && ((unsigned long long)A % 16 == 0);
    const bool vec_b = ((B_NK ? K : N) % 4 == 0) && ((unsigned long long)B % 16 == 0);

    float acc[S::MT][4][4];
#pragma unroll
    for (int i = 0; i < S::MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    auto load = [&](int stage, int tile) {
        float* a_tile = gemm_shared + stage * S::STAGE_FLOATS;
        float* b_tile = a_tile + S::A_FLOATS;
        const int k0 = tile * GEMM_BK;
        gemm_load_tile<BM, GEMM_BK, GEMM_KROW>(a_tile, A, M, K, m0, k0, vec_a);
        if (B_NK) {
            gemm_load_tile<GEMM_BN, GEMM_BK, GEMM_KROW>(b_tile, B, N, K, n0, k0, vec_b);
        } else {
            gemm_load_tile<GEMM_BK, GEMM_BN, GEMM_NROW>(b_tile, B, K, N, k0, n0, vec_b);
        }
    };

    const int tiles = (K + GEMM_BK - 1) / GEMM_BK;
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < tiles) load(s, s);
        gemm_commit();  // empty groups too: the wait count below stays exact
    }

    for (int tile = 0; tile < tiles; ++tile) {
        gemm_wait<GEMM_STAGES - 2>();  // this thread's copies of `tile` have landed
        __syncthreads();  // everyone's have, and everyone is done with the stage refilled next
        const int next = tile + GEMM_STAGES - 1;
        if (next < tiles) load(next % GEMM_STAGES, next);
        gemm_commit();

        const float* a_tile = gemm_shared + (tile % GEMM_STAGES) * S::STAGE_FLOATS;
        const float* b_tile = a_tile + S::A_FLOATS;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 8) {
            unsigned a_big[S::MT][4], a_small[S::MT][4], b_big[4][2], b_small[4][2];
#pragma unroll
            for (int i = 0; i < S::MT; ++i) {
                const float* a = a_tile + (warp_m * (BM / 2) + i * 16 + gid) * GEMM_KROW + kk + tig;
                gemm_split(a[0], a_big[i][0], a_small[i][0]);                  // (gid, tig)
                gemm_split(a[8 * GEMM_KROW], a_big[i][1], a_small[i][1]);      // (gid + 8, tig)
                gemm_split(a[4], a_big[i][2], a_small[i][2]);                  // (gid, tig + 4)
                gemm_split(a[8 * GEMM_KROW + 4], a_big[i][3], a_small[i][3]);  // (gid + 8, tig + 4)
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = warp_n * 32 + j * 8 + gid;  // b fragment: (k = tig [+ 4], n = gid)
                if (B_NK) {
                    const float* b = b_tile + n * GEMM_KROW + kk + tig;
                    gemm_split(b[0], b_big[j][0], b_small[j][0]);
                    gemm_split(b[4], b_big[j][1], b_small[j][1]);
                } else {
                    const float* b = b_tile + (kk + tig) * GEMM_NROW + n;
                    gemm_split(b[0], b_big[j][0], b_small[j][0]);
                    gemm_split(b[4 * GEMM_NROW], b_big[j][1], b_small[j][1]);
                }
            }
#pragma unroll
            for (int i = 0; i < S::MT; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    gemm_mma(acc[i][j], a_small[i], b_big[j]);
                    gemm_mma(acc[i][j], a_big[i], b_small[j]);
                    gemm_mma(acc[i][j], a_big[i], b_big[j]);
                }
        }
    }
    gemm_wait<0>();  // no copy outlives the block (the trailing groups are empty)

    // Accumulator e of fragment (i, j): row gid (+ 8 for e >= 2), columns 2 tig, 2 tig + 1.
#pragma unroll
    for (int i = 0; i < S::MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = m0 + warp_m * (BM / 2) + i * 16 + gid + 8 * half;
                const int c = n0 + warp_n * 32 + j * 8 + 2 * tig;
                if (r >= M) continue;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (c + e >= N) continue;
                    const long long at = (long long)r * N + c + e;
                    float v = acc[i][j][2 * half + e];
                    if (EPILOGUE == GEMM_BIAS_RELU) {
                        v = v + side[c + e];
                        v = (v > 0.0f || v != v) ? v : 0.0f;  // as encoder.cu: NaN stays NaN
                    } else if (EPILOGUE == GEMM_RELU_GATE) {
                        v = v * (side[at] > 0.0f ? 1.0f : 0.0f);  // a product: inf · 0 = NaN
                    }
                    C[at] = v;
                }
            }
}

// The entries: layout (nn, nt), epilogue, BM (128 for large grids, 64 to fill the SMs when a
// 128-row grid would leave them idle). 256 threads; 1 block per SM at BM = 128, 2 at BM = 64.
#define GEMM_ENTRY(NAME, BM, B_NK, EPILOGUE, MIN_BLOCKS)                                      \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, MIN_BLOCKS)                     \
        NAME(const float* __restrict__ A, const float* __restrict__ B,                         \
             const float* __restrict__ side, float* __restrict__ C, int M, int N, int K) {     \
        gemm_tf32x3<BM, B_NK, EPILOGUE>(A, B, side, C, M, N, K);                               \
    }

GEMM_ENTRY(gemm_tf32x3_nn_128, 128, false, GEMM_PLAIN, 1)
GEMM_ENTRY(gemm_tf32x3_nn_64, 64, false, GEMM_PLAIN, 2)
GEMM_ENTRY(gemm_tf32x3_nn_bias_relu_128, 128, false, GEMM_BIAS_RELU, 1)
GEMM_ENTRY(gemm_tf32x3_nn_bias_relu_64, 64, false, GEMM_BIAS_RELU, 2)
GEMM_ENTRY(gemm_tf32x3_nt_128, 128, true, GEMM_PLAIN, 1)
GEMM_ENTRY(gemm_tf32x3_nt_64, 64, true, GEMM_PLAIN, 2)
GEMM_ENTRY(gemm_tf32x3_nt_relu_gate_128, 128, true, GEMM_RELU_GATE, 1)
GEMM_ENTRY(gemm_tf32x3_nt_relu_gate_64, 64, true, GEMM_RELU_GATE, 2)
