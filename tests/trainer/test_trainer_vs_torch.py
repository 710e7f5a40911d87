"""The trainer's full update equals the same update written directly in PyTorch.

An independent reference: the encoder and heads as torch tensors, every loss written in torch
and differentiated by autograd, `torch.nn.utils.clip_grad_norm_` for the global clip (or once
per parameter group), one `torch.optim.AdamW` per parameter group, and the value head's running
return statistics (MAPPO's ValueNorm, debiased moving averages) written out again. Nothing
here calls `numpy_ops` for math; only the trainer's random choices (the Philox minibatch
permutation and replay slots) are reused, so both sides see the same rows. After each Step
every parameter, AdamW moment, step count and target-network tensor must agree to a relative
1e-5 (float64; the observed error is ~1e-14, at most ~3e-12 over 25 seeds), and the Step's
reported losses and statistics must equal the reference's means.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from service.backend.philox import Stream, below, random_bits, seed_key  # noqa: E402
from service.config import Config, with_overrides  # noqa: E402
from service.trainer import model  # noqa: E402
from service.trainer.trainer import Trainer  # noqa: E402
from service.types import Rollout  # noqa: E402

F64 = torch.float64
T, N, D, K = 4, 6, 7, 3
HEADS = ("q", "pi", "v", "bce", "aux")
TERMINATED = ((1, 0), (3, 2), (0, 4))  # (t, n)
TRUNCATED = ((0, 3), (2, 1), (3, 5), (1, 4))

BASE = {
    "model.obs_dim": D,
    "model.hidden_dim": 24,
    "model.depth": 2,
    "model.num_actions": 9,
    "model.aux_dim": K,
    "train.backend": "numpy",
    "train.seed": 7,
    "train.gamma": 0.9,
    "train.lambda_q": 0.7,
    "train.lambda_pi": 1.3,
    "train.lambda_v": 0.5,
    "train.lambda_bce": 0.2,
    "train.lambda_aux": 0.1,
    "ppo.gae_lambda": 0.8,
    "ppo.clip_eps": 0.2,
    "ppo.ent_coef": 0.05,
    "ppo.epochs": 1,
    "ppo.num_minibatches": 3,
    "c51.num_atoms": 11,
    "c51.v_min": -3.0,
    "c51.v_max": 3.0,
    "c51.n_step": 1,
    "c51.target_update_period": 2,
    "optim.lr": 0.01,
    "optim.beta1": 0.9,
    "optim.beta2": 0.99,
    "optim.eps": 1e-8,
    "optim.weight_decay": 0.01,
    "optim.max_grad_norm": 3.0,
    "replay.batch_size": 10,
    "replay.min_size": 12,
    "ppo.value_norm": False,
    "optim.clip_scope": "global",
}


@dataclass
class Variant:
    overrides: dict = field(default_factory=dict)
    dtype: str = "float64"
    steps: int = 1
    tol: float = 1e-5


VARIANTS = {
    "default": Variant(),
    "double_dqn_polyak": Variant({"c51.double_dqn": True, "c51.target_tau": 0.3}),
    "value_clip_nstep3": Variant(
        {"ppo.clip_value_loss": True, "ppo.value_clip_eps": 0.004, "c51.n_step": 3}
    ),
    "depth1": Variant({"model.depth": 1, "model.num_actions": 5, "c51.num_atoms": 51}),
    # Step 1: the replay holds 24 < 30 transitions, so the Q head has no loss, no gradient and
    # no AdamW step; step 2 trains it, with its own (smaller) bias-correction step count.
    "q_warmup_two_steps": Variant({"replay.min_size": 30}, steps=2),
    # A second epoch draws a fresh permutation (sequence = updates attempted so far).
    "two_epochs": Variant({"ppo.epochs": 2}),
    # float32 against the float64 reference, as a smoke check of the float32 path only. At 1e-4
    # per tensor it is seed-dependent (over 60 seeds 8 fail, worst 9e-4): AdamW's
    # normalised step m / (sqrt(v) + eps) turns float32 rounding of near-zero gradient entries
    # into O(lr) parameter differences, which dominate small tensors (pi/W starts at ±0.002,
    # biases at 0). The float64 variants carry the precise comparison.
    "float32": Variant(dtype="float32", tol=1e-2),
    # Value normalisation and per-group clipping; two Steps so the statistics move twice.
    "value_norm_group_clip": Variant(
        {
            "ppo.value_norm": True,
            "ppo.value_norm_decay": 0.7,
            "optim.clip_scope": "group",
            "ppo.clip_value_loss": True,
            "ppo.value_clip_eps": 0.05,
        },
        steps=2,
    ),
}


def make_config(variant: Variant) -> Config:
    settings = {**BASE, **variant.overrides, "model.dtype": variant.dtype}
    return with_overrides(Config(), [f"{k}={v}" for k, v in settings.items()])


def make_rollout(config: Config, rng: np.random.Generator) -> Rollout:
    """Fresh draws in the variant's dtype, over fixed terminated and truncated steps (the GAE
    cuts and n-step horizons every variant must handle), final_obs_index in reverse order."""
    dtype = np.dtype(config.model.dtype)
    A = config.model.num_actions
    terminated = np.zeros((T, N), dtype=bool)
    truncated = np.zeros((T, N), dtype=bool)
    for t, n in TERMINATED:
        terminated[t, n] = True
    for t, n in TRUNCATED:
        truncated[t, n] = True
    index = np.flatnonzero(truncated.reshape(-1))[::-1].copy()  # any order is allowed
    return Rollout(
        obs=rng.normal(size=(T + 1, N, D)).astype(dtype),
        actions=rng.integers(0, A, size=(T, N)).astype(np.int32),
        rewards=(1.5 * rng.normal(size=(T, N))).astype(dtype),
        terminated=terminated,
        truncated=truncated,
        behavior_log_probs=(np.log(1.0 / A) + 0.4 * rng.normal(size=(T, N))).astype(dtype),
        final_obs=rng.normal(size=(index.size, D)).astype(dtype),
        final_obs_index=index,
        bce_labels=rng.integers(0, 2, size=(T, N)).astype(np.int8),
        aux_targets=rng.normal(size=(T, N, K)).astype(dtype),
    )


# ---------------------------------------------------------------------------- the reference
class ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the incoming gradient by λ on the way back."""

    @staticmethod
    def forward(ctx, h, lam):
        ctx.lam = lam
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.lam, None


def as_t(array: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.asarray(array, dtype=np.float64), dtype=F64)


class TorchTrident:
    """The trainer's update math written directly in PyTorch (float64 throughout)."""

    def __init__(self, config: Config, initial: dict[str, np.ndarray]) -> None:
        self.cfg = config
        self.key = seed_key(config.train.seed)
        self.p = {k: as_t(v).requires_grad_(True) for k, v in initial.items()}
        self.target = {
            k: v.detach().clone() for k, v in self.p.items() if k.split("/")[0] in ("encoder", "q")
        }
        optim = config.optim
        self.optimizers = {}
        for group in ("encoder", *HEADS):
            names = [k for k in self.p if k.split("/")[0] == group]
            weights = [self.p[k] for k in names if k.split("/")[1].startswith("W")]
            biases = [self.p[k] for k in names if k.split("/")[1].startswith("b")]
            assert len(weights) + len(biases) == len(names) > 0
            self.optimizers[group] = torch.optim.AdamW(
                [
                    {"params": weights, "weight_decay": optim.weight_decay},
                    {"params": biases, "weight_decay": 0.0},
                ],
                lr=optim.lr,
                betas=(optim.beta1, optim.beta2),
                eps=optim.eps,
                foreach=False,
            )
        self.replay: dict[str, np.ndarray] | None = None
        self.updates_attempted = 0
        self.q_updates = 0
        self.hard_refreshes = 0
        self.value_clip_active = 0
        c51 = config.c51
        self.support = torch.linspace(c51.v_min, c51.v_max, c51.num_atoms, dtype=F64)
        self.return_stats = [0.0, 0.0, 0.0]  # moving averages of mean R, mean R², and of 1

    def return_moments(self) -> tuple[float, float]:
        """(μ, σ) of the returns: debiased moving averages, σ² floored at 1e-2; (0, 1) before
        the first Step, or without value normalisation."""
        a, b, c = self.return_stats
        if not self.cfg.ppo.value_norm or c == 0:
            return 0.0, 1.0
        mean = a / c
        return mean, max(b / c - mean * mean, 1e-2) ** 0.5

    # -- network
    def encode(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in range(self.cfg.model.depth):
            h = torch.relu(h @ params[f"encoder/W{layer}"] + params[f"encoder/b{layer}"])
        return h

    @staticmethod
    def head(params: dict[str, torch.Tensor], name: str, h: torch.Tensor) -> torch.Tensor:
        return h @ params[f"{name}/W"] + params[f"{name}/b"]

    def q_probs(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        A, Z = self.cfg.model.num_actions, self.cfg.c51.num_atoms
        logits = self.head(params, "q", self.encode(params, x)).reshape(-1, A, Z)
        return torch.softmax(logits, dim=-1)

    # -- one Step
    def step(self, rollout: Rollout) -> list[dict[str, float]]:
        cfg = self.cfg
        gamma, lam = cfg.train.gamma, cfg.ppo.gae_lambda
        obs = as_t(rollout.obs)  # [T+1, N, D]
        next_obs = obs[1:].clone()
        for i, flat in enumerate(rollout.final_obs_index):
            next_obs[flat // N, flat % N] = as_t(rollout.final_obs[i])
        term = torch.tensor(rollout.terminated, dtype=F64)
        done = torch.tensor(rollout.terminated | rollout.truncated, dtype=F64)
        rewards = as_t(rollout.rewards)
        with torch.no_grad():
            mu, sigma = self.return_moments()  # V = σ v̂ + μ
            v = mu + sigma * self.head(self.p, "v", self.encode(self.p, obs[:T]))[..., 0]
            v_next = mu + sigma * self.head(self.p, "v", self.encode(self.p, next_obs))[..., 0]
            deltas = rewards + gamma * v_next * (1 - term) - v
            adv = torch.zeros(T, N, dtype=F64)
            running = torch.zeros(N, dtype=F64)
            for t in range(T - 1, -1, -1):
                running = deltas[t] + gamma * lam * (1 - done[t]) * running
                adv[t] = running
            returns = adv + v
            if cfg.ppo.value_norm:
                beta = cfg.ppo.value_norm_decay
                batch_moments = (float(returns.mean()), float((returns**2).mean()), 1.0)
                pairs = zip(self.return_stats, batch_moments, strict=True)
                self.return_stats = [beta * old + (1 - beta) * new for old, new in pairs]
            mu, sigma = self.return_moments()  # the value head learns (R − μ) / σ
        self._insert(rollout, next_obs.numpy())

        batch = {
            "obs": obs[:T].reshape(T * N, D),
            "actions": torch.tensor(rollout.actions.reshape(-1), dtype=torch.int64),
            "blp": as_t(rollout.behavior_log_probs).reshape(-1),
            "adv": adv.reshape(-1),
            "ret": ((returns - mu) / sigma).reshape(-1),
            "v_old": ((v - mu) / sigma).reshape(-1),
            "y": torch.tensor(rollout.bce_labels.reshape(-1), dtype=F64),
            "aux": as_t(rollout.aux_targets).reshape(T * N, K),
        }
        rows = T * N
        stats = []
        for _epoch in range(cfg.ppo.epochs):
            keys = random_bits(self.key, Stream.MINIBATCH, self.updates_attempted, rows)[:, 0]
            order = np.argsort(keys, kind="stable")
            for mb in np.array_split(order, cfg.ppo.num_minibatches):
                stats.append(self._update(batch, torch.tensor(mb, dtype=torch.int64)))
                self.updates_attempted += 1
        return stats

    def _insert(self, rollout: Rollout, next_obs: np.ndarray) -> None:
        """n-step transitions, one per (t, n) in t-major order, appended to the replay."""
        n_step, gamma = self.cfg.c51.n_step, self.cfg.train.gamma
        out = {k: [] for k in ("obs", "actions", "rewards", "dones", "horizons", "next_obs")}
        for t in range(T):
            for e in range(N):
                total, k, finished = 0.0, 0, False
                for j in range(n_step):
                    if t + j >= T:
                        break
                    total += gamma**j * float(rollout.rewards[t + j, e])
                    k = j + 1
                    if rollout.terminated[t + j, e]:
                        finished = True
                        break
                    if rollout.truncated[t + j, e]:
                        break
                out["obs"].append(np.asarray(rollout.obs[t, e], dtype=np.float64))
                out["actions"].append(int(rollout.actions[t, e]))
                out["rewards"].append(total)
                out["dones"].append(float(finished))
                out["horizons"].append(k)
                out["next_obs"].append(next_obs[t + k - 1, e])
        new = {k: np.array(v) for k, v in out.items()}
        if self.replay is None:
            self.replay = new
        else:
            self.replay = {k: np.concatenate([self.replay[k], new[k]]) for k in new}
        assert len(self.replay["actions"]) <= self.cfg.replay.capacity  # no ring wrap here

    def _q_target(self, rep: dict[str, torch.Tensor]) -> torch.Tensor:
        c51, gamma = self.cfg.c51, self.cfg.train.gamma
        Z = c51.num_atoms
        with torch.no_grad():
            target_probs = self.q_probs(self.target, rep["next_obs"])  # [B, A, Z]
            chooser = self.q_probs(self.p, rep["next_obs"]) if c51.double_dqn else target_probs
            best = torch.argmax(chooser @ self.support, dim=1)
            p_next = target_probs[torch.arange(best.shape[0]), best]  # [B, Z]
            discount = gamma ** rep["horizons"] * (1 - rep["dones"])
            tz = rep["rewards"][:, None] + discount[:, None] * self.support[None, :]
            tz = tz.clamp(c51.v_min, c51.v_max)
            b = (tz - c51.v_min) / ((c51.v_max - c51.v_min) / (Z - 1))  # [B, Z_j]
            atoms = torch.arange(Z, dtype=F64)
            weight = (1 - (b[:, :, None] - atoms[None, None, :]).abs()).clamp(0, 1)
            return torch.einsum("bj,bji->bi", p_next, weight)  # Dopamine's closed form

    def _update(self, batch: dict[str, torch.Tensor], mb: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg
        train, ppo, optim = cfg.train, cfg.ppo, cfg.optim
        A, Z = cfg.model.num_actions, cfg.c51.num_atoms
        size = len(self.replay["actions"])
        use_q = size >= cfg.replay.min_size
        x = batch["obs"][mb]
        m = x.shape[0]
        if use_q:
            bits = random_bits(self.key, Stream.REPLAY, self.updates_attempted,
                               cfg.replay.batch_size)
            slots = below(bits[:, 0], size)
            rep = {k: as_t(v[slots]) for k, v in self.replay.items() if k != "actions"}
            rep_actions = torch.tensor(self.replay["actions"][slots], dtype=torch.int64)
            x = torch.cat([x, rep["obs"]])

        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        h = self.encode(self.p, x)
        hp = h[:m]
        losses: dict[str, torch.Tensor] = {}

        # PPO clipped surrogate + entropy bonus, advantages normalised per minibatch.
        adv = batch["adv"][mb]
        if ppo.norm_adv:
            centered = adv - adv.mean()
            adv = centered / (centered.pow(2).mean().sqrt() + 1e-8)
        log_p = torch.log_softmax(self.head(self.p, "pi", ScaleGrad.apply(hp, train.lambda_pi)), -1)
        log_ratio = log_p[torch.arange(m), batch["actions"][mb]] - batch["blp"][mb]
        ratio = log_ratio.exp()
        surrogate = torch.minimum(
            ratio * adv, ratio.clamp(1 - ppo.clip_eps, 1 + ppo.clip_eps) * adv
        )
        entropy = -(log_p.exp() * log_p).sum(-1)
        losses["pi"] = -surrogate.mean() - ppo.ent_coef * entropy.mean()

        # Value: 0.5 (v - R)², optionally PPO-clipped around the rollout-time value.
        value = self.head(self.p, "v", ScaleGrad.apply(hp, train.lambda_v))[:, 0]
        ret, v_old = batch["ret"][mb], batch["v_old"][mb]
        if ppo.clip_value_loss:
            eps = ppo.value_clip_eps
            v_clip = v_old + (value - v_old).clamp(-eps, eps)
            self.value_clip_active += int(((value - v_old).abs() > eps).sum())
            losses["v"] = (0.5 * torch.maximum((value - ret) ** 2, (v_clip - ret) ** 2)).mean()
        else:
            losses["v"] = (0.5 * (value - ret) ** 2).mean()

        u = self.head(self.p, "bce", ScaleGrad.apply(hp, train.lambda_bce))[:, 0]
        losses["bce"] = torch.nn.functional.binary_cross_entropy_with_logits(u, batch["y"][mb])
        pred = self.head(self.p, "aux", ScaleGrad.apply(hp, train.lambda_aux))
        losses["aux"] = torch.nn.functional.mse_loss(pred, batch["aux"][mb])

        if use_q:
            target = self._q_target(rep)
            hq = ScaleGrad.apply(h[m:], train.lambda_q)
            logits = self.head(self.p, "q", hq).reshape(-1, A, Z)
            taken = logits[torch.arange(logits.shape[0]), rep_actions]
            losses["q"] = -(target * torch.log_softmax(taken, -1)).sum(-1).mean()

        sum(losses.values()).backward()
        with_grad = [p for p in self.p.values() if p.grad is not None]
        if not use_q:
            assert self.p["q/W"].grad is None
        norm = torch.nn.utils.clip_grad_norm_(with_grad, optim.max_grad_norm
                                              if optim.clip_scope == "global" else float("inf"))
        if optim.clip_scope == "group":  # each optimizer group by its own norm
            for group in ("encoder", *HEADS):
                grads = [p for k, p in self.p.items()
                         if k.split("/")[0] == group and p.grad is not None]  # fmt: skip
                if grads:
                    torch.nn.utils.clip_grad_norm_(grads, optim.max_grad_norm)
        for opt in self.optimizers.values():
            if any(p.grad is not None for g in opt.param_groups for p in g["params"]):
                opt.step()

        if use_q:  # target refresh, clocked by the Q head's applied updates
            self.q_updates += 1
            with torch.no_grad():
                tau = cfg.c51.target_tau
                for name, dst in self.target.items():
                    if tau > 0:
                        dst.copy_(tau * self.p[name] + (1 - tau) * dst)
                    elif self.q_updates % cfg.c51.target_update_period == 0:
                        dst.copy_(self.p[name])
                if tau == 0 and self.q_updates % cfg.c51.target_update_period == 0:
                    self.hard_refreshes += 1

        out = {f"loss_{k}": float(v.detach()) for k, v in losses.items()}
        out["loss_total"] = sum(getattr(train, f"lambda_{k}") * out[f"loss_{k}"] for k in losses)
        out["grad_norm"] = float(norm)
        with torch.no_grad():
            out["entropy"] = float(entropy.mean())
            out["approx_kl"] = float(((ratio - 1) - log_ratio).mean())
            out["clip_fraction"] = float(((ratio - 1).abs() > ppo.clip_eps).double().mean())
        return out

    def moments(self, name: str) -> tuple[np.ndarray, np.ndarray, int]:
        param = self.p[name]
        state = self.optimizers[name.split("/")[0]].state.get(param, {})
        if not state:
            zeros = np.zeros(param.shape)
            return zeros, zeros, 0
        return state["exp_avg"].numpy(), state["exp_avg_sq"].numpy(), int(state["step"])


# ---------------------------------------------------------------------------- comparison
def rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape
    scale = np.max(np.abs(expected)) if expected.size else 0.0
    diff = np.max(np.abs(actual - expected)) if expected.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def assert_state_matches(trainer: Trainer, ref: TorchTrident, tol: float) -> None:
    errors, state = {}, trainer.state
    for name, value in state.params.items():
        errors[f"params/{name}"] = rel_err(value, ref.p[name].detach().numpy())
        exp_avg, exp_avg_sq, steps = ref.moments(name)
        errors[f"exp_avg/{name}"] = rel_err(state.exp_avg[name], exp_avg)
        errors[f"exp_avg_sq/{name}"] = rel_err(state.exp_avg_sq[name], exp_avg_sq)
        group = model.group_of(name)
        assert int(state.optim_steps[group][0]) == steps, (name, state.optim_steps, steps)
    assert set(state.target) == set(ref.target)
    for name, value in state.target.items():
        errors[f"target/{name}"] = rel_err(value, ref.target[name].numpy())
    worst = max(errors, key=errors.get)
    assert errors[worst] < tol, f"{worst}: relative error {errors[worst]:.3e} (tol {tol:g})"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_trainer_step_equals_pytorch(name: str, rng: np.random.Generator) -> None:
    variant = VARIANTS[name]
    config = make_config(variant)
    trainer = Trainer(config)
    state = trainer.state
    assert set(state.params) == {
        *(f"encoder/{t}{i}" for i in range(config.model.depth) for t in "Wb"),
        *(f"{h}/{t}" for h in HEADS for t in "Wb"),
    }
    ref = TorchTrident(config, state.params)
    initial_target = {k: v.copy() for k, v in state.target.items()}
    all_stats = []

    for _ in range(variant.steps):
        rollout = make_rollout(config, rng)
        result = trainer.step(rollout)
        stats = ref.step(rollout)
        all_stats += stats
        updates = config.ppo.epochs * config.ppo.num_minibatches
        assert result.updates_applied == len(stats) == updates and not result.skipped

        means = {k: np.mean([s[k] for s in stats]) for k in stats[0]}
        expected_losses = {k.removeprefix("loss_"): v for k, v in means.items() if "loss_" in k}
        assert set(result.losses) == set(expected_losses)
        for key, value in expected_losses.items():
            assert result.losses[key] == pytest.approx(value, rel=variant.tol, abs=1e-12), key
        for key in ("grad_norm", "entropy", "approx_kl", "clip_fraction"):
            got = getattr(result, key)
            assert got == pytest.approx(means[key], rel=variant.tol, abs=1e-12), key
        assert_state_matches(trainer, ref, variant.tol)
        for array in (*state.params.values(), *state.target.values(),
                      *state.exp_avg.values(), *state.exp_avg_sq.values()):
            assert array.dtype == np.dtype(variant.dtype)

    # The settings exercise what they claim to: the clip bites, the Q head trains, the target
    # moves, PPO clips some ratios.
    assert any(s["grad_norm"] > config.optim.max_grad_norm for s in all_stats)
    assert any(s["clip_fraction"] > 0 for s in all_stats)
    assert ref.q_updates >= 3
    assert all(
        rel_err(state.target[k], initial_target[k]) > 1e-4 for k in ("q/W", "encoder/W0")
    )
    if config.c51.target_tau == 0:
        assert ref.hard_refreshes == ref.q_updates // config.c51.target_update_period >= 1
    if config.ppo.clip_value_loss:
        assert ref.value_clip_active > 0
    if config.ppo.value_norm:  # the statistics moved, and the trainer saved the same ones
        mu, sigma = ref.return_moments()
        assert abs(mu) > 1e-3 and abs(sigma - 1) > 1e-3
        stats = trainer.state_dict()["params/v/norm"]
        np.testing.assert_allclose(stats, ref.return_stats, rtol=1e-12)
    if name == "q_warmup_two_steps":  # the Q head stepped only in step 2
        assert int(state.optim_steps["q"][0]) == 3
        assert int(state.optim_steps["encoder"][0]) == 6
