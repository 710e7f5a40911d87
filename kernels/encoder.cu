// Encoder layer epilogue: the bias add and ReLU fused after the GEMM z = x W (cuBLAS, in Python).
// Twins: numpy_ops.bias_relu_fwd / bias_relu_bwd. Layout: z, h, grad_h, grad_z are [rows, TRIDENT_H]
// row-major, b is [TRIDENT_H]. One thread per element, grid-stride, any rows >= 0.
#include "common.cuh"

// h = max(z + b, 0). NaN propagates as in np.maximum (fmaxf would drop it and hide a
// non-finite activation from the guard); -0 becomes +0 as np.maximum(-0.0, 0) does.
extern "C" __global__ void bias_relu_fwd(const float* __restrict__ z, const float* __restrict__ b,
                                         float* __restrict__ h, int rows) {
    const long long total = (long long)rows * TRIDENT_H;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const float v = z[i] + b[i % TRIDENT_H];
        h[i] = (v > 0.0f || v != v) ? v : 0.0f;
    }
}

// grad_z = grad_h · 1[h > 0] (ReLU'(0) = 0). A product, not a select, as the twin: a non-finite
// grad_h stays non-finite (inf · 0 = NaN) where the unit is off, so the guard still sees it.
extern "C" __global__ void bias_relu_bwd(const float* __restrict__ h,
                                         const float* __restrict__ grad_h,
                                         float* __restrict__ grad_z, int rows) {
    const long long total = (long long)rows * TRIDENT_H;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        grad_z[i] = grad_h[i] * (h[i] > 0.0f ? 1.0f : 0.0f);
    }
}
