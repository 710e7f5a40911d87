// Generalised advantage estimation over a time-major rollout [T, N]. Twin: numpy_ops.gae.
//   δ_t = r_t + γ V(s_{t+1}) (1 - term_t) - V(s_t)
//   Â_t = δ_t + γλ (1 - done_t) Â_{t+1},  done_t = term_t | trunc_t,  R_t = Â_t + V(s_t)
// The recursion is a dependency chain over t, so one thread per env walks t = T-1..0.
// γ and λ are float64 device scalars; γ and the product γλ are rounded to float32 as NumPy
// rounds a Python float meeting a float32 array. Flags are uint8 (or bool) bytes.
#include "common.cuh"

extern "C" __global__ void gae(const float* __restrict__ rewards, const float* __restrict__ values,
                               const float* __restrict__ next_values,
                               const unsigned char* __restrict__ terminated,
                               const unsigned char* __restrict__ truncated,
                               const double* __restrict__ gamma, const double* __restrict__ lam,
                               float* __restrict__ advantages, float* __restrict__ returns, int T,
                               int N) {
    const float g = (float)gamma[0];
    const float gl = (float)(gamma[0] * lam[0]);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long env = (long long)blockIdx.x * blockDim.x + threadIdx.x; env < N;
         env += stride) {
        float running = 0.0f;  // Â_T = 0
        for (int t = T - 1; t >= 0; --t) {
            const long long i = (long long)t * N + env;
            const unsigned char term = terminated[i];
            const float not_term = 1.0f - (float)term;
            const float not_done = 1.0f - (float)(term | truncated[i]);
            const float v = values[i];
            const float delta = (rewards[i] + (g * next_values[i]) * not_term) - v;
            running = delta + (gl * not_done) * running;
            advantages[i] = running;
            returns[i] = running + v;
        }
    }
}
