// AdamW (Loshchilov & Hutter 2019) in torch.optim.AdamW's arithmetic, and the device step counter.
// Twins: numpy_ops.adamw_step / advance_counter. Hyper-parameters are float64 device scalars
// (lr, β1, β2, ε, wd), so UpdateHyperparams never recompiles or re-captures; every constant is
// formed in float64 and rounded to float32 exactly where NumPy rounds it.
// Compiled with --fmad=false, so no multiply-add below is contracted and each float32 operation
// rounds as NumPy's does.
#include "common.cuh"

// In place, one thread per element, nothing written unless ok[0]:
//   g = s·grad (s = grad_scale[0], the global-norm clip coefficient);
//   θ ← θ (1 - lr·wd);  m ← β1 m + (1-β1) g;  v ← β2 v + (1-β2) g²;
//   θ ← θ - (lr / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + ε),  t = step[0] (advanced).
extern "C" __global__ void adamw_step(float* __restrict__ param, const float* __restrict__ grad,
                                      float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                                      const long long* __restrict__ step,
                                      const double* __restrict__ lr,
                                      const double* __restrict__ beta1,
                                      const double* __restrict__ beta2,
                                      const double* __restrict__ eps,
                                      const double* __restrict__ weight_decay,
                                      const double* __restrict__ grad_scale,
                                      const unsigned char* __restrict__ ok, long long n) {
    if (ok[0] == 0) {
        return;  // the non-finite guard: parameters and moments stay untouched
    }
    const double lr_d = lr[0], b1 = beta1[0], b2 = beta2[0];
    const double t = (double)step[0];
    const float scale = (float)grad_scale[0];
    const float decay = (float)(1.0 - lr_d * weight_decay[0]);
    const float b1_f = (float)b1, one_minus_b1 = (float)(1.0 - b1);
    const float b2_f = (float)b2, one_minus_b2 = (float)(1.0 - b2);
    const double bias1 = 1.0 - pow(b1, t);             // 1 - β1^t
    const float bias2_sqrt = (float)sqrt(1.0 - pow(b2, t));  // sqrt(1 - β2^t)
    const float step_size = (float)(lr_d / bias1);     // lr / (1 - β1^t)
    const float eps_f = (float)eps[0];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = grad[i] * scale;
        const float p = param[i] * decay;
        const float m = exp_avg[i] * b1_f + one_minus_b1 * g;
        const float v = exp_avg_sq[i] * b2_f + (one_minus_b2 * g) * g;
        const float denom = sqrtf(v) / bias2_sqrt + eps_f;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        param[i] = p - (step_size * m) / denom;
    }
}

// counter[0] += 1 when ok[0] (the AdamW step t and the target-refresh clock). One thread.
extern "C" __global__ void advance_counter(long long* __restrict__ counter,
                                           const unsigned char* __restrict__ ok) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && ok[0] != 0) {
        counter[0] += 1;
    }
}
