// Test-only entry: Philox4x32-10 words of n counters, to check common.cuh against
// service/backend/philox.py bit for bit (tests/gpu/test_core_kernels.py).
#include "common.cuh"

// out[i] = philox4x32_10(counters[i], (key0, key1)) for counters, out [n, 4] uint32.
extern "C" __global__ void philox_test(const unsigned int* __restrict__ counters, int n,
                                       unsigned int key0, unsigned int key1,
                                       unsigned int* __restrict__ out) {
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 c;
        c.x = counters[4 * i];
        c.y = counters[4 * i + 1];
        c.z = counters[4 * i + 2];
        c.w = counters[4 * i + 3];
        uint2 key;
        key.x = key0;
        key.y = key1;
        const uint4 r = trident_philox4x32_10(c, key);
        out[4 * i] = r.x;
        out[4 * i + 1] = r.y;
        out[4 * i + 2] = r.z;
        out[4 * i + 3] = r.w;
    }
}
