// A Step's statistics, accumulated on the device so a Step reads back one small vector.
// Twin: numpy_ops.step_stats_accumulate. Wrapped by service/backend/cuda/step_stats.py.
//
// totals (float64 [STEP_STATS + 2 + STEP_HEADS]) after an update with flag ok:
//   totals[i]  += ok ? value_i : 0        i < STEP_STATS, value_i = *values[i] (0 when absent)
//   totals[STEP_STATS] += ok;  totals[STEP_STATS + 1] += !ok     (applied, skipped updates)
//   totals[STEP_STATS + 2 + h] = max(itself, value_h non-finite)   h < STEP_HEADS (head losses)
// v0 .. v9: the addresses (0 = absent) of the one-element statistics, float32 except value
// STEP_NORM (the float64 global norm), passed as arguments so nothing is uploaded. With
// first != 0 every total is zeroed first. One thread.
#include "common.cuh"

#define STEP_STATS 10  // update.STATS: 5 head losses, grad norm, entropy, KL, clip share, C51
#define STEP_HEADS 5   // update.LOSS_HEADS, the first STEP_HEADS values
#define STEP_NORM 5    // the float64 value

extern "C" __global__ void step_stats_accumulate(
    double* __restrict__ totals, const unsigned char* __restrict__ ok, unsigned long long v0,
    unsigned long long v1, unsigned long long v2, unsigned long long v3, unsigned long long v4,
    unsigned long long v5, unsigned long long v6, unsigned long long v7, unsigned long long v8,
    unsigned long long v9, int first)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned long long values[STEP_STATS] = {v0, v1, v2, v3, v4, v5, v6, v7, v8, v9};
    const bool applied = ok[0] != 0;
    // The first update of a Step starts from zero: no separate reset (a memset) in the graph.
    for (int i = 0; i < STEP_STATS + 2 + STEP_HEADS; ++i) {
        if (first) totals[i] = 0.0;
    }
    for (int i = 0; i < STEP_STATS; ++i) {
        double v = 0.0;
        if (values[i] != 0ull) {
            v = i == STEP_NORM ? *reinterpret_cast<const double*>(values[i])
                               : (double)*reinterpret_cast<const float*>(values[i]);
        }
        if (applied) totals[i] += v;
        if (i < STEP_HEADS && !((v - v) == 0.0)) totals[STEP_STATS + 2 + i] = 1.0;  // inf or NaN
    }
    totals[STEP_STATS] += applied ? 1.0 : 0.0;
    totals[STEP_STATS + 1] += applied ? 0.0 : 1.0;
}
