// Act: choose an action per observation from the policy logits or the C51 Q-values, with the
// same Philox draws as the NumPy trainer (service/trainer/trainer.py, Trainer.act).
//
// Twin (service/backend/numpy_ops.py): sample_categorical (inverse-CDF sampling from given
// uniforms). act_select has no single twin: it is Trainer.act's action choice after the
// forward passes. Wrapped by service/backend/cuda/act.py (ActOps); 256-thread blocks.
//
// Layouts: logits [N, A] float32 (policy head), q_values [N, A] float32 (E[Z(s, a)], read only
// by the Q modes), actions [N] int32, log_probs [N] float32 (log π(a|s) of the returned action,
// whatever the mode, as ActResult.log_probs). key: uint32 [2] = (seed low, seed high) words;
// sequence: int64 [1] = the act_calls counter of this call (the caller advances it) — both in
// device memory so a captured Act graph sees each call's values.
//
// Modes (ACT_MODE_*; Trainer's ActMode):
//   SAMPLE          a = inverse-CDF sample of π with u = uniform01(word 0) of Philox counter
//                   (i, seq_lo, ACT_SAMPLE = 3, seq_hi)
//   GREEDY_PI       a = first argmax_a logits (np.argmax: ties to the lowest index, NaN wins)
//   GREEDY_Q        a = first argmax_a q_values
//   EPSILON_GREEDY  greedy-Q, except where the coin of counter (i, seq_lo, ACT_EXPLORE = 4,
//                   seq_hi) comes up explore (word 0, see below): then a = below(word 1, A)
//
// The ε coin, exactly as the host: Trainer.act explores when uniform01(word0, float64) < ε,
// i.e. (word0 >> 8) · 2^-24 < ε in float64 with ε the Python float. Here ε is a float64 device
// scalar (`epsilon`, one double, e.g. a slice of the device hyper-parameter vector) and the
// kernel forms the same float64 product (exact: a 24-bit integer times a power of two) and the
// same float64 compare, so the coin agrees with the host for every ε. (A float32 compare against
// float32(ε) would not: when ε is not representable in float32, a draw between ε and float32(ε)
// would flip.) The random action is below(word 1, A) = ⌊word1 · A / 2^32⌋.
//
// Roundings: the loader compiles with --fmad=false and IEEE division; the _rn intrinsics below
// pin the sampling path's roundings (the twin's separate float32 operations) regardless.

#include "common.cuh"

#define ACT_MODE_SAMPLE 0
#define ACT_MODE_GREEDY_PI 1
#define ACT_MODE_GREEDY_Q 2
#define ACT_MODE_EPSILON_GREEDY 3

static constexpr unsigned int kActStreamSample = 3u;   // philox.Stream.ACT_SAMPLE
static constexpr unsigned int kActStreamExplore = 4u;  // philox.Stream.ACT_EXPLORE

static __device__ __forceinline__ float act_nan() { return __int_as_float(0x7fc00000); }

static __device__ __forceinline__ float act_nanmax(float m, float v)  // as np.max
{
    return (v > m || v != v) ? v : m;
}

// First index of the maximum, as np.argmax: the lowest index among ties; the first NaN wins.
static __device__ __forceinline__ int act_argmax(const float* x)
{
    int best = 0;
    float best_value = x[0];
    for (int a = 1; a < TRIDENT_A && best_value == best_value; ++a) {
        if (x[a] > best_value || x[a] != x[a]) {
            best = a;
            best_value = x[a];
        }
    }
    return best;
}

// max_a l_a and log Σ_a exp(l_a - max), actions in index order (numpy_ops.log_softmax).
static __device__ __forceinline__ void act_log_norm(const float* x, float* max_out,
                                                    float* log_norm_out)
{
    float m = x[0];
    for (int a = 1; a < TRIDENT_A; ++a) m = act_nanmax(m, x[a]);
    float sum = 0.0f;
    for (int a = 0; a < TRIDENT_A; ++a) sum = __fadd_rn(sum, expf(__fsub_rn(x[a], m)));
    *max_out = m;
    *log_norm_out = logf(sum);
}

// Inverse-CDF sample as numpy_ops.sample_categorical: π = exp(log_softmax(l)), cdf = running
// sum of π in action order (float32), threshold = u · cdf[A-1]; the action is the number of
// cdf entries <= threshold (the first whose running sum exceeds it), at most A - 1.
static __device__ __forceinline__ int act_sample(const float* x, float m, float log_norm, float u)
{
    float total = 0.0f;
    for (int a = 0; a < TRIDENT_A; ++a)
        total = __fadd_rn(total, expf(__fsub_rn(__fsub_rn(x[a], m), log_norm)));
    const float threshold = __fmul_rn(u, total);
    float cdf = 0.0f;
    int picks = 0;
    for (int a = 0; a < TRIDENT_A; ++a) {
        cdf = __fadd_rn(cdf, expf(__fsub_rn(__fsub_rn(x[a], m), log_norm)));
        picks += cdf <= threshold ? 1 : 0;
    }
    return picks < TRIDENT_A - 1 ? picks : TRIDENT_A - 1;
}

static __device__ __forceinline__ uint4 act_draw(const unsigned int* key, unsigned long long seq,
                                                 unsigned int index, unsigned int stream)
{
    const uint4 counter = make_uint4(index, (unsigned int)(seq & 0xffffffffull), stream,
                                     (unsigned int)(seq >> 32));
    return trident_philox4x32_10(counter, make_uint2(key[0], key[1]));
}

// ---------------------------------------------------------------------------------------------
// One thread per observation i < N.
extern "C" __global__ void act_select(const float* __restrict__ logits,
                                      const float* __restrict__ q_values, int mode,
                                      const double* __restrict__ epsilon,
                                      const unsigned int* __restrict__ key,
                                      const long long* __restrict__ sequence,
                                      int* __restrict__ actions, float* __restrict__ log_probs,
                                      int N)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float* x = logits + i * TRIDENT_A;
    float m, log_norm;
    act_log_norm(x, &m, &log_norm);
    const unsigned long long seq = (unsigned long long)sequence[0];
    int action;
    switch (mode) {
        case ACT_MODE_SAMPLE: {
            const uint4 w = act_draw(key, seq, (unsigned int)i, kActStreamSample);
            action = act_sample(x, m, log_norm, trident_uniform01(w.x));
            break;
        }
        case ACT_MODE_GREEDY_PI:
            action = act_argmax(x);
            break;
        case ACT_MODE_GREEDY_Q:
            action = act_argmax(q_values + i * TRIDENT_A);
            break;
        case ACT_MODE_EPSILON_GREEDY: {
            action = act_argmax(q_values + i * TRIDENT_A);
            const uint4 w = act_draw(key, seq, (unsigned int)i, kActStreamExplore);
            const double u = (double)(w.x >> 8) * 5.9604644775390625e-08;  // 2^-24, exact
            if (u < epsilon[0]) action = (int)trident_below(w.y, TRIDENT_A);
            break;
        }
        default:  // not a mode: the wrapper never launches this
            actions[i] = -1;
            log_probs[i] = act_nan();
            return;
    }
    actions[i] = action;
    log_probs[i] = __fsub_rn(__fsub_rn(x[action], m), log_norm);  // log_softmax(l)[action]
}

// ---------------------------------------------------------------------------------------------
// numpy_ops.sample_categorical with explicit uniforms [N] in [0, 1); one thread per row.
extern "C" __global__ void sample_categorical(const float* __restrict__ logits,
                                              const float* __restrict__ uniforms,
                                              int* __restrict__ actions, int N)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float* x = logits + i * TRIDENT_A;
    float m, log_norm;
    act_log_norm(x, &m, &log_norm);
    actions[i] = act_sample(x, m, log_norm, uniforms[i]);
}
