"""The trainer update written plainly in eager PyTorch, shared by bench/cpu_step.py (the torch
column) and bench/gpu_step.py (the eager and graph columns).

One update: B rollout rows stacked on B replay rows through the encoder, the pi / v / bce / aux
heads on the rollout rows (PPO clipped surrogate + entropy, value, BCE, MSE), the C51 head on
the replay rows with the target network's no-grad forward, the categorical projection and the
cross-entropy, then one Σλ·loss backward, `clip_grad_norm_`, AdamW (weight decay on weights
only) and the Polyak `lerp_` refresh of the target.

The update is device-aware and never synchronises with the host, so it can be captured in a
CUDA graph: the projection's edge fix uses `torch.where` (boolean-mask assignment
synchronises), and the statistics stay on the device in `out["stats"]` (the caller reads them
when it wants). Imported as `from torch_update import ...`: the scripts run as
`python bench/<script>.py`, which puts bench/ on sys.path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Keys of `data` (see make_torch_update): the rollout minibatch and the replay storage.
ROLLOUT_KEYS = ("obs", "actions", "old_logp", "advantages", "returns", "bce_y", "aux_y", "rows")
STORE_KEYS = ("obs", "actions", "rewards", "dones", "horizons", "next_obs")


@dataclass
class TorchUpdate:
    """One B's eager-PyTorch update on a device, and what the graph check needs of it."""

    update: Callable[[], None]
    net: Any
    target_params: list
    opt: Any
    out: dict  # "stats": [total loss, approx KL, clip fraction, grad norm] of the last update

    def state(self) -> list:
        """Every tensor the update changes: parameters, target, AdamW moments and steps."""
        tensors = [*self.net.parameters(), *self.target_params]
        for st in self.opt.state.values():
            tensors += [v for v in st.values() if hasattr(v, "copy_")]
        return tensors


def random_data(B: int, size: int, dims: dict, device) -> dict:
    """A random B-row rollout minibatch and a `size`-row replay, made on `device`."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    D, A, K = dims["D"], dims["A"], dims["K"]
    logits = torch.randn(B, A, device=device)
    actions = torch.randint(0, A, (B,), device=device)
    rollout = {
        "old_logp": F.log_softmax(logits, -1).gather(1, actions[:, None])[:, 0],
        "actions": actions,
        "obs": torch.randn(B, D, device=device),
        "advantages": torch.randn(B, device=device),
        "returns": torch.randn(B, device=device),
        "bce_y": (torch.rand(B, device=device) < 0.5).float(),
        "aux_y": torch.randn(B, K, device=device),
        "rows": torch.randperm(B, device=device),
    }
    store = {
        "obs": torch.randn(size, D, device=device),
        "actions": torch.randint(0, A, (size,), device=device),
        "rewards": torch.randn(size, device=device),
        "dones": (torch.rand(size, device=device) < 0.02).to(torch.uint8),
        "horizons": torch.ones(size, dtype=torch.int32, device=device),
        "next_obs": torch.randn(size, D, device=device),
    }
    return {"rollout": rollout, "store": store}


def make_torch_update(
    B: int,
    cfg,
    device: str,
    *,
    capturable: bool,
    seed: int,
    fixed_replay_rows: bool = False,
    data: dict | None = None,
    autocast: object = None,
) -> TorchUpdate:
    """The eager-PyTorch update of one B on `device`, with no host synchronisation.

    `cfg` is a `service.config.Config`: model dims, c51, ppo, optim and the λ weights come from
    it. `data` is {"rollout": {ROLLOUT_KEYS: tensors}, "store": {STORE_KEYS: tensors}} (the
    rollout tensors B rows, indexed by `rows`; the store's rows are the replay the sample is
    drawn from); None makes random data on the device after the nets (`random_data`, the
    replay `cfg.replay.capacity` rows). The parameters are initialised right after
    `torch.manual_seed(seed)`. With `fixed_replay_rows` the replay rows are a fixed set
    instead of a fresh `torch.randint` draw per update, so two runs of one update see the
    same rows. The statistics of the last update are left on the device in `out["stats"]`.
    `autocast` (a torch dtype, e.g. torch.bfloat16) runs the update under `torch.autocast`
    (parameters, moments and the optimizer stay float32), the precision columns of gpu_step.
    """
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    model, train, ppo, c51, optim = cfg.model, cfg.train, cfg.ppo, cfg.c51, cfg.optim
    D, H, A, K, Z = model.obs_dim, model.hidden_dim, model.num_actions, model.aux_dim, c51.num_atoms
    dev = torch.device(device)
    torch.manual_seed(seed)

    def encoder() -> nn.Sequential:
        layers: list[nn.Module] = [nn.Linear(D, H), nn.ReLU()]
        for _ in range(model.depth - 1):
            layers += [nn.Linear(H, H), nn.ReLU()]
        return nn.Sequential(*layers)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder()
            self.q = nn.Linear(H, A * Z)
            self.pi = nn.Linear(H, A)
            self.v = nn.Linear(H, 1)
            self.bce = nn.Linear(H, 1)
            self.aux = nn.Linear(H, K)

    net = Net().to(dev)
    target = nn.ModuleDict({"encoder": Net().encoder, "q": nn.Linear(H, A * Z)}).to(dev)
    target.load_state_dict(
        {k: v for k, v in net.state_dict().items() if k.startswith(("encoder.", "q."))}
    )
    target.requires_grad_(False)
    online_t = [*net.encoder.parameters(), *net.q.parameters()]
    target_t = [*target["encoder"].parameters(), *target["q"].parameters()]
    decay = [p for n, p in net.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in net.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": optim.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        capturable=capturable,
    )

    if data is None:
        data = random_data(B, cfg.replay.capacity, {"D": D, "A": A, "K": K}, dev)
    roll = {k: data["rollout"][k].to(dev) for k in ROLLOUT_KEYS}
    store = {k: data["store"][k].to(dev) for k in STORE_KEYS}
    store["actions"] = store["actions"].long()  # index of the gather below
    obs, actions, old_logp, rows = (
        roll["obs"],
        roll["actions"].long(),
        roll["old_logp"],
        roll["rows"],
    )
    adv_all, returns, bce_y, aux_y = (
        roll["advantages"],
        roll["returns"],
        roll["bce_y"],
        roll["aux_y"],
    )
    size = store["obs"].shape[0]
    fixed_idx = torch.randint(0, size, (B,), device=dev) if fixed_replay_rows else None
    support = torch.linspace(c51.v_min, c51.v_max, Z, device=dev)
    delta_z = (c51.v_max - c51.v_min) / (Z - 1)
    arange = torch.arange(B, device=dev)
    offset = (arange * Z)[:, None]
    out: dict = {}

    def project(p, r, d, k):
        disc = (train.gamma ** k.float()) * (1 - d.float())
        tz = (r[:, None] + disc[:, None] * support[None, :]).clamp(c51.v_min, c51.v_max)
        b = ((tz - c51.v_min) / delta_z).clamp(0, Z - 1)
        lo, up = b.floor().long(), b.ceil().long()
        lo = torch.where((up > 0) & (lo == up), lo - 1, lo)
        up = torch.where((lo < Z - 1) & (lo == up), up + 1, up)
        m = torch.zeros(B * Z, device=dev)
        m.index_add_(0, (lo + offset).view(-1), (p * (up.float() - b)).view(-1))
        m.index_add_(0, (up + offset).view(-1), (p * (b - lo.float())).view(-1))
        return m.view(B, Z)

    def update() -> None:
        if autocast is None:
            one_update()
            return
        with torch.autocast(dev.type, dtype=autocast, cache_enabled=False):
            one_update()

    def one_update() -> None:
        # replay sample (uniform with replacement) and minibatch gather
        idx = fixed_idx if fixed_idx is not None else torch.randint(0, size, (B,), device=dev)
        r_obs, r_act, r_rew = store["obs"][idx], store["actions"][idx], store["rewards"][idx]
        r_done, r_k, r_next = store["dones"][idx], store["horizons"][idx], store["next_obs"][idx]
        x = torch.cat([obs[rows], r_obs])
        h = net.encoder(x)
        h_pol, h_q = h[:B], h[B:]
        a = actions[rows]
        adv = adv_all[rows]
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
        # PPO clipped surrogate + entropy
        log_p = F.log_softmax(net.pi(h_pol), -1)
        log_ratio = log_p.gather(1, a[:, None])[:, 0] - old_logp[rows]
        ratio = log_ratio.exp()
        pg = -torch.min(ratio * adv, ratio.clamp(1 - ppo.clip_eps, 1 + ppo.clip_eps) * adv)
        entropy = -(log_p.exp() * log_p).sum(-1).mean()
        loss_pi = pg.mean() - ppo.ent_coef * entropy
        loss_v = 0.5 * (net.v(h_pol)[:, 0] - returns[rows]).pow(2).mean()
        loss_bce = F.binary_cross_entropy_with_logits(net.bce(h_pol)[:, 0], bce_y[rows])
        loss_aux = F.mse_loss(net.aux(h_pol), aux_y[rows])
        # C51 on the replay rows: target net forward, projection, cross-entropy
        with torch.no_grad():
            hn = target["encoder"](r_next)
            probs = target["q"](hn).view(B, A, Z).softmax(-1)
            best = (probs @ support).argmax(1)
            m = project(probs[arange, best], r_rew, r_done, r_k)
        q_logits = net.q(h_q).view(B, A, Z)[arange, r_act]
        loss_q = -(m * F.log_softmax(q_logits, -1)).sum(-1).mean()
        total = (
            train.lambda_pi * loss_pi
            + train.lambda_v * loss_v
            + train.lambda_bce * loss_bce
            + train.lambda_aux * loss_aux
            + train.lambda_q * loss_q
        )
        opt.zero_grad(set_to_none=True)
        total.backward()
        norm = nn.utils.clip_grad_norm_(net.parameters(), optim.max_grad_norm)
        opt.step()
        with torch.no_grad():
            for dst, src in zip(target_t, online_t, strict=True):
                dst.lerp_(src, c51.target_tau)
            # the statistics the NumPy path reports, left on the device
            out["stats"] = torch.stack(
                [
                    total.detach(),
                    (ratio - 1 - log_ratio).mean(),
                    ((ratio - 1).abs() > ppo.clip_eps).float().mean(),
                    norm,
                ]
            )

    return TorchUpdate(update=update, net=net, target_params=target_t, opt=opt, out=out)
