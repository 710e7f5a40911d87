// The encoder's gradient over stacked rows: out = [top; λ bottom], the on-policy heads' gradient
// (already weighted by linear_heads_bwd_input) over the C51 head's times λ_q, in one pass
// instead of a scale and two copies. Twin: numpy_ops.grad_h_stack. λ lives in device memory
// (float64 [1]) so changing it never recompiles or re-captures; it is rounded to float32
// before the multiply, as NumPy does with a Python float times a float32 array.
// Layout: top [top_rows, TRIDENT_H], bottom [bottom_rows, TRIDENT_H], out [top_rows +
// bottom_rows, TRIDENT_H], row-major. One thread per element, grid-stride.
#include "common.cuh"

extern "C" __global__ void grad_h_stack(const float* __restrict__ top,
                                        const float* __restrict__ bottom,
                                        const double* __restrict__ weight, int top_rows,
                                        int bottom_rows, float* __restrict__ out) {
    const float w = (float)weight[0];
    const long long split = (long long)top_rows * TRIDENT_H;
    const long long total = split + (long long)bottom_rows * TRIDENT_H;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        out[i] = i < split ? top[i] : w * bottom[i - split];
    }
}
