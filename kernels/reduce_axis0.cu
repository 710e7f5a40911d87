// Σ over the leading (batch) axis of x [rows, cols], row-major. Twin: numpy_ops.reduce_axis0.
// No atomics: each output column has one writing thread that adds its rows in index order
// (exactly NumPy's order for cols >= 2). For many rows the wrapper runs two deterministic
// passes: reduce_axis0_partials sums fixed chunks of rows in order into [chunks, cols], then
// reduce_axis0 sums the chunks in order. The split depends only on the shape, so the same
// inputs give the same bits on every run.
#include "common.cuh"

// Rows loaded ahead of the adds: a thread's sum is one chain of dependent adds, so without
// loads in flight each add waits a full memory latency (the profile's 512-row pass: 28 µs).
#define REDUCE_LOADS_AHEAD 16

// Σ_{r = begin..end-1} x[r, c] (row stride `cols`), r ascending: the loads of each group of
// REDUCE_LOADS_AHEAD rows are issued together, the adds stay in row order.
static __device__ __forceinline__ float column_sum(const float* __restrict__ x, int begin,
                                                   int end, long long cols, long long c) {
    float acc = 0.0f;
    int r = begin;
    for (; r + REDUCE_LOADS_AHEAD <= end; r += REDUCE_LOADS_AHEAD) {
        float v[REDUCE_LOADS_AHEAD];
#pragma unroll
        for (int j = 0; j < REDUCE_LOADS_AHEAD; ++j) v[j] = x[(long long)(r + j) * cols + c];
#pragma unroll
        for (int j = 0; j < REDUCE_LOADS_AHEAD; ++j) acc += v[j];
    }
    for (; r < end; ++r) acc += x[(long long)r * cols + c];
    return acc;
}

// out[c] = Σ_{r = 0..rows-1} x[r, c], r ascending. One thread per column.
extern "C" __global__ void reduce_axis0(const float* __restrict__ x, float* __restrict__ out,
                                        int rows, int cols) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride) {
        out[c] = column_sum(x, 0, rows, cols, c);
    }
}

// partials[k, c] = Σ_{r in chunk k} x[r, c], r ascending; chunk k = rows [k·chunk, (k+1)·chunk).
// Grid: x over columns (grid-stride), y over chunks (one chunk per blockIdx.y, grid-stride).
extern "C" __global__ void reduce_axis0_partials(const float* __restrict__ x,
                                                 float* __restrict__ partials, int rows, int cols,
                                                 int chunk) {
    const int chunks = (rows + chunk - 1) / chunk;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int k = blockIdx.y; k < chunks; k += gridDim.y) {
        const int begin = k * chunk;
        const int end = rows - begin < chunk ? rows : begin + chunk;
        for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += stride) {
            partials[(long long)k * cols + c] = column_sum(x, begin, end, cols, c);
        }
    }
}
