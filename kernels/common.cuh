// Shared device helpers for Trident's kernels: default dimension defines, Philox4x32-10 and the
// mappings of its words to [0, 1) and [0, n), bit-identical to service/backend/philox.py, and the
// fixed-order single-block sums (no atomics) of the reduction kernels.
// Everything here compiles under NVRTC (no system headers) and under nvcc; the Philox helpers
// on device and host, the block sums on the device.
#pragma once

// Dimensions that shape the work are compile-time defines; the loader passes -DTRIDENT_X=...
// from the trainer's dims. These defaults only let a file compile standalone (nvcc in CI).
#ifndef TRIDENT_D
#define TRIDENT_D 32  // observation features
#endif
#ifndef TRIDENT_H
#define TRIDENT_H 256  // hidden width
#endif
#ifndef TRIDENT_A
#define TRIDENT_A 9  // actions
#endif
#ifndef TRIDENT_Z
#define TRIDENT_Z 51  // C51 atoms
#endif
#ifndef TRIDENT_K
#define TRIDENT_K 4  // auxiliary regression targets
#endif

// Threads per block for the element-wise kernels (wrappers launch with the same number).
#define TRIDENT_BLOCK 256

#define TRIDENT_PHILOX_M0 0xD2511F53u  // round multipliers
#define TRIDENT_PHILOX_M1 0xCD9E8D57u
#define TRIDENT_PHILOX_W0 0x9E3779B9u  // Weyl key increments
#define TRIDENT_PHILOX_W1 0xBB67AE85u

// Philox4x32-10 (Salmon et al., SC'11) of `counter` under `key`.
// One round: (hi0, lo0) = M0 * c.x, (hi1, lo1) = M1 * c.z (32x32 -> 64-bit products);
// c <- (hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0); k <- k + (W0, W1) mod 2^32.
// The 64-bit product is exact on host and device (mul.wide.u32 on the GPU).
__host__ __device__ __forceinline__ uint4 trident_philox4x32_10(uint4 counter, uint2 key) {
    uint4 c = counter;
    uint2 k = key;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const unsigned long long p0 = (unsigned long long)TRIDENT_PHILOX_M0 * c.x;
        const unsigned long long p1 = (unsigned long long)TRIDENT_PHILOX_M1 * c.z;
        const unsigned int hi0 = (unsigned int)(p0 >> 32), lo0 = (unsigned int)p0;
        const unsigned int hi1 = (unsigned int)(p1 >> 32), lo1 = (unsigned int)p1;
        c.x = hi1 ^ c.y ^ k.x;
        c.y = lo1;
        c.z = hi0 ^ c.w ^ k.y;
        c.w = lo0;
        k.x += TRIDENT_PHILOX_W0;  // unsigned wrap-around is the mod 2^32 of the reference
        k.y += TRIDENT_PHILOX_W1;
    }
    return c;
}

// out[0..3] = the four words of trident_philox4x32_10(counter, key).
__device__ __forceinline__ void trident_philox_store(uint4 counter, uint2 key,
                                                     unsigned int* __restrict__ out) {
    const uint4 r = trident_philox4x32_10(counter, key);
    out[0] = r.x;
    out[1] = r.y;
    out[2] = r.z;
    out[3] = r.w;
}

// A draw in [0, 1) from the top 24 bits of u: (u >> 8) * 2^-24, exact in float32.
__host__ __device__ __forceinline__ float trident_uniform01(unsigned int u) {
    return (float)(u >> 8) * 5.9604644775390625e-08f;  // 2^-24
}

// An integer in [0, n) by multiply-shift: (u * n) >> 32 (bias < n / 2^32), as philox.below.
__host__ __device__ __forceinline__ unsigned int trident_below(unsigned int u, unsigned int n) {
    return (unsigned int)(((unsigned long long)u * n) >> 32);
}

// ---------------------------------------------------------------------------------------------
// Fixed-order block sums (no atomics). Launch with exactly THREADS threads per block (a power of
// two); every thread of the block must make the call; `shared` points to THREADS doubles of
// __shared__ memory. The order of the additions depends on THREADS and n only, never on
// scheduling, so the same inputs give the same bits.

// Σ over the block of each thread's `value`: a fixed-shape tree,
// shared[t] += shared[t + half] for half = THREADS / 2, THREADS / 4, ..., 1.
// Every thread gets the total; `shared` may be reused as soon as this returns.
template <int THREADS>
__device__ __forceinline__ double trident_block_tree_sum(double value, double* shared)
{
    static_assert(THREADS > 0 && (THREADS & (THREADS - 1)) == 0, "THREADS: a power of two");
    const int t = threadIdx.x;
    shared[t] = value;
    __syncthreads();
#pragma unroll
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (t < half) shared[t] += shared[t + half];
        __syncthreads();
    }
    const double total = shared[0];
    __syncthreads();  // every thread has read the total before `shared` is written again
    return total;
}

// Σ_{i < n} x[i · stride] in double by one block: thread t adds (double)x[i · stride] for
// i = t, t + THREADS, t + 2 THREADS, ... in index order, then trident_block_tree_sum combines the
// THREADS partial sums. Every thread gets the total. stride = 1 sums a vector; stride = C and
// x = base + c sums column c of a row-major [n, C] array.
template <int THREADS, typename T>
__device__ __forceinline__ double trident_block_strided_sum(const T* x, long long n,
                                                            long long stride, double* shared)
{
    double acc = 0.0;
    for (long long i = threadIdx.x; i < n; i += THREADS) acc += (double)x[i * stride];
    return trident_block_tree_sum<THREADS>(acc, shared);
}

// ---------------------------------------------------------------------------------------------
// Multi-tensor launches (adamw_multi, sumsq_partials_multi, target_refresh_multi): one launch
// covers up to TRIDENT_MAX_TENSORS tensors, each cut into chunks of `chunk` elements with one
// block per chunk, tensor after tensor. block_offsets [count + 1] (int64) holds each tensor's
// first block; a block finds its tensor by a scan (count <= 16) and its element range from
// sizes [count]. Tensor addresses come in uint64 tables (tensor_table.cu, or uploaded once for
// arrays that never move).
#define TRIDENT_MAX_TENSORS 16

struct TridentChunk {
    int tensor;        // which tensor this block works on
    long long begin;   // first element of the chunk
    long long end;     // one past the last element
};

__device__ __forceinline__ TridentChunk trident_block_chunk(const long long* block_offsets,
                                                           const long long* sizes, int count,
                                                           long long chunk)
{
    int t = 0;
    while (t + 1 < count && block_offsets[t + 1] <= (long long)blockIdx.x) ++t;
    const long long begin = ((long long)blockIdx.x - block_offsets[t]) * chunk;
    const long long end = begin + chunk < sizes[t] ? begin + chunk : sizes[t];
    return TridentChunk{t, begin, end};
}
