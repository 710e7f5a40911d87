// Encoder gradient from the heads: out = Σ_{i < count} λ_i g_i, added in head order.
// Twin: numpy_ops.grad_h_accumulate. Up to 8 heads; unused pointer slots are never read.
// The λ_i live in device memory (float64 [count]) so changing them never recompiles or
// re-captures; each is rounded to float32 before the multiply, as NumPy does with a Python
// float times a float32 array.
#include "common.cuh"

#define TRIDENT_MAX_HEADS 8

extern "C" __global__ void grad_h_accumulate(const float* __restrict__ g0,
                                             const float* __restrict__ g1,
                                             const float* __restrict__ g2,
                                             const float* __restrict__ g3,
                                             const float* __restrict__ g4,
                                             const float* __restrict__ g5,
                                             const float* __restrict__ g6,
                                             const float* __restrict__ g7,
                                             const double* __restrict__ weights, int count,
                                             float* __restrict__ out, long long n) {
    const float* const grads[TRIDENT_MAX_HEADS] = {g0, g1, g2, g3, g4, g5, g6, g7};
    float w[TRIDENT_MAX_HEADS];
#pragma unroll
    for (int j = 0; j < TRIDENT_MAX_HEADS; ++j) {
        w[j] = j < count ? (float)weights[j] : 0.0f;
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        // total = λ_0 g_0, then total = total + λ_j g_j for j = 1..count-1 (NumPy's order).
        float total = w[0] * g0[i];
#pragma unroll
        for (int j = 1; j < TRIDENT_MAX_HEADS; ++j) {
            if (j < count) {
                total = total + w[j] * grads[j][i];
            }
        }
        out[i] = total;
    }
}
