// Test-only entry: Philox4x32-10 words of n counters, to check common.cuh against
// service/backend/philox.py bit for bit (tests/gpu/test_core_kernels.py).
#include "common.cuh"

// out[i] = philox4x32_10(counters[i], (key0, key1)) for counters, out [n, 4] uint32.
extern "C" __global__ void philox_test(const unsigned int* __restrict__ counters, int n,
                                       unsigned int key0, unsigned int key1,
                                       unsigned int* __restrict__ out) {
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 c = make_uint4(counters[4 * i], counters[4 * i + 1], counters[4 * i + 2],
                                   counters[4 * i + 3]);
        trident_philox_store(c, make_uint2(key0, key1), out + 4 * i);
    }
}
