// float32 -> bfloat16 (the high 16 bits, rounded to nearest, ties to even) for the bf16
// precision's cuBLAS GEMMs (service/backend/cuda/gemm.py), which read bf16 operands and
// accumulate in fp32. cuBLAS's own CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands gave the
// TF32 bytes on the H200, so the operands are rounded here. NaN stays NaN (quiet bit set);
// ±inf and values that round past the largest bf16 become ±inf, as IEEE rounding does.
// Twin: none in numpy_ops (the NumPy backend computes in fp32); tests/gpu/test_precision.py
// rounds the same bits in NumPy. One thread per element, grid-stride.
#include "common.cuh"

extern "C" __global__ void round_to_bf16(const float* __restrict__ x, long long n,
                                         unsigned short* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned int bits = __float_as_uint(x[i]);
        const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
        const unsigned int rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
        out[i] = (unsigned short)(nan ? ((bits >> 16) | 0x40u) : (rounded >> 16));
    }
}
