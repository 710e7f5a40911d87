"""The op set on NumPy: the reference twin of every CUDA kernel in `kernels/`.

Each op is a plain function over explicit arrays and scalars, dtype-generic (float32 on the
hot path, float64 in gradient tests). Loss ops reduce by the batch mean and return the
gradient of that mean. Ops named `*_step`, `*_refresh` and `advance_counter` update their
first arguments in place and do nothing when `ok[0] == 0` — the non-finite guard reaches
the optimizer as data, not as host control flow, as it must inside a captured CUDA graph.
No op loops in Python over the batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from service.backend.philox import Stream, below, random_bits, uniform01

Array = np.ndarray
ACT_MODES = ("sample", "greedy_pi", "greedy_q", "epsilon_greedy")  # kernels/act.cu's order


# --------------------------------------------------------------------------- linear layers
def matmul(a: Array, b: Array) -> Array:
    """a @ b for a [M, K], b [K, N]."""
    return a @ b


def linear_fwd(x: Array, W: Array, b: Array) -> Array:
    """y = x W + b for x [B, I], W [I, O], b [O]."""
    return x @ W + b


def linear_bwd_input(W: Array, grad_y: Array) -> Array:
    """grad_x = g Wᵀ: the input half of y = x W + b's backward.

    With one output column g Wᵀ is an outer product: one multiply per element either way, but
    broadcasting is several times faster than OpenBLAS's GEMM at K = 1.
    """
    return grad_y * W.T if W.shape[1] == 1 else grad_y @ W.T


def linear_bwd_params(x: Array, grad_y: Array) -> tuple[Array, Array]:
    """(grad_W = xᵀ g, grad_b = Σ_b g): the parameter half of y = x W + b's backward (all of
    it for a first layer, whose input needs no gradient)."""
    return x.T @ grad_y, reduce_axis0(grad_y)


def linear_heads_fwd(h: Array, Ws: Sequence[Array], bs: Sequence[Array]) -> list[Array]:
    """[h W_j + b_j for each head j]: several narrow heads on one input (one launch on CUDA)."""
    return [linear_fwd(h, W, b) for W, b in zip(Ws, bs, strict=True)]


def linear_heads_bwd_input(
    Ws: Sequence[Array], grad_ys: Sequence[Array], weights: Sequence[float]
) -> Array:
    """grad_h = Σ_j λ_j g_j W_jᵀ of `linear_heads_fwd`, summed in head order as
    `grad_h_accumulate` does: the input half of the heads' backward."""
    grads = [linear_bwd_input(W, g) for W, g in zip(Ws, grad_ys, strict=True)]
    return grad_h_accumulate(grads, weights)


def linear_heads_bwd_params(h: Array, grad_ys: Sequence[Array]) -> tuple[list[Array], list[Array]]:
    """([grad_W_j = hᵀ g_j], [grad_b_j = Σ_b g_j]) of `linear_heads_fwd`: the parameter half,
    a separate op so that the encoder's backward need not wait for it."""
    parts = [linear_bwd_params(h, g) for g in grad_ys]
    return [grad_W for grad_W, _ in parts], [grad_b for _, grad_b in parts]


def bias_relu_fwd(z: Array, b: Array) -> Array:
    """h = max(z + b, 0): the bias add and ReLU fused after the GEMM z = x W."""
    h = z + b
    return np.maximum(h, 0, out=h)


def bias_relu_bwd(h: Array, grad_h: Array) -> Array:
    """Gradient through the fused bias+ReLU: grad_z = grad_h · 1[h > 0] (ReLU'(0) = 0).

    A product rather than a select: a non-finite grad_h anywhere stays non-finite, so the
    non-finite guard sees it even where the unit is off.
    """
    return grad_h * (h > 0)


def reduce_axis0(x: Array) -> Array:
    """Σ over the leading (batch) axis, row after row in index order."""
    return np.add.reduce(x, axis=0)


# --------------------------------------------------------------------------- perception heads
def bce_fwd_bwd(u: Array, y: Array) -> tuple[Array, Array]:
    """Binary cross-entropy with logits u [B] and labels y [B] in {0, 1}.

    loss = mean(softplus(u) - y u); grad_u = (σ(u) - y) / B.
    softplus(u) = max(u, 0) + log1p(exp(-|u|)) never overflows.
    """
    batch = u.shape[0]
    loss = np.mean(np.maximum(u, 0) + np.log1p(np.exp(-np.abs(u))) - y * u)
    sigmoid = 0.5 * (1 + np.tanh(0.5 * u))  # σ(u) without exp overflow
    return loss, (sigmoid - y) / batch


def aux_mse_fwd_bwd(pred: Array, target: Array) -> tuple[Array, Array]:
    """Mean squared error over all B·K entries: loss = mean((p - t)²), grad = 2 (p - t) / (B K)."""
    diff = pred - target
    return np.mean(diff * diff), (2.0 / diff.size) * diff


# --------------------------------------------------------------------------- C51 head
def c51_softmax(logits: Array) -> Array:
    """p = softmax over atoms (last axis) of logits [B, A, Z]."""
    e = logits - np.max(logits, axis=-1, keepdims=True)
    np.exp(e, out=e)
    e /= np.sum(e, axis=-1, keepdims=True)
    return e


def c51_support(v_min: float, v_max: float, num_atoms: int, dtype: np.dtype) -> Array:
    """z_i = v_min + i Δz, Δz = (v_max - v_min) / (Z - 1)."""
    delta = (v_max - v_min) / (num_atoms - 1)
    return (v_min + delta * np.arange(num_atoms, dtype=np.float64)).astype(dtype)


def c51_q_values(probs: Array, support: Array) -> Array:
    """E[Z(s, a)] = Σ_i p_i z_i for probs [B, A, Z] -> [B, A]."""
    return probs @ support


def c51_greedy(logits: Array, bias: Array, support: Array) -> tuple[Array, Array]:
    """(a* [B] int32, p(s, a*) [B, Z]): each row's action of largest E[Z(s, a)] (the first on
    ties) and its distribution, from the head's logits before its bias, [B, A, Z], and the
    bias [A·Z] (added here: one pass over the logits fewer on a GPU)."""
    probs = c51_softmax(logits + bias.reshape(logits.shape[1:]))
    best = np.argmax(c51_q_values(probs, support), axis=1)
    return best.astype(np.int32), probs[np.arange(logits.shape[0]), best]


def _target_atoms(
    next_probs: Array,
    rewards: Array,
    dones: Array,
    horizons: Array,
    gamma: float,
    v_min: float,
    v_max: float,
) -> Array:
    """Unclipped Tz_j = r + γ^k (1 - done) z_j [B, Z] (a terminal transition's target is r)."""
    num_atoms = next_probs.shape[1]
    dtype = next_probs.dtype
    support = c51_support(v_min, v_max, num_atoms, dtype)
    discount = (dtype.type(gamma) ** horizons.astype(dtype)) * (1 - dones.astype(dtype))
    return rewards.astype(dtype)[:, None] + discount[:, None] * support[None, :]


def c51_support_clip_ratio(
    next_probs: Array,
    rewards: Array,
    dones: Array,
    horizons: Array,
    gamma: float,
    v_min: float,
    v_max: float,
) -> Array:
    """Share of target mass whose Tz falls outside [v_min, v_max] and is clipped to an end atom:
    mean over the batch of Σ_j p_j 1[Tz_j ∉ [v_min, v_max]]. Near 0 when the support fits."""
    tz = _target_atoms(next_probs, rewards, dones, horizons, gamma, v_min, v_max)
    outside = (tz < v_min) | (tz > v_max)
    return np.mean(np.sum(next_probs * outside, axis=1))


def categorical_projection(
    next_probs: Array,
    rewards: Array,
    dones: Array,
    horizons: Array,
    gamma: float,
    v_min: float,
    v_max: float,
) -> Array:
    """Project the target distribution onto the support (Bellemare et al. 2017, Dopamine's form).

    Tz_j = clip(r + γ^k (1 - done) z_j, v_min, v_max) for next_probs p [B, Z], per-sample
    n-step horizons k [B]. In atom units b_j = (Tz_j - v_min) / Δz, the closed form is

        m_i = Σ_j clip(1 - |b_j - i|, 0, 1) p_j          (sum over j = 0..Z-1 in order)

    The clip is zero unless i is floor(b_j) or floor(b_j) + 1, so only those two terms are
    formed (a [B, Z] band instead of a [B, Z, Z] tensor), with the same weights and added in
    the same j order as the dense sum. When b_j is an integer, the upper neighbour's weight is
    1 - |b_j - (b_j + 1)| = 0 exactly and atom b_j receives all of p_j.
    """
    batch, num_atoms = next_probs.shape
    dtype = next_probs.dtype
    delta = dtype.type((v_max - v_min) / (num_atoms - 1))
    tz = _target_atoms(next_probs, rewards, dones, horizons, gamma, v_min, v_max)
    tz = np.clip(tz, dtype.type(v_min), dtype.type(v_max))
    # b_j in [0, Z-1]; the second clip absorbs rounding at the ends of the support.
    b = np.clip((tz - dtype.type(v_min)) / delta, 0, num_atoms - 1)
    lower = np.floor(b)
    upper = lower + 1
    w_lower = 1 - np.abs(b - lower)
    w_upper = np.clip(1 - np.abs(b - upper), 0, 1)  # 0 when b is an integer or b = Z-1
    upper_index = np.minimum(upper, num_atoms - 1)  # b = Z-1 adds weight 0 to the last atom
    # Interleave (lower_j, upper_j) for j = 0..Z-1 so bincount adds each atom's terms in j order.
    rows = np.arange(batch)[:, None, None] * num_atoms
    index = rows + np.stack([lower, upper_index], axis=-1).astype(np.int64)
    mass = np.stack([w_lower, w_upper], axis=-1) * next_probs[:, :, None]
    projected = np.bincount(index.ravel(), weights=mass.ravel(), minlength=batch * num_atoms)
    return projected.reshape(batch, num_atoms).astype(dtype)


def c51_cross_entropy_fwd_bwd(logits: Array, actions: Array, target: Array) -> tuple[Array, Array]:
    """C51 loss -Σ_z m_z log p_z(s, a) averaged over the batch, for logits [B, A, Z].

    Returns (loss, grad_taken [B, Z]): the gradient with respect to the taken action's
    logits, (p_z Σm - m_z) / B. The other actions' logits get zero gradient, so they are
    never materialised; `c51_taken_grad_h` and `c51_taken_grad_params` consume the
    taken-action form directly.
    """
    batch = logits.shape[0]
    taken = logits[np.arange(batch), actions]  # [B, Z]
    shifted = taken - np.max(taken, axis=-1, keepdims=True)
    log_norm = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    log_p = shifted - log_norm
    loss = -np.sum(target * log_p) / batch
    mass = np.sum(target, axis=-1, keepdims=True)  # 1 for a projected target
    grad = (np.exp(log_p) * mass - target) / batch
    return loss, grad


def c51_taken_grad_h(W: Array, actions: Array, grad_taken: Array) -> Array:
    """grad_h of logits = h W + b ([B, A·Z]) when only the taken action has a gradient:
    grad_h_row = g_row W[:, a_row·Z:(a_row+1)·Z]ᵀ, one GEMM per action over its rows (never the
    dense [B, A·Z] gradient); a row whose action is outside [0, A) gets none."""
    num_atoms = grad_taken.shape[1]
    grad_h = np.zeros((grad_taken.shape[0], W.shape[0]), dtype=W.dtype)
    for a in range(W.shape[1] // num_atoms):
        rows = np.flatnonzero(actions == a)
        grad_h[rows] = grad_taken[rows] @ W[:, a * num_atoms : (a + 1) * num_atoms].T
    return grad_h


def c51_taken_grad_params(
    h: Array, actions: Array, grad_taken: Array, num_actions: int
) -> tuple[Array, Array]:
    """(grad_W [H, A·Z], grad_b [A·Z]) of logits = h W + b when only the taken action has a
    gradient: grad_W[:, a·Z:(a+1)·Z] = Σ_{rows with action a} h_rowᵀ g_row, grad_b likewise
    (rows in index order). A separate op from `c51_taken_loss_bwd` so that the encoder's
    backward need not wait for it."""
    num_atoms = grad_taken.shape[1]
    width = num_actions * num_atoms
    grad_W = np.zeros((h.shape[1], width), dtype=h.dtype)
    grad_b = np.zeros(width, dtype=h.dtype)
    for a in range(num_actions):
        rows = np.flatnonzero(actions == a)
        cols = slice(a * num_atoms, (a + 1) * num_atoms)
        g = grad_taken[rows]
        grad_W[:, cols] = h[rows].T @ g
        grad_b[cols] = reduce_axis0(g)
    return grad_W, grad_b


def c51_taken_loss_bwd(
    h: Array, W: Array, b: Array, actions: Array, target: Array
) -> tuple[Array, Array, Array]:
    """The C51 head on replayed transitions, forward and backward to its input, computing only
    each row's taken action: logits = h W[:, a·Z:(a+1)·Z] + b[a·Z:(a+1)·Z], the cross-entropy
    against the target m, and (loss, grad_h [B, H], grad_taken [B, Z]); `c51_taken_grad_params`
    turns grad_taken into the weight gradients. The other A - 1 actions' logits are never
    formed (they get no gradient). A row whose action is outside [0, A) has a NaN loss and no
    gradient (a zero grad_taken row)."""
    num_atoms = target.shape[1]
    logits = np.full((h.shape[0], 1, num_atoms), np.nan, dtype=h.dtype)
    for a in range(W.shape[1] // num_atoms):
        rows = np.flatnonzero(actions == a)
        cols = slice(a * num_atoms, (a + 1) * num_atoms)
        logits[rows, 0] = h[rows] @ W[:, cols] + b[cols]
    loss, grad_taken = c51_cross_entropy_fwd_bwd(logits, np.zeros_like(actions), target)
    valid = (actions >= 0) & (actions < W.shape[1] // num_atoms)
    grad_taken[~valid] = 0
    return loss, c51_taken_grad_h(W, actions, grad_taken), grad_taken


# --------------------------------------------------------------------------- PPO policy head
def log_softmax(logits: Array) -> Array:
    """log softmax over the last axis."""
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    shifted -= np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return shifted


def ppo_surrogate_fwd_bwd(
    logits: Array,
    actions: Array,
    behavior_log_probs: Array,
    advantages: Array,
    clip_eps: float,
    ent_coef: float,
) -> tuple[dict[str, Array], Array]:
    """PPO clipped surrogate with entropy bonus, for policy logits [B, A].

    ratio = exp(log π(a) - log π_old(a));
    loss = mean(-min(ratio Â, clip(ratio, 1-ε, 1+ε) Â)) - c_ent mean(H(π)).
    Returns ({loss, pg_loss, entropy, approx_kl, clip_fraction}, grad_logits [B, A]).
    approx_kl is the k3 estimator mean((ratio - 1) - log ratio) (Schulman 2020).
    """
    batch = logits.shape[0]
    rows = np.arange(batch)
    log_p = log_softmax(logits)
    p = np.exp(log_p)
    log_ratio = log_p[rows, actions] - behavior_log_probs
    ratio = np.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    pg_loss = np.mean(-np.minimum(unclipped, clipped))
    entropy_each = -np.sum(p * log_p, axis=-1)
    entropy = np.mean(entropy_each)

    # d(-min)/d log π(a) = -Â·ratio where the unclipped term is the minimum. Where the clipped
    # term is strictly smaller, ratio lies outside [1-ε, 1+ε] (inside it the terms are equal),
    # so the clip is flat there and the gradient is 0.
    d_logp_a = np.where(unclipped <= clipped, -advantages * ratio, 0) / batch
    # d log π(a) / d logits = onehot(a) - p
    grad = -p * d_logp_a[:, None]
    grad[rows, actions] += d_logp_a
    # -c_ent · dH/dlogits_j = c_ent · p_j (log p_j + H)
    grad += (ent_coef / batch) * p * (log_p + entropy_each[:, None])

    stats = {
        "loss": pg_loss - ent_coef * entropy,
        "pg_loss": pg_loss,
        "entropy": entropy,
        "approx_kl": np.mean(ratio - 1 - log_ratio),
        "clip_fraction": np.mean(np.abs(ratio - 1) > clip_eps),
    }
    return stats, grad


def kickstart_fwd_bwd(
    logits: Array, feature: Array, actions: tuple[int, int, int], weight: float
) -> tuple[Array, Array]:
    """Kickstarting's cross-entropy with a teacher for policy logits [B, A]: the teacher takes
    actions[0], [1] or [2] where `feature` [B] is < 0, 0 (or NaN) or > 0, and says nothing
    (no pull on that row) where that action is -1;
    loss = weight · Σ_taught(-log π(a_teacher)) / B,
    grad_logits = weight / B · (π - onehot(a_teacher)) on the taught rows, 0 elsewhere.
    Returns (loss, grad_logits [B, A])."""
    batch, width = logits.shape
    below, zero, above = actions
    teacher = np.where(feature > 0, above, np.where(feature < 0, below, zero))
    taught = (teacher >= 0)[:, None]
    onehot = np.arange(width)[None, :] == teacher[:, None]
    log_p = log_softmax(logits)
    loss = -weight * np.mean(np.sum(np.where(onehot, log_p, 0), axis=-1))
    grad = np.where(taught, (weight / batch) * (np.exp(log_p) - onehot), 0)
    return loss, grad.astype(logits.dtype, copy=False)


def normalize_advantages(advantages: Array) -> Array:
    """(Â - mean) / (std + 1e-8), population std: a batch of one normalises to 0, not NaN."""
    centered = advantages - np.mean(advantages)
    return centered / (np.sqrt(np.mean(centered * centered)) + 1e-8)


# --------------------------------------------------------------------------- value head
def value_fwd_bwd(
    values: Array, returns: Array, old_values: Array, clip_eps: float | None
) -> tuple[Array, Array]:
    """loss = mean(0.5 (v - R)²); with clip_eps, PPO value clipping:

    v_clip = v_old + clip(v - v_old, -ε, ε); loss = mean(0.5 max((v - R)², (v_clip - R)²)).
    Returns (loss, grad_values [B]).
    """
    batch = values.shape[0]
    err = values - returns
    if clip_eps is None:
        return np.mean(0.5 * err * err), err / batch
    delta = values - old_values
    clipped_err = old_values + np.clip(delta, -clip_eps, clip_eps) - returns
    use_clipped = clipped_err * clipped_err > err * err
    loss = np.mean(0.5 * np.maximum(err * err, clipped_err * clipped_err))
    # The clipped branch moves with v only while |v - v_old| <= ε.
    clip_live = np.abs(delta) <= clip_eps
    grad = np.where(use_clipped, np.where(clip_live, clipped_err, 0), err) / batch
    return loss, grad


def gae(
    rewards: Array,
    values: Array,
    next_values: Array,
    terminated: Array,
    truncated: Array,
    gamma: float,
    lam: float,
) -> tuple[Array, Array]:
    """Generalised advantage estimation over a time-major rollout [T, N].

    δ_t = r_t + γ V(s_{t+1}) (1 - term_t) - V(s_t)
    Â_t = δ_t + γ λ (1 - done_t) Â_{t+1},  done_t = term_t or trunc_t,  R_t = Â_t + V(s_t).
    `next_values[t]` is V(s_{t+1}); at a truncated step the caller puts there the value of the
    episode's final observation, so truncation bootstraps while termination does not.
    The recursion runs backwards over T (a dependency chain), vectorised over N.
    """
    dtype = values.dtype
    not_term = 1 - terminated.astype(dtype)
    not_done = 1 - (terminated | truncated).astype(dtype)
    deltas = rewards + gamma * next_values * not_term - values
    advantages = np.empty_like(values)
    running = np.zeros(values.shape[1:], dtype=dtype)
    for t in range(values.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * lam * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


# --------------------------------------------------------------------------- encoder gradient
def grad_h_stack(top: Array, bottom: Array, weight: float) -> Array:
    """[top; λ bottom]: the encoder gradient of stacked rows, the on-policy heads' (already
    weighted) over the C51 head's times its λ (rounded to the array's dtype, as NumPy does with
    a Python float times a float32 array)."""
    return np.concatenate([top, weight * bottom])


def grad_h_accumulate(grads: Sequence[Array], weights: Sequence[float]) -> Array:
    """grad_h = Σ_head λ_head grad_h_head, summed in the order given."""
    total = weights[0] * grads[0]
    for weight, grad in zip(weights[1:], grads[1:], strict=True):
        total = total + weight * grad
    return total


# --------------------------------------------------------------------------- optimisation
def all_finite(arrays: Sequence[Array]) -> Array:
    """ok = [1] when every entry of every array is finite, else [0] (uint8 [1])."""
    return np.array([all(np.isfinite(a).all() for a in arrays)], dtype=np.uint8)


def global_norm(grads: Sequence[Array]) -> Array:
    """‖g‖ = sqrt(Σ_tensors Σ g²), tensors in the order given; a float64 [1] array."""
    total = np.float64(0)
    for g in grads:
        total += np.sum(np.square(g, dtype=np.float64))
    return np.array([np.sqrt(total)])


def group_norms(grads: Sequence[Array], group_sizes: Sequence[int]) -> Array:
    """The norm of each group of consecutive tensors (`group_sizes[j]` tensors in group j), then
    global_norm(grads) as the last entry: float64 [G + 1]."""
    if sum(group_sizes) != len(grads):
        raise ValueError(f"group_sizes: expected sizes summing to {len(grads)}, got {group_sizes}")
    bounds = itertools.pairwise(np.cumsum([0, *group_sizes]))
    norms = [global_norm(grads[a:b])[0] for a, b in bounds]
    return np.array([*norms, global_norm(grads)[0]])


def clip_coefficient(norm: Array, max_norm: float) -> Array:
    """min(1, max_norm / (‖g‖ + 1e-6)) elementwise, as torch.nn.utils.clip_grad_norm_ computes
    it for each norm of `norm`."""
    return np.minimum(1.0, max_norm / (norm + 1e-6))


def advance_counter(counter: Array, ok: Array) -> None:
    """counter += 1 in place when ok[0]; the AdamW step t and the target-refresh clock."""
    if ok[0]:
        counter += 1


def adamw_step(
    param: Array,
    grad: Array,
    exp_avg: Array,
    exp_avg_sq: Array,
    step: Array,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    grad_scale: Array,
    ok: Array,
) -> None:
    """One AdamW update in place (Loshchilov & Hutter 2019; torch.optim.AdamW's arithmetic).

    g = grad_scale · grad (the global-norm clip coefficient);
    θ ← θ (1 - lr·wd);  m ← β1 m + (1-β1) g;  v ← β2 v + (1-β2) g²;
    θ ← θ - (lr / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + eps), with t = step[0],
    already advanced for this update.
    """
    if not ok[0]:
        return
    dtype = param.dtype.type
    g = grad * dtype(grad_scale[0])
    t = float(step[0])
    param *= dtype(1 - lr * weight_decay)
    exp_avg *= dtype(beta1)
    exp_avg += dtype(1 - beta1) * g
    exp_avg_sq *= dtype(beta2)
    exp_avg_sq += dtype(1 - beta2) * g * g
    bias1 = 1 - beta1**t
    bias2_sqrt = np.sqrt(1 - beta2**t)
    denom = np.sqrt(exp_avg_sq) / dtype(bias2_sqrt) + dtype(eps)
    param -= dtype(lr / bias1) * exp_avg / denom


def advance_counters(counters: Sequence[Array], ok: Array) -> None:
    """advance_counter for each of distinct counters (the CUDA kernel gives each its own
    thread)."""
    if len({c.__array_interface__["data"][0] for c in counters}) != len(counters):
        raise ValueError("counters: expected distinct arrays (each advances once)")
    for counter in counters:
        advance_counter(counter, ok)


def adamw_steps(
    params: Sequence[Array],
    grads: Sequence[Array],
    exp_avgs: Sequence[Array],
    exp_avg_sqs: Sequence[Array],
    steps: Sequence[Array],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decays: Sequence[float],
    grad_scales: Sequence[Array],
    ok: Array,
) -> None:
    """adamw_step for each tensor i, with its own step counter, weight decay and gradient scale
    (the clip coefficient of its norm group: one [1] array, shared or per group)."""
    roles = (params, grads, exp_avgs, exp_avg_sqs, steps, weight_decays, grad_scales)
    for p, g, m, v, step, wd, scale in zip(*roles, strict=True):
        adamw_step(p, g, m, v, step, lr, beta1, beta2, eps, wd, scale, ok)


def target_refresh(
    target: Sequence[Array],
    online: Sequence[Array],
    updates: Array,
    period: int,
    tau: float,
    ok: Array,
) -> None:
    """Refresh target-network tensors in place after an applied update.

    tau > 0: Polyak, θ' ← τ θ + (1 - τ) θ' every update.
    tau = 0: hard copy θ' ← θ when updates[0] (already advanced) is a multiple of period.
    """
    if not ok[0]:
        return
    if tau > 0:
        for dst, src in zip(target, online, strict=True):
            dst *= dst.dtype.type(1 - tau)
            dst += dst.dtype.type(tau) * src
    elif updates[0] % period == 0:
        for dst, src in zip(target, online, strict=True):
            np.copyto(dst, src)


# --------------------------------------------------------------------------- acting
def sample_categorical(logits: Array, uniforms: Array) -> Array:
    """Inverse-CDF sample per row of logits [N, A] with uniforms [N] in [0, 1).

    The first action whose running sum of π exceeds u·Σπ; cumulative sums run in action order.
    """
    p = np.exp(log_softmax(logits))
    cdf = np.cumsum(p, axis=-1)
    threshold = uniforms * cdf[:, -1]
    picks = np.sum(cdf <= threshold[:, None], axis=-1)
    return np.minimum(picks, logits.shape[-1] - 1).astype(np.int32)


def act_select(
    logits: Array,
    q_values: Array | None,
    mode: object,
    epsilon: float,
    key: Array,
    sequence: Array,
) -> tuple[Array, Array]:
    """Trainer.act's action choice: (actions int32 [N], log π(a|s) of each returned action).

    mode (an ActMode or its value): 'sample' draws from π with u = uniform01(word 0) of
    Philox counter (i, sequence, ACT_SAMPLE); 'greedy_pi' is the first argmax of the logits;
    'greedy_q' the first argmax of q_values [N, A] (E[Z(s, a)]); 'epsilon_greedy' is
    greedy-Q except where uniform01(word 0, float64) of counter (i, sequence, ACT_EXPLORE)
    is below ε: then below(word 1, A). key: uint32 [2] (seed low, high words); sequence:
    int64 [1], the act_calls counter of this call.
    """
    name = getattr(mode, "value", mode)
    if name not in ACT_MODES:
        raise ValueError(f"mode: expected one of {list(ACT_MODES)}, got {mode!r}")
    N, A = logits.shape
    words = (int(key[0]), int(key[1]))
    if name == "sample":
        bits = random_bits(words, Stream.ACT_SAMPLE, int(sequence[0]), N)[:, 0]
        actions = sample_categorical(logits, uniform01(bits, logits.dtype))
    elif name == "greedy_pi":
        actions = np.argmax(logits, axis=1)
    else:
        if q_values is None:
            raise ValueError(f"q_values: required by mode {name!r}, got None")
        actions = np.argmax(q_values, axis=1)
        if name == "epsilon_greedy":
            bits = random_bits(words, Stream.ACT_EXPLORE, int(sequence[0]), N)
            explore = uniform01(bits[:, 0], np.float64) < epsilon
            actions = np.where(explore, below(bits[:, 1], A), actions)
    actions = actions.astype(np.int32)
    return actions, log_softmax(logits)[np.arange(N), actions]


# --------------------------------------------------------------------------- Step statistics
STEP_STATS, STEP_HEADS, STEP_NORM = 10, 5, 5  # kernels/step_stats.cu's layout


def step_stats_accumulate(
    totals: Array, values: Sequence[Array | None], ok: Array, first: bool
) -> None:
    """Add one update's statistics to a Step's float64 totals, in place; the Step's `first`
    update zeroes them first.

    values: STEP_STATS one-element statistics (None = absent, counted as 0), the first
    STEP_HEADS of them head losses. totals[i] += value_i where ok; totals[STEP_STATS] counts
    applied updates, totals[STEP_STATS + 1] skipped ones; totals[STEP_STATS + 2 + h] becomes 1
    once head loss h is non-finite.
    """
    if len(values) != STEP_STATS:
        raise ValueError(f"values: expected {STEP_STATS} statistics, got {len(values)}")
    if first:
        totals[...] = 0
    applied = bool(ok[0])
    for i, value in enumerate(values):
        v = 0.0 if value is None else float(np.asarray(value).reshape(-1)[0])
        if applied:
            totals[i] += v
        if i < STEP_HEADS and not np.isfinite(v):
            totals[STEP_STATS + 2 + i] = 1.0
    totals[STEP_STATS] += 1.0 if applied else 0.0
    totals[STEP_STATS + 1] += 0.0 if applied else 1.0


# --------------------------------------------------------------------------- replay
def replay_sample_indices(size: Array, key: Array, sequence: Array, count: int) -> Array:
    """`count` ring slots drawn uniformly with replacement: slot_i = below(word 0 of Philox
    counter (i, sequence, REPLAY), size) -> int32 [count]. size, sequence: int64 [1]."""
    words = (int(key[0]), int(key[1]))
    bits = random_bits(words, Stream.REPLAY, int(sequence[0]), count)[:, 0]
    return below(bits, int(size[0])).astype(np.int32)


def minibatch_order(key: Array, sequence: int, rows: int) -> Array:
    """A seeded permutation of 0 .. rows-1 (int32): the rows sorted, stably, by word 0 of
    Philox counter (i, sequence, MINIBATCH). key: uint32 [2]."""
    words = (int(key[0]), int(key[1]))
    keys = random_bits(words, Stream.MINIBATCH, int(sequence), int(rows))[:, 0]
    return np.argsort(keys, kind="stable").astype(np.int32)


def gather_rows(arrays: Sequence[Array], rows: Array) -> list[Array]:
    """[a[rows] for each array]: a minibatch's rows of several per-row arrays (one launch on
    CUDA, for arrays of 4-byte elements)."""
    return [a[rows] for a in arrays]


def replay_gather(storage: Mapping[str, Array], slots: Array) -> dict[str, Array]:
    """The ring's rows at `slots`, one array per field."""
    return {name: array[slots] for name, array in storage.items()}
