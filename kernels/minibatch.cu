// PPO minibatch order: the rollout rows sorted by a Philox key each, so an epoch's minibatches
// are a seeded permutation drawn on the device (the host would spend ~2 µs per row on it).
// Twin: numpy_ops.minibatch_order (argsort, stable, of word 0 of Philox counter
// (i, seq_lo, MINIBATCH = 1, seq_hi)). Here each row gets the unique 64-bit sort key
// (word0 << 32) | i, so any sort of them gives the stable argsort's order, ties included.
// Wrapped by service/backend/cuda/replay.py; 256-thread blocks, one thread per row.
#include "common.cuh"

static constexpr unsigned int kMinibatchStream = 1u;  // philox.Stream.MINIBATCH

extern "C" __global__ void minibatch_keys(const unsigned int* __restrict__ key,
                                          unsigned int seq_lo, unsigned int seq_hi, int rows,
                                          unsigned long long* __restrict__ keys)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    const uint4 counter = make_uint4((unsigned int)i, seq_lo, kMinibatchStream, seq_hi);
    const uint4 w = trident_philox4x32_10(counter, make_uint2(key[0], key[1]));
    keys[i] = ((unsigned long long)w.x << 32) | (unsigned long long)i;
}
