// The encoder's gradient over stacked rows: out = [top; λ bottom], the on-policy heads' gradient
// (already weighted by linear_heads_bwd_input) over the C51 head's times λ_q, in one pass
// instead of a scale and two copies. Twin: numpy_ops.grad_h_stack. λ lives in device memory
// (float64 [1]) so changing it never recompiles or re-captures; it is rounded to float32
// before the multiply, as NumPy does with a Python float times a float32 array.
// Layout: top [top_rows, TRIDENT_H], bottom [bottom_rows, TRIDENT_H], out [top_rows +
// bottom_rows, TRIDENT_H], row-major. Grid-stride over GRAD_H_VEC-element groups: four
// consecutive elements (float4 loads and stores) when H is a multiple of 4, so a group never
// straddles top and bottom; the arithmetic per element is the same either way.
#include "common.cuh"

#define GRAD_H_VEC (TRIDENT_H % 4 == 0 ? 4 : 1)

extern "C" __global__ void grad_h_stack(const float* __restrict__ top,
                                        const float* __restrict__ bottom,
                                        const double* __restrict__ weight, int top_rows,
                                        int bottom_rows, float* __restrict__ out) {
    const float w = (float)weight[0];
    const long long split = (long long)top_rows * TRIDENT_H / GRAD_H_VEC;
    const long long total = split + (long long)bottom_rows * TRIDENT_H / GRAD_H_VEC;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        if (GRAD_H_VEC == 4) {
            if (i < split) {
                reinterpret_cast<float4*>(out)[i] = reinterpret_cast<const float4*>(top)[i];
            } else {
                const float4 v = reinterpret_cast<const float4*>(bottom)[i - split];
                reinterpret_cast<float4*>(out)[i] = make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
            }
        } else {
            out[i] = i < split ? top[i] : w * bottom[i - split];
        }
    }
}
