// Encoder layer epilogue: the bias add and ReLU fused after the GEMM z = x W (cuBLAS, in Python).
// Twins: numpy_ops.bias_relu_fwd / bias_relu_bwd. Layout: z, h, grad_h, grad_z are [rows, TRIDENT_H]
// row-major, b is [TRIDENT_H]. Grid-stride over ENCODER_VEC-element groups, any rows >= 0.
#include "common.cuh"

// Four consecutive elements per step when H is a multiple of 4 (float4 loads and stores: the
// arrays are cudaMalloc'd, so 16-byte aligned), one otherwise; the arithmetic per element is
// the same either way.
#define ENCODER_VEC (TRIDENT_H % 4 == 0 ? 4 : 1)

// h = max(z + b, 0). NaN propagates as in np.maximum (fmaxf would drop it and hide a
// non-finite activation from the guard); -0 becomes +0 as np.maximum(-0.0, 0) does.
__device__ __forceinline__ float encoder_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

extern "C" __global__ void bias_relu_fwd(const float* __restrict__ z, const float* __restrict__ b,
                                         float* __restrict__ h, int rows) {
    const long long total = (long long)rows * TRIDENT_H / ENCODER_VEC;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        if (ENCODER_VEC == 4) {
            const float4 v = reinterpret_cast<const float4*>(z)[i];
            const float4 c = reinterpret_cast<const float4*>(b)[i % (TRIDENT_H / 4)];
            reinterpret_cast<float4*>(h)[i] = make_float4(
                encoder_relu(v.x + c.x), encoder_relu(v.y + c.y), encoder_relu(v.z + c.z),
                encoder_relu(v.w + c.w));
        } else {
            h[i] = encoder_relu(z[i] + b[i % TRIDENT_H]);
        }
    }
}

// grad_z = grad_h · 1[h > 0] (ReLU'(0) = 0). A product, not a select, as the twin: a non-finite
// grad_h stays non-finite (inf · 0 = NaN) where the unit is off, so the guard still sees it.
__device__ __forceinline__ float encoder_gate(float g, float x) { return g * (x > 0.0f ? 1.0f : 0.0f); }

extern "C" __global__ void bias_relu_bwd(const float* __restrict__ h,
                                         const float* __restrict__ grad_h,
                                         float* __restrict__ grad_z, int rows) {
    const long long total = (long long)rows * TRIDENT_H / ENCODER_VEC;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        if (ENCODER_VEC == 4) {
            const float4 x = reinterpret_cast<const float4*>(h)[i];
            const float4 g = reinterpret_cast<const float4*>(grad_h)[i];
            reinterpret_cast<float4*>(grad_z)[i] =
                make_float4(encoder_gate(g.x, x.x), encoder_gate(g.y, x.y),
                            encoder_gate(g.z, x.z), encoder_gate(g.w, x.w));
        } else {
            grad_z[i] = encoder_gate(grad_h[i], h[i]);
        }
    }
}
