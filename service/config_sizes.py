"""What the settings a config leaves to its backend stand for on each backend, and a LobSim main
job's own settings: the sizes that make a job take minutes on a 2-core CPU or use a GPU."""

from service.config import Config, with_overrides

# What a setting left at 0 stands for on each backend: the main job trains in a few minutes on
# a 2-core CPU, or takes tens of millions of env steps on one GPU, where a wider network costs
# little time; each backend's learning rate is the best of its recorded sweep
# (docs/benchmarks/learning.md has the sweeps these come from).
BACKEND_DEFAULTS: dict[str, dict[str, float]] = {
    "numpy": {"train.num_envs": 256, "model.hidden_dim": 128, "optim.lr": 3e-3},
    "cuda": {"train.num_envs": 8192, "model.hidden_dim": 256, "optim.lr": 2e-3},
}
# An in-process job's Steps where train.steps is 0 (job_sized). Not a trainer's setting: a
# server left without train.steps runs with no end.
JOB_STEPS: dict[str, int] = {"numpy": 100, "cuda": 200}
# A fresh LobSim main job's own settings on each backend (`trident train`, not a resume: a run
# goes on with its config.toml), the layer under the config file, the environment and --set
# (`lobsim_job_settings`). On NumPy the job has a 2-core machine's two minutes, a few million
# env steps: it learns most from fewer markets with longer rollouts, a longer GAE horizon and a
# lower rate than a server's or a Gymnasium job's defaults. The CUDA job is the backend's
# defaults as they are. The NumPy job also kickstarts its policy with LobSim's inventory-skew
# rule on flat inventories alone (QUOTE(0,0) where the inventory is 0; no teacher where it is
# long or short), at a weight of 1 that falls by about a tenth over the job's 550 Steps: the
# agent learns what to do with an inventory, not whether to quote when flat; a lower entropy
# bonus then keeps the policy nearer its greedy play. docs/benchmarks/learning.md has the sweeps
# over seeds these come from.
LOBSIM_JOB: dict[str, dict[str, float]] = {
    "numpy": {"train.steps": 550, "train.num_envs": 128, "train.rollout_len": 64,
              "optim.lr": 2e-3, "ppo.gae_lambda": 0.98, "ppo.ent_coef": 0.003,
              "kickstart.coef": 1.0, "kickstart.decay_steps": 5000,
              "kickstart.action_below": -1, "kickstart.action_above": -1},
    "cuda": {},
}  # fmt: skip


def lobsim_job_settings(backend: str) -> list[str]:
    """LOBSIM_JOB's settings of `backend` as `section.key=value`: `load_config`'s `base`."""
    return [f"{key}={value!r}" for key, value in LOBSIM_JOB[backend].items()]


def left_to_backend(cfg: Config) -> list[str]:
    """The BACKEND_DEFAULTS settings `cfg` leaves at 0 (a trainer's config has none)."""
    sections = (key.split(".") for key in BACKEND_DEFAULTS["numpy"])
    return [f"{s}.{k}" for s, k in sections if getattr(getattr(cfg, s), k) == 0]


def sized_for(cfg: Config, backend: str) -> Config:
    """`cfg` with each BACKEND_DEFAULTS setting still at 0 set to `backend`'s value."""
    picks = [f"{key}={BACKEND_DEFAULTS[backend][key]!r}" for key in left_to_backend(cfg)]
    return with_overrides(cfg, picks) if picks else cfg


def job_sized(cfg: Config, backend: str) -> Config:
    """`sized_for`, and an in-process job's train.steps left at 0 set to JOB_STEPS: a job
    always ends."""
    cfg = sized_for(cfg, backend)
    return cfg if cfg.train.steps else with_overrides(cfg, [f"train.steps={JOB_STEPS[backend]}"])
