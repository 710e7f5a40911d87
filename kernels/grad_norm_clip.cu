// Global-norm and per-group gradient clipping and the non-finite guard, without atomics.
// Twins: numpy_ops.global_norm, group_norms, clip_coefficient, all_finite.
//
// ‖g‖² over many tensors: each tensor is cut into fixed chunks of TRIDENT_REDUCE_CHUNK elements;
// sumsq_partials_multi writes one float64 partial per chunk (fixed per-thread order, then a
// fixed-shape shared-memory tree), every tensor's partials one after another in one buffer, and
// sumsq_finalize reduces that buffer with a fixed shape too. The result depends only on the
// tensors' sizes and order, never on scheduling: the same gradients give the same bits.
// Launch every kernel here with exactly TRIDENT_REDUCE_THREADS threads per block.
#include "common.cuh"

#define TRIDENT_REDUCE_THREADS 256
#define TRIDENT_REDUCE_ITEMS 8  // elements per thread per chunk
#define TRIDENT_REDUCE_CHUNK (TRIDENT_REDUCE_THREADS * TRIDENT_REDUCE_ITEMS)

// IEEE-754 exponent test (no math-header dependence): finite iff the exponent is not all ones.
__device__ __forceinline__ bool trident_finite_f32(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}
__device__ __forceinline__ bool trident_finite_f64(double x) {
    return (__double_as_longlong(x) & 0x7ff0000000000000LL) != 0x7ff0000000000000LL;
}

// Σ (double)x[i]² over chunk `chunk_index` of x (n elements): fixed per-thread order, then the
// fixed-shape tree s[t] += s[t + half], half = 128, 64, ... Called by every thread of a block.
static __device__ __forceinline__ double sumsq_chunk(const float* __restrict__ x, long long n,
                                                     long long chunk_index, double* s) {
    const long long base = chunk_index * TRIDENT_REDUCE_CHUNK + threadIdx.x;
    double acc = 0.0;
#pragma unroll
    for (int k = 0; k < TRIDENT_REDUCE_ITEMS; ++k) {
        const long long i = base + (long long)k * TRIDENT_REDUCE_THREADS;
        if (i < n) {
            const double v = (double)x[i];
            acc += v * v;
        }
    }
    return trident_block_tree_sum<TRIDENT_REDUCE_THREADS>(acc, s);
}

// partials[b] = Σ (double)x[i]² over block b's chunk of one of `count` tensors (address table,
// uint64 [count]), tensor after tensor: a tensor's partials depend on its size alone.
// Grid = block_offsets[count] (common.cuh's layout; chunk must be TRIDENT_REDUCE_CHUNK).
extern "C" __global__ void sumsq_partials_multi(const unsigned long long* __restrict__ tensors,
                                                const long long* __restrict__ block_offsets,
                                                const long long* __restrict__ sizes, int count,
                                                long long chunk, double* __restrict__ partials) {
    __shared__ double s[TRIDENT_REDUCE_THREADS];
    const TridentChunk part = trident_block_chunk(block_offsets, sizes, count, chunk);
    const float* x = reinterpret_cast<const float*>(tensors[part.tensor]);
    const double total =
        sumsq_chunk(x, sizes[part.tensor], part.begin / TRIDENT_REDUCE_CHUNK, s);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

// norm[0] = sqrt(Σ partials) with one block: thread t sums partials t, t+256, ... in order,
// then the fixed tree. A non-finite gradient makes the norm inf or NaN (never finite).
extern "C" __global__ void sumsq_finalize(const double* __restrict__ partials, long long count,
                                          double* __restrict__ norm) {
    __shared__ double s[TRIDENT_REDUCE_THREADS];
    const double total = trident_block_strided_sum<TRIDENT_REDUCE_THREADS>(partials, count, 1, s);
    if (threadIdx.x == 0) {
        norm[0] = sqrt(total);
    }
}

// The norms of G groups of consecutive tensors and of all of them, from the partials buffer of
// sumsq_partials_multi: block g < G reduces partials [offsets[g], offsets[g + 1]) into
// norms[g]; block G reduces [0, offsets[G]) into norms[G] exactly as sumsq_finalize does (the
// same bits as the global norm). Grid = G + 1 blocks.
extern "C" __global__ void sumsq_group_finalize(const double* __restrict__ partials,
                                                const long long* __restrict__ offsets, int groups,
                                                double* __restrict__ norms) {
    __shared__ double s[TRIDENT_REDUCE_THREADS];
    const int g = blockIdx.x;
    const long long begin = g < groups ? offsets[g] : 0;
    const long long end = g < groups ? offsets[g + 1] : offsets[groups];
    const double total =
        trident_block_strided_sum<TRIDENT_REDUCE_THREADS>(partials + begin, end - begin, 1, s);
    if (threadIdx.x == 0) {
        norms[g] = sqrt(total);
    }
}

// coef[i] = min(1, max_norm / (‖g‖_i + 1e-6)) in float64 for each of n norms
// (torch.nn.utils.clip_grad_norm_); a NaN quotient propagates as np.minimum does (fmin would
// return 1). One thread.
extern "C" __global__ void clip_coefficient(const double* __restrict__ norm,
                                            const double* __restrict__ max_norm,
                                            double* __restrict__ coef, long long n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (long long i = 0; i < n; ++i) {
            const double q = max_norm[0] / (norm[i] + 1e-6);
            coef[i] = (q < 1.0 || q != q) ? q : 1.0;
        }
    }
}

#define TRIDENT_FINITE_SMALL 8     // small arrays all_finite_finalize checks itself
#define TRIDENT_FINITE_SMALL_MAX 1024  // elements of an array it counts as small

__device__ __forceinline__ bool trident_finite(float x) { return trident_finite_f32(x); }
__device__ __forceinline__ bool trident_finite(double x) { return trident_finite_f64(x); }

// flags[k] = 1 when every element of chunk k of x is finite, else 0 (__syncthreads_and is a
// block-wide vote, not an atomic). grid = ceil(n / TRIDENT_REDUCE_CHUNK) exactly.
template <typename T>
__device__ __forceinline__ void finite_partials(const T* __restrict__ x, long long n,
                                                unsigned char* __restrict__ flags) {
    const long long base = (long long)blockIdx.x * TRIDENT_REDUCE_CHUNK + threadIdx.x;
    int ok = 1;
#pragma unroll
    for (int k = 0; k < TRIDENT_REDUCE_ITEMS; ++k) {
        const long long i = base + (long long)k * TRIDENT_REDUCE_THREADS;
        if (i < n && !trident_finite(x[i])) {
            ok = 0;
        }
    }
    ok = __syncthreads_and(ok);
    if (threadIdx.x == 0) {
        flags[blockIdx.x] = (unsigned char)(ok != 0);
    }
}

extern "C" __global__ void finite_partials_f32(const float* __restrict__ x, long long n,
                                               unsigned char* __restrict__ flags) {
    finite_partials(x, n, flags);
}

extern "C" __global__ void finite_partials_f64(const double* __restrict__ x, long long n,
                                               unsigned char* __restrict__ flags) {
    finite_partials(x, n, flags);
}

// ok[0] = 1 when every flag is 1 and every element of the small arrays s0..s7 is finite
// (count and small may be 0: nothing to check is all finite). The small arrays (losses, the
// norm, the guard: a few elements each) are checked here rather than one launch each; bit j
// of f64_mask marks s_j as double. Unused slots are never read. One block.
extern "C" __global__ void all_finite_finalize(
    const unsigned char* __restrict__ flags, long long count, const void* s0, const void* s1,
    const void* s2, const void* s3, const void* s4, const void* s5, const void* s6,
    const void* s7, long long n0, long long n1, long long n2, long long n3, long long n4,
    long long n5, long long n6, long long n7, int f64_mask, int small,
    unsigned char* __restrict__ ok) {
    const void* const arrays[TRIDENT_FINITE_SMALL] = {s0, s1, s2, s3, s4, s5, s6, s7};
    const long long sizes[TRIDENT_FINITE_SMALL] = {n0, n1, n2, n3, n4, n5, n6, n7};
    int all = 1;
    for (long long i = threadIdx.x; i < count; i += TRIDENT_REDUCE_THREADS) {
        if (flags[i] == 0) {
            all = 0;
        }
    }
    for (int j = 0; j < small && j < TRIDENT_FINITE_SMALL; ++j) {
        for (long long i = threadIdx.x; i < sizes[j]; i += TRIDENT_REDUCE_THREADS) {
            const bool finite = (f64_mask >> j) & 1
                                    ? trident_finite(((const double*)arrays[j])[i])
                                    : trident_finite(((const float*)arrays[j])[i]);
            if (!finite) {
                all = 0;
            }
        }
    }
    all = __syncthreads_and(all);
    if (threadIdx.x == 0) {
        ok[0] = (unsigned char)(all != 0);
    }
}
