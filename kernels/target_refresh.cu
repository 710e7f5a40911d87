// Target-network refresh after an applied update. Twin: numpy_ops.target_refresh (called once
// per tensor pair by the wrapper, in the twin's order). tau is a float64 device scalar:
//   tau > 0: Polyak θ' ← θ'·(1 - τ) + τ·θ every update (two float32 roundings, as NumPy);
//   else:    θ' ← θ when updates[0] (already advanced) is a multiple of period (>= 1).
// Nothing is written when ok[0] == 0. One thread per element, grid-stride.
#include "common.cuh"

extern "C" __global__ void target_refresh(float* __restrict__ target,
                                          const float* __restrict__ online,
                                          const long long* __restrict__ updates, int period,
                                          const double* __restrict__ tau,
                                          const unsigned char* __restrict__ ok, long long n) {
    if (ok[0] == 0) {
        return;
    }
    const double tau_d = tau[0];
    const bool polyak = tau_d > 0.0;
    if (!polyak && updates[0] % period != 0) {
        return;
    }
    const float keep = (float)(1.0 - tau_d), take = (float)tau_d;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        target[i] = polyak ? target[i] * keep + take * online[i] : online[i];
    }
}
