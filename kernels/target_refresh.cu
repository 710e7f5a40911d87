// Target-network refresh after an applied update. Twin: numpy_ops.target_refresh. tau is a
// float64 device scalar:
//   tau > 0: Polyak θ' ← θ'·(1 - τ) + τ·θ every update (two float32 roundings, as NumPy);
//   else:    θ' ← θ when updates[0] (already advanced) is a multiple of period (>= 1).
// Nothing is written when ok[0] == 0.
#include "common.cuh"

static __device__ __forceinline__ bool target_refresh_now(const long long* updates, int period,
                                                          double tau, const unsigned char* ok)
{
    return ok[0] != 0 && (tau > 0.0 || updates[0] % period == 0);
}

// Up to TRIDENT_MAX_TENSORS tensor pairs in one launch: address tables (uint64 [count]) of
// targets and online twins; common.cuh's multi-tensor block layout (a block per chunk).
extern "C" __global__ void target_refresh_multi(const unsigned long long* __restrict__ targets,
                                                const unsigned long long* __restrict__ onlines,
                                                const long long* __restrict__ block_offsets,
                                                const long long* __restrict__ sizes, int count,
                                                long long chunk,
                                                const long long* __restrict__ updates, int period,
                                                const double* __restrict__ tau,
                                                const unsigned char* __restrict__ ok) {
    const double tau_d = tau[0];
    if (!target_refresh_now(updates, period, tau_d, ok)) {
        return;
    }
    const bool polyak = tau_d > 0.0;
    const float keep = (float)(1.0 - tau_d), take = (float)tau_d;
    const TridentChunk part = trident_block_chunk(block_offsets, sizes, count, chunk);
    float* target = reinterpret_cast<float*>(targets[part.tensor]);
    const float* online = reinterpret_cast<const float*>(onlines[part.tensor]);
    for (long long i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        target[i] = polyak ? target[i] * keep + take * online[i] : online[i];
    }
}
