// Shared device helpers for Trident's kernels: default dimension defines, Philox4x32-10 and the
// mappings of its words to [0, 1) and [0, n), bit-identical to service/backend/philox.py.
// Everything here compiles under NVRTC (no system headers) and under nvcc, device and host.
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

// A draw in [0, 1) from the top 24 bits of u: (u >> 8) * 2^-24, exact in float32.
__host__ __device__ __forceinline__ float trident_uniform01(unsigned int u) {
    return (float)(u >> 8) * 5.9604644775390625e-08f;  // 2^-24
}

// An integer in [0, n) by multiply-shift: (u * n) >> 32 (bias < n / 2^32), as philox.below.
__host__ __device__ __forceinline__ unsigned int trident_below(unsigned int u, unsigned int n) {
    return (unsigned int)(((unsigned long long)u * n) >> 32);
}
