// AdamW (Loshchilov & Hutter 2019) in torch.optim.AdamW's arithmetic, and the device step counter.
// Twins: numpy_ops.adamw_step / advance_counter. Hyper-parameters are float64 device scalars
// (lr, β1, β2, ε, wd), so UpdateHyperparams never recompiles or re-captures; every constant is
// formed in float64 and rounded to float32 exactly where NumPy rounds it.
// Compiled with --fmad=false, so no multiply-add below is contracted and each float32 operation
// rounds as NumPy's does.
#include "common.cuh"

// The per-tensor constants of one AdamW update, formed in float64 and rounded where NumPy rounds.
struct AdamwConstants {
    float scale, decay, b1, one_minus_b1, b2, one_minus_b2, bias2_sqrt, step_size, eps;
};

static __device__ __forceinline__ AdamwConstants adamw_constants(
    long long step, double lr, double beta1, double beta2, double eps, double weight_decay,
    double grad_scale)
{
    const double t = (double)step;
    AdamwConstants c;
    c.scale = (float)grad_scale;
    c.decay = (float)(1.0 - lr * weight_decay);
    c.b1 = (float)beta1;
    c.one_minus_b1 = (float)(1.0 - beta1);
    c.b2 = (float)beta2;
    c.one_minus_b2 = (float)(1.0 - beta2);
    c.bias2_sqrt = (float)sqrt(1.0 - pow(beta2, t));     // sqrt(1 - β2^t)
    c.step_size = (float)(lr / (1.0 - pow(beta1, t)));  // lr / (1 - β1^t)
    c.eps = (float)eps;
    return c;
}

static __device__ __forceinline__ void adamw_element(const AdamwConstants& c, float* param,
                                                     const float* grad, float* exp_avg,
                                                     float* exp_avg_sq, long long i)
{
    const float g = grad[i] * c.scale;
    const float p = param[i] * c.decay;
    const float m = exp_avg[i] * c.b1 + c.one_minus_b1 * g;
    const float v = exp_avg_sq[i] * c.b2 + (c.one_minus_b2 * g) * g;
    const float denom = sqrtf(v) / c.bias2_sqrt + c.eps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - (c.step_size * m) / denom;
}

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
    const AdamwConstants c = adamw_constants(step[0], lr[0], beta1[0], beta2[0], eps[0],
                                             weight_decay[0], grad_scale[0]);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        adamw_element(c, param, grad, exp_avg, exp_avg_sq, i);
    }
}

// adamw_step over `count` tensors in one launch (the same arithmetic, so the same bits): tables
// of addresses (uint64 [count]) of each tensor's param, grad, exp_avg, exp_avg_sq (float32),
// step (int64 [1], its group's counter, advanced), weight decay and gradient scale (float64 [1]:
// the clip coefficient of its norm group); one block per chunk of `chunk` elements (common.cuh's
// multi-tensor layout).
extern "C" __global__ void adamw_multi(const unsigned long long* __restrict__ params,
                                       const unsigned long long* __restrict__ grads,
                                       const unsigned long long* __restrict__ exp_avgs,
                                       const unsigned long long* __restrict__ exp_avg_sqs,
                                       const unsigned long long* __restrict__ steps,
                                       const unsigned long long* __restrict__ weight_decays,
                                       const unsigned long long* __restrict__ grad_scales,
                                       const long long* __restrict__ block_offsets,
                                       const long long* __restrict__ sizes, int count,
                                       long long chunk, const double* __restrict__ lr,
                                       const double* __restrict__ beta1,
                                       const double* __restrict__ beta2,
                                       const double* __restrict__ eps,
                                       const unsigned char* __restrict__ ok) {
    if (ok[0] == 0) {
        return;
    }
    const TridentChunk part = trident_block_chunk(block_offsets, sizes, count, chunk);
    const int t = part.tensor;
    const long long step = *reinterpret_cast<const long long*>(steps[t]);
    const double wd = *reinterpret_cast<const double*>(weight_decays[t]);
    const double scale = *reinterpret_cast<const double*>(grad_scales[t]);
    const AdamwConstants c = adamw_constants(step, lr[0], beta1[0], beta2[0], eps[0], wd, scale);
    float* param = reinterpret_cast<float*>(params[t]);
    const float* grad = reinterpret_cast<const float*>(grads[t]);
    float* exp_avg = reinterpret_cast<float*>(exp_avgs[t]);
    float* exp_avg_sq = reinterpret_cast<float*>(exp_avg_sqs[t]);
    for (long long i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        adamw_element(c, param, grad, exp_avg, exp_avg_sq, i);
    }
}

// counter[0] += 1 when ok[0] (the AdamW step t and the target-refresh clock). One thread.
extern "C" __global__ void advance_counter(long long* __restrict__ counter,
                                           const unsigned char* __restrict__ ok) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && ok[0] != 0) {
        counter[0] += 1;
    }
}

// advance_counter for `count` distinct counters (int64 [1] each, addresses in a uint64 table),
// one thread each (their loads overlap instead of one pointer chase after another); launch at
// least `count` threads in one block.
extern "C" __global__ void advance_counters(const unsigned long long* __restrict__ counters,
                                            int count, const unsigned char* __restrict__ ok) {
    const int t = threadIdx.x;
    if (blockIdx.x == 0 && t < count && ok[0] != 0) *reinterpret_cast<long long*>(counters[t]) += 1;
}
