// The gradient through the encoder's top ReLU, grad_z = grad_h · 1[h > 0]. (The forward's bias
// and ReLU, and the gates of the layers below, are epilogues of gemm_tf32x3.cu.)
// Twin: numpy_ops.bias_relu_bwd. Layout: h, grad_h, grad_z are [rows, TRIDENT_H] row-major.
// Grid-stride over ENCODER_VEC-element groups, any rows >= 0.
#include "common.cuh"

// Four consecutive elements per step when H is a multiple of 4 (float4 loads and stores: the
// arrays are cudaMalloc'd, so 16-byte aligned), one otherwise; the arithmetic per element is
// the same either way.
#define ENCODER_VEC (TRIDENT_H % 4 == 0 ? 4 : 1)

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
