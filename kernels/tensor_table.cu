// Device tables of tensor addresses for the multi-tensor kernels (common.cuh): the addresses
// arrive as kernel arguments, so a table of arrays that are allocated inside a captured CUDA
// graph (gradients) is written by the graph itself, with no host upload.
// Twin: none (addresses are a device matter); wrapped by service/backend/cuda/tensor_table.py.
// One thread; slots >= count are left unwritten.
#include "common.cuh"

extern "C" __global__ void tensor_table(unsigned long long* __restrict__ table, int count,
                                        unsigned long long a0, unsigned long long a1,
                                        unsigned long long a2, unsigned long long a3,
                                        unsigned long long a4, unsigned long long a5,
                                        unsigned long long a6, unsigned long long a7,
                                        unsigned long long a8, unsigned long long a9,
                                        unsigned long long a10, unsigned long long a11,
                                        unsigned long long a12, unsigned long long a13,
                                        unsigned long long a14, unsigned long long a15)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned long long all[TRIDENT_MAX_TENSORS] = {a0, a1, a2,  a3,  a4,  a5,  a6,  a7,
                                                         a8, a9, a10, a11, a12, a13, a14, a15};
    for (int t = 0; t < count && t < TRIDENT_MAX_TENSORS; ++t) table[t] = all[t];
}
