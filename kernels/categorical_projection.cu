// C51 target projection (Bellemare et al. 2017, Dopamine's closed form) and the share of target
// mass clipped at the ends of the support.
//
// Twins (service/backend/numpy_ops.py): categorical_projection, c51_support_clip_ratio.
// Wrapped by service/backend/cuda/c51.py (C51Ops): 256-thread blocks; the *_mean entry
// needs exactly one block of PROJ_REDUCE_THREADS.
//
// Inputs: next_probs p [B, Z] float32 (the target network's distribution at a*), rewards r [B]
// float32, dones [B] uint8 (0/1), horizons k [B] int32 (n-step lengths). γ, v_min and v_max are
// float64 device scalars (`gamma`, `v_min`, `v_max`: one double each, e.g. slices of the device
// hyper-parameter vector, as every hyper-parameter of the ops), read at run time, so a captured
// graph picks up UpdateHyperparams without re-capture.
//
//   z_j  = v_min + j Δz,   Δz = (v_max - v_min) / (Z - 1)
//   Tz_j = r + γ^k (1 - done) z_j                    (a terminal transition's target is r)
//   b_j  = clip((clip(Tz_j, v_min, v_max) - v_min) / Δz, 0, Z - 1)    atom units
//   m_i  = Σ_{j=0..Z-1} clip(1 - |b_j - i|, 0, 1) p_j                 (j in index order)
//
// Exactness: the twin forms z_j in float64 from the float64 v_min, v_max and rounds it, Δz as
// float32(float64 quotient), γ^k as a float32 power of float32(γ), then Tz, b and the weights as
// separate float32 operations, and sums each atom's float32 terms w·p_j in float64 (np.bincount)
// in j order. This kernel does the same operations — with the _rn intrinsics, so neither FMA
// contraction nor fast-math can change a rounding — and a double accumulator, so m matches the
// twin bit for bit wherever γ^k does. γ^k is pow() in double rounded to float32, a correctly
// rounded float32 power (γ = 0, γ = 1 and k = 1 are exact; libm's powf may differ by an ulp).
// Edge cases: when b_j is an integer i the weight of atom i is 1 - 0 = 1 and every other atom's
// weight is ≤ 0, clipped to 0, so the whole mass lands on the atom; Tz beyond either end is
// clipped to v_min / v_max first (b = 0 or Z - 1); done = 1 or γ = 0 gives Tz_j = r for every j.

#include "common.cuh"

#define PROJ_REDUCE_THREADS 256  // block size of c51_support_clip_ratio_mean (a power of two)

// clip that propagates NaN like np.clip (fminf/fmaxf would turn a NaN into a bound).
static __device__ __forceinline__ float proj_clip(float x, float lo, float hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

// γ^k (1 - done), as the twin's float32(γ) ** float32(k) * (1 - float32(done)).
static __device__ __forceinline__ float proj_discount(double gamma, int horizon, unsigned char done)
{
    const float power = (float)pow((double)(float)gamma, (double)horizon);
    return __fmul_rn(power, __fsub_rn(1.0f, (float)done));
}

// z_j = float32(v_min + j Δz) with Δz and the sum in float64, as numpy_ops.c51_support.
static __device__ __forceinline__ float proj_atom(double v_min, double delta, int j)
{
    return (float)__dadd_rn(v_min, __dmul_rn(delta, (double)j));
}

// The float64 hyper-parameters as the twin uses them: Δz = (v_max - v_min) / (Z - 1) in float64
// (for z_j) and float32 (for b_j), the support ends as float32 (for the clips).
struct ProjSupport {
    double v_min, delta;  // float64, for z_j
    float lo, hi, dz;     // float32(v_min), float32(v_max), float32(Δz)
};

static __device__ __forceinline__ ProjSupport proj_support(const double* v_min, const double* v_max)
{
    ProjSupport s;
    s.v_min = v_min[0];
    s.delta = __ddiv_rn(__dsub_rn(v_max[0], v_min[0]), (double)(TRIDENT_Z - 1));
    s.lo = (float)v_min[0];
    s.hi = (float)v_max[0];
    s.dz = (float)s.delta;
    return s;
}

// ---------------------------------------------------------------------------------------------
// A block takes PROJ_ROWS rows at a time (grid-stride): first one thread per row writes γ^k
// (1 - done), then one thread per (row, j) writes b_j and p_j to shared memory, then one thread
// per output atom (row, i) sums its terms over j in index order. The discount is computed once
// per row and b_j once per row instead of once per output atom; the operations and their order
// are the ones above, so m is unchanged bit for bit. Launch PROJ_THREADS threads.
#define PROJ_THREADS 256
#define PROJ_ROWS (TRIDENT_Z >= PROJ_THREADS ? 1 : PROJ_THREADS / TRIDENT_Z)

extern "C" __global__ void categorical_projection(const float* __restrict__ next_probs,
                                                  const float* __restrict__ rewards,
                                                  const unsigned char* __restrict__ dones,
                                                  const int* __restrict__ horizons,
                                                  const double* __restrict__ gamma,
                                                  const double* __restrict__ v_min,
                                                  const double* __restrict__ v_max,
                                                  float* __restrict__ projected, int B)
{
    __shared__ float atoms_b[PROJ_ROWS][TRIDENT_Z];  // b_j, in atom units
    __shared__ float probs[PROJ_ROWS][TRIDENT_Z];    // p_j
    __shared__ float discounts[PROJ_ROWS];           // γ^k (1 - done): one pow() per row
    const ProjSupport s = proj_support(v_min, v_max);
    const float last = (float)(TRIDENT_Z - 1);
    for (long long row0 = (long long)blockIdx.x * PROJ_ROWS; row0 < B;
         row0 += (long long)gridDim.x * PROJ_ROWS) {
        const int n = (int)min((long long)PROJ_ROWS, (long long)B - row0);
        __syncthreads();  // the previous rows' readers are done
        for (int r = threadIdx.x; r < n; r += blockDim.x)
            discounts[r] = proj_discount(gamma[0], horizons[row0 + r], dones[row0 + r]);
        __syncthreads();
        for (int t = threadIdx.x; t < n * TRIDENT_Z; t += blockDim.x) {
            const int r = t / TRIDENT_Z, j = t % TRIDENT_Z;
            const long long b = row0 + r;
            const float z = proj_atom(s.v_min, s.delta, j);
            const float tz = proj_clip(__fadd_rn(rewards[b], __fmul_rn(discounts[r], z)), s.lo, s.hi);
            // The second clip absorbs rounding at the ends of the support.
            atoms_b[r][j] = proj_clip(__fdiv_rn(__fsub_rn(tz, s.lo), s.dz), 0.0f, last);
            probs[r][j] = next_probs[b * TRIDENT_Z + j];
        }
        __syncthreads();
        for (int t = threadIdx.x; t < n * TRIDENT_Z; t += blockDim.x) {
            const int r = t / TRIDENT_Z, i = t % TRIDENT_Z;
            const float atom = (float)i;
            double acc = 0.0;
            for (int j = 0; j < TRIDENT_Z; ++j) {
                // clip(1 - |b_j - i|, 0, 1): nonzero only for i = floor(b_j) and floor(b_j) + 1.
                const float w =
                    proj_clip(__fsub_rn(1.0f, fabsf(__fsub_rn(atoms_b[r][j], atom))), 0.0f, 1.0f);
                acc += (double)__fmul_rn(w, probs[r][j]);
            }
            projected[(row0 + r) * TRIDENT_Z + i] = (float)acc;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ratio_per_row[b] = Σ_j p_j 1[Tz_j < v_min or Tz_j > v_max] with the unclipped Tz_j; one thread
// per row, j in index order. c51_support_clip_ratio_mean then averages the rows.
extern "C" __global__ void c51_support_clip_ratio_rows(const float* __restrict__ next_probs,
                                                       const float* __restrict__ rewards,
                                                       const unsigned char* __restrict__ dones,
                                                       const int* __restrict__ horizons,
                                                       const double* __restrict__ gamma,
                                                       const double* __restrict__ v_min,
                                                       const double* __restrict__ v_max,
                                                       float* __restrict__ ratio_per_row, int B)
{
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const ProjSupport s = proj_support(v_min, v_max);
    const float discount = proj_discount(gamma[0], horizons[b], dones[b]);
    const float r = rewards[b];
    const float* p = next_probs + b * TRIDENT_Z;
    double acc = 0.0;
    for (int j = 0; j < TRIDENT_Z; ++j) {
        const float tz = __fadd_rn(r, __fmul_rn(discount, proj_atom(s.v_min, s.delta, j)));
        if (tz < s.lo || tz > s.hi) acc += (double)p[j];
    }
    ratio_per_row[b] = (float)acc;
}

// ratio[0] = Σ_b ratio_per_row[b] / B. One block of PROJ_REDUCE_THREADS threads: thread t adds
// rows t, t + 256, ... in index order (double), then a fixed-shape shared-memory tree
// (trident_block_strided_sum, common.cuh).
extern "C" __global__ void c51_support_clip_ratio_mean(const float* __restrict__ ratio_per_row,
                                                       float* __restrict__ ratio, int B)
{
    __shared__ double partial[PROJ_REDUCE_THREADS];
    const double total =
        trident_block_strided_sum<PROJ_REDUCE_THREADS>(ratio_per_row, B, 1, partial);
    if (threadIdx.x == 0) ratio[0] = (float)(total / (double)B);
}
