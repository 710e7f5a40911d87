"""Tests for service.config: layering, parsing, round trips and error messages."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from service.config import Config, ConfigError, ModelConfig, load_config, with_overrides
from service.config_sizes import (
    BACKEND_DEFAULTS,
    JOB_STEPS,
    LOBSIM_JOB,
    job_sized,
    left_to_backend,
    lobsim_job_settings,
    sized_for,
)

SECTIONS = ["model", "train", "ppo", "kickstart", "c51", "optim", "replay", "checkpoint", "server",
            "lobsim"]


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trident.toml"
    path.write_text(text)
    return path


def error_of(**kwargs: object) -> str:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)  # type: ignore[arg-type]
    return str(info.value)


# --- defaults ---------------------------------------------------------------------------


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg == Config()
    assert [f.name for f in dataclasses.fields(cfg)] == SECTIONS
    assert cfg.model.obs_dim == 56 and cfg.model.hidden_dim == 0 and cfg.model.depth == 2
    assert cfg.model.num_actions == 9 and cfg.model.aux_dim == 3 and cfg.model.dtype == "float32"
    assert cfg.train.backend == "auto" and cfg.train.gamma == 0.99
    assert cfg.train.steps == 0 and cfg.train.num_envs == 0  # JOB_STEPS, BACKEND_DEFAULTS
    assert cfg.train.lr_schedule == "linear"
    assert cfg.ppo.norm_adv is True and cfg.ppo.clip_value_loss is False
    assert cfg.c51.num_atoms == 51 and (cfg.c51.v_min, cfg.c51.v_max) == (-10.0, 10.0)
    assert cfg.c51.target_update_period == 100 and cfg.c51.target_tau == 0.0
    assert cfg.optim.lr == 0 and cfg.optim.eps == 1e-8 and cfg.optim.max_grad_norm == 1.0
    assert cfg.optim.clip_scope == "group" and cfg.ppo.value_norm is True
    assert (cfg.replay.capacity, cfg.replay.batch_size, cfg.replay.min_size) == (100_000, 256, 1000)
    assert cfg.checkpoint.dir == "" and cfg.checkpoint.every_steps == 0  # the command's own
    assert cfg.server.port == 50051 and cfg.server.metrics_port == 9464
    assert cfg.server.act_max_wait_ms == 0.0 and cfg.server.auth_token == ""


def test_config_is_frozen_and_slotted() -> None:
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.depth = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model = ModelConfig()  # type: ignore[misc]
    assert not hasattr(cfg.model, "__dict__")


def test_direct_construction_validates() -> None:
    with pytest.raises(ConfigError, match=r"model\.depth = 0 .*>= 1"):
        ModelConfig(depth=0)
    assert isinstance(dataclasses.replace(Config().optim, lr=1).lr, float)


# --- layering ---------------------------------------------------------------------------


def test_toml_layer(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
[model]
hidden_dim = 128
dtype = "float64"

[train]
backend = "numpy"
gamma = 1          # int is fine for a float field

[ppo]
norm_adv = false
""",
    )
    cfg = load_config(path, env={})
    assert cfg.model.hidden_dim == 128 and cfg.model.dtype == "float64"
    assert cfg.train.backend == "numpy"
    assert cfg.train.gamma == 1.0 and isinstance(cfg.train.gamma, float)
    assert cfg.ppo.norm_adv is False
    assert cfg.model.depth == 2  # untouched keys keep their defaults
    assert load_config(str(path), env={}) == cfg  # str paths work too


def test_env_beats_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[model]\nhidden_dim = 128\ndepth = 3\n")
    env = {
        "TRIDENT_MODEL__HIDDEN_DIM": "64",
        "TRIDENT_TRAIN__SEED": "7",
        "TRIDENT_LOG_LEVEL": "debug",  # no "__": ignored
        "OTHER__THING": "x",  # no prefix: ignored
    }
    cfg = load_config(path, env=env)
    assert cfg.model.hidden_dim == 64
    assert cfg.model.depth == 3
    assert cfg.train.seed == 7


def test_set_beats_env(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[model]\nhidden_dim = 128\n")
    env = {"TRIDENT_MODEL__HIDDEN_DIM": "64"}
    cfg = load_config(path, env=env, overrides=["model.hidden_dim=32", "optim.lr=1e-3"])
    assert cfg.model.hidden_dim == 32
    assert cfg.optim.lr == 1e-3
    # later --set flags win over earlier ones
    assert load_config(env={}, overrides=["train.seed=1", "train.seed=2"]).train.seed == 2


def test_env_none_means_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIDENT_TRAIN__SEED", "11")
    assert load_config().train.seed == 11


def test_with_overrides() -> None:
    base = load_config(env={}, overrides=["model.depth=3"])
    cfg = with_overrides(base, ["server.port=0", "ppo.epochs=5"])
    assert (cfg.server.port, cfg.ppo.epochs, cfg.model.depth) == (0, 5, 3)
    assert base.server.port == 50051  # original untouched
    with pytest.raises(ConfigError, match=r"server\.port"):
        with_overrides(base, ["server.port=70000"])


# --- parsing of text values (env / --set) ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("100_000", 100_000), ("5", 5), (" 7 ", 7), ("+3", 3)],
)
def test_parse_int(text: str, expected: int) -> None:
    cfg = load_config(env={}, overrides=[f"replay.batch_size={text}"])
    assert cfg.replay.batch_size == expected and type(cfg.replay.batch_size) is int


@pytest.mark.parametrize("text", ["1.5", "1e3", "abc", "", "true"])
def test_parse_int_rejects(text: str) -> None:
    msg = error_of(overrides=[f"replay.capacity={text}"])
    assert "replay.capacity" in msg and repr(text) in msg and "int" in msg


@pytest.mark.parametrize(("text", "expected"), [("3e-4", 3e-4), ("1", 1.0), ("0.5", 0.5)])
def test_parse_float(text: str, expected: float) -> None:
    cfg = load_config(env={"TRIDENT_OPTIM__LR": text})
    assert cfg.optim.lr == expected and type(cfg.optim.lr) is float


def test_parse_float_rejects() -> None:
    msg = error_of(env={"TRIDENT_OPTIM__LR": "fast"})
    assert "optim.lr" in msg and "'fast'" in msg and "float" in msg
    assert "TRIDENT_OPTIM__LR" in msg  # names where the value came from


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("True", True),
        ("1", True),
        ("yes", True),
        ("ON", True),
        ("false", False),
        ("FALSE", False),
        ("0", False),
        ("no", False),
        ("off", False),
    ],
)
def test_parse_bool(text: str, expected: bool) -> None:
    cfg = load_config(env={}, overrides=[f"ppo.norm_adv={text}"])
    assert cfg.ppo.norm_adv is expected


def test_parse_bool_rejects() -> None:
    msg = error_of(overrides=["ppo.norm_adv=maybe"])
    assert "ppo.norm_adv" in msg and "'maybe'" in msg
    assert "true/false/1/0/yes/no/on/off" in msg


def test_parse_str() -> None:
    cfg = load_config(
        env={"TRIDENT_SERVER__HOST": "0.0.0.0"},
        overrides=["checkpoint.dir=/tmp/a=b", "server.auth_token="],
    )
    assert cfg.server.host == "0.0.0.0"
    assert cfg.checkpoint.dir == "/tmp/a=b"  # only the first '=' splits
    assert cfg.server.auth_token == ""


# --- round trips ------------------------------------------------------------------------


def test_dict_round_trip() -> None:
    cfg = load_config(
        env={},
        overrides=[
            "model.dtype=float64",
            "train.backend=numpy",
            "c51.double_dqn=yes",
            "optim.lr=1e-3",
        ],
    )
    d = cfg.to_dict()
    assert list(d) == SECTIONS
    assert d["model"]["dtype"] == "float64" and d["c51"]["double_dqn"] is True
    assert Config.from_dict(d) == cfg
    assert Config.from_dict(json.loads(json.dumps(d))) == cfg


def test_from_dict_partial_uses_defaults() -> None:
    cfg = Config.from_dict({"model": {"depth": 4}})
    assert cfg.model.depth == 4 and cfg.model.hidden_dim == 0 and cfg.train == Config().train


def test_from_dict_validates() -> None:
    with pytest.raises(ConfigError, match=r"model\.depth = True has type bool; expected int"):
        Config.from_dict({"model": {"depth": True}})
    with pytest.raises(ConfigError, match=r"unknown config section 'bogus'"):
        Config.from_dict({"bogus": {}})
    with pytest.raises(ConfigError, match=r"\[model\] must be a table"):
        Config.from_dict({"model": 3})
    with pytest.raises(ConfigError, match=r"c51\.v_min"):
        Config.from_dict({"c51": {"v_min": 1.0, "v_max": 0.0}})


# --- errors -----------------------------------------------------------------------------


def test_unknown_section(tmp_path: Path) -> None:
    msg = error_of(overrides=["modle.depth=3"])
    assert "'modle'" in msg and ", ".join(SECTIONS) in msg
    msg = error_of(env={"TRIDENT_NOPE__X": "1"})
    assert "'nope'" in msg and "TRIDENT_NOPE__X" in msg and ", ".join(SECTIONS) in msg
    msg = error_of(path=write_toml(tmp_path, "[nope]\nx = 1\n"))
    assert "'nope'" in msg and "trident.toml" in msg and ", ".join(SECTIONS) in msg


def test_unknown_key(tmp_path: Path) -> None:
    keys = "obs_dim, hidden_dim, depth, num_actions, aux_dim, dtype"
    msg = error_of(overrides=["model.hiden_dim=3"])
    assert "model.hiden_dim" in msg and keys in msg
    msg = error_of(path=write_toml(tmp_path, "[model]\nwidth = 3\n"))
    assert "model.width" in msg and keys in msg and "trident.toml" in msg
    msg = error_of(env={"TRIDENT_REPLAY__SIZE": "3"})
    assert "replay.size" in msg and "capacity, batch_size, min_size" in msg


def test_a_misspelt_key_is_told_the_key_it_is_closest_to(tmp_path: Path) -> None:
    """--set, TRIDENT_<SECTION>__<KEY>, a config file: the closest key of the section (or the
    same key in the section that has it, or the closest section) is named."""
    assert "(did you mean 'train.steps'?)" in error_of(overrides=["train.stepz=5"])
    msg = error_of(env={"TRIDENT_TRAIN__STEPZ": "5"})
    assert "(did you mean 'train.steps'?)" in msg and "TRIDENT_TRAIN__STEPZ" in msg
    msg = error_of(path=write_toml(tmp_path, "[train]\nlog_evry = 3\n"))
    assert "(did you mean 'train.log_every'?)" in msg and "trident.toml" in msg
    assert "(did you mean 'optim.lr'?)" in error_of(overrides=["train.lr=0.1"])
    assert "(did you mean 'train'?)" in error_of(overrides=["trian.steps=5"])
    assert "did you mean" not in error_of(overrides=["train.xyzzy=1"])  # nothing close


def test_a_variable_with_one_underscore_for_a_setting_is_refused() -> None:
    """TRIDENT_TRAIN_STEPS would be ignored silently; other TRIDENT_ variables pass."""
    msg = error_of(env={"TRIDENT_TRAIN_STEPZ": "5"})
    assert "TRIDENT_TRAIN_STEPZ" in msg and "(did you mean TRIDENT_TRAIN__STEPS?)" in msg
    unrelated = {"TRIDENT_TOKEN": "x", "TRIDENT_RANK": "0", "TRIDENT_LOBSIM_STEPS": "9"}
    assert load_config(env=unrelated) == Config()


@pytest.mark.parametrize(
    ("toml", "key", "shown", "expected"),
    [
        ("[model]\nhidden_dim = 1.5\n", "model.hidden_dim", "1.5", "expected int"),
        ("[model]\ndepth = true\n", "model.depth", "True", "expected int"),
        ('[optim]\nlr = "fast"\n', "optim.lr", "'fast'", "expected float"),
        ("[optim]\nlr = false\n", "optim.lr", "False", "expected float"),
        ("[ppo]\nnorm_adv = 1\n", "ppo.norm_adv", "1", "expected bool"),
        ("[server]\nhost = 1\n", "server.host", "1", "expected str"),
    ],
)
def test_wrong_type_in_toml(tmp_path: Path, toml: str, key: str, shown: str, expected: str) -> None:
    msg = error_of(path=write_toml(tmp_path, toml))
    assert f"{key} = {shown}" in msg and expected in msg and "trident.toml" in msg


@pytest.mark.parametrize(
    ("flag", "key", "shown", "allowed"),
    [
        ("model.depth=0", "model.depth", "0", ">= 1"),
        ("train.gamma=1.5", "train.gamma", "1.5", "in [0, 1]"),
        ("optim.beta2=1", "optim.beta2", "1.0", "in [0, 1)"),
        ("optim.lr=-1e-3", "optim.lr", "-0.001", ">= 0"),
        ("c51.num_atoms=1", "c51.num_atoms", "1", ">= 2"),
        ("c51.target_tau=-0.1", "c51.target_tau", "-0.1", "in [0, 1]"),
        ("server.port=65536", "server.port", "65536", "in [0, 65535]"),
        ("train.max_policy_lag=-1", "train.max_policy_lag", "-1", ">= 0"),
    ],
)
def test_out_of_range(flag: str, key: str, shown: str, allowed: str) -> None:
    msg = error_of(overrides=[flag])
    assert f"{key} = {shown} is out of range" in msg and allowed in msg
    assert f"--set {flag}" in msg


@pytest.mark.parametrize(
    "flag",
    [
        "optim.lr=nan",
        "optim.lr=inf",
        "optim.max_grad_norm=inf",
        "c51.v_min=-inf",
        "ppo.ent_coef=nan",
    ],
)
def test_non_finite_floats_are_rejected(flag: str) -> None:
    key = flag.split("=")[0]
    msg = error_of(overrides=[flag])
    assert f"{key} = " in msg and "not finite" in msg and f"--set {flag}" in msg


def test_out_of_range_in_env() -> None:
    msg = error_of(env={"TRIDENT_TRAIN__NUM_ENVS": "-1"})
    assert "train.num_envs = -1" in msg and ">= 0" in msg and "TRIDENT_TRAIN__NUM_ENVS" in msg


def test_bad_choice(tmp_path: Path) -> None:
    msg = error_of(overrides=["train.backend=gpu"])
    assert "train.backend = 'gpu'" in msg and "'auto', 'numpy', 'cuda'" in msg
    msg = error_of(path=write_toml(tmp_path, '[model]\ndtype = "float16"\n'))
    assert "model.dtype = 'float16'" in msg and "'float32', 'float64'" in msg


@pytest.mark.parametrize("flag", ["model.depth", "model=3", "depth=3", ".depth=3", "model.=3", ""])
def test_malformed_set(flag: str) -> None:
    msg = error_of(overrides=[flag])
    assert f"malformed --set {flag!r}" in msg and "section.key=value" in msg


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    msg = error_of(path=path)
    assert "not found" in msg and str(path) in msg


def test_bad_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[model\nhidden_dim = \n")
    msg = error_of(path=path)
    assert "invalid TOML" in msg and str(path) in msg


def test_toml_section_must_be_table(tmp_path: Path) -> None:
    msg = error_of(path=write_toml(tmp_path, "model = 3\n"))
    assert "[model] must be a table" in msg and "trident.toml" in msg


def test_cross_v_min_lt_v_max() -> None:
    msg = error_of(overrides=["c51.v_min=5", "c51.v_max=5"])
    assert "c51.v_min = 5.0 must be < c51.v_max = 5.0" in msg
    assert load_config(env={}, overrides=["c51.v_min=-1", "c51.v_max=1"]).c51.v_max == 1.0


def test_cross_min_size_le_capacity() -> None:
    msg = error_of(overrides=["replay.capacity=100", "replay.min_size=101"])
    assert "replay.min_size = 101 must be <= replay.capacity = 100" in msg
    cfg = load_config(env={}, overrides=["replay.capacity=100", "replay.min_size=100"])
    assert cfg.replay.min_size == 100


@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_cross_float64_needs_numpy(backend: str) -> None:
    msg = error_of(overrides=["model.dtype=float64", f"train.backend={backend}"])
    assert "model.dtype = 'float64' requires train.backend = 'numpy'" in msg
    assert f"train.backend = {backend!r}" in msg


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["lobsim.initial_depth=32"], r"lobsim\.initial_depth = 32 must be < lobsim\.price_levels"),
        (["lobsim.price_levels=24", "lobsim.visible_levels=12"], r"lobsim\.visible_levels = 12"),
        (["lobsim.latency_events=14"], r"lobsim\.latency_events = 14 must be <= .*events_per_step"),
    ],
)
def test_lobsim_settings_that_cannot_fit_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, overrides=overrides)


def test_backend_defaults_fill_only_what_was_left_to_the_backend(
    rng: np.random.Generator,
) -> None:
    envs, steps, hidden = (int(v) for v in rng.integers(1, 10_000, 3))
    for backend, picks in BACKEND_DEFAULTS.items():
        auto = sized_for(load_config(env={}), backend)
        for key, value in picks.items():
            section, name = key.split(".")
            assert getattr(getattr(auto, section), name) == value, key
        assert auto.train.steps == 0  # a trainer's (a server's) run has no end unless set
        assert job_sized(load_config(env={}), backend).train.steps == JOB_STEPS[backend]
        mine = job_sized(load_config(env={}, overrides=[f"train.num_envs={envs}"]), backend)
        assert (mine.train.num_envs, mine.train.steps) == (envs, JOB_STEPS[backend])
        mine = job_sized(load_config(env={}, overrides=[f"train.steps={steps}"]), backend)
        assert (mine.train.num_envs, mine.train.steps) == (picks["train.num_envs"], steps)
        mine_sets = [f"model.hidden_dim={hidden}", "optim.lr=0.0125"]
        mine = sized_for(load_config(env={}, overrides=mine_sets), backend)
        assert (mine.model.hidden_dim, mine.optim.lr) == (hidden, 0.0125)
        assert left_to_backend(mine) == []
        assert sized_for(mine, backend) == mine  # idempotent
    envs_of = {backend: picks["train.num_envs"] for backend, picks in BACKEND_DEFAULTS.items()}
    assert int(envs_of["cuda"]) >= 10 * int(envs_of["numpy"])


def test_the_lobsim_jobs_settings_lie_under_every_layer_a_user_sets() -> None:
    """A fresh main job's own settings (LOBSIM_JOB, `load_config`'s base) fill what the
    command leaves, before the backend's; a value set by the file, the environment or --set is
    kept even where it equals the field's default, and the CUDA job is the backend's defaults."""
    assert LOBSIM_JOB["cuda"] == {} and lobsim_job_settings("cuda") == []
    job = job_sized(load_config(env={}, base=lobsim_job_settings("numpy")), "numpy")
    for key, value in LOBSIM_JOB["numpy"].items():
        section, name = key.split(".")
        assert getattr(getattr(job, section), name) == value, key
    assert job.model.hidden_dim == BACKEND_DEFAULTS["numpy"]["model.hidden_dim"]
    defaults = Config()
    mine_sets = ["train.steps=7", "train.num_envs=16", "optim.lr=0.0125",
                 f"train.rollout_len={defaults.train.rollout_len}",
                 f"ppo.gae_lambda={defaults.ppo.gae_lambda}",
                 f"ppo.ent_coef={defaults.ppo.ent_coef}",
                 *(f"kickstart.{key}={getattr(defaults.kickstart, key)}"
                   for key in ("coef", "decay_steps", "action_below", "action_above"))]  # fmt: skip
    mine = load_config(env={}, overrides=mine_sets, base=lobsim_job_settings("numpy"))
    assert mine == load_config(env={}, overrides=mine_sets)
    job_base = lobsim_job_settings("numpy")
    from_env = load_config(env={"TRIDENT_TRAIN__ROLLOUT_LEN": "32"}, base=job_base)
    assert from_env.train.rollout_len == 32 and from_env.train.num_envs == 128


def test_a_tensor_core_precision_on_numpy_is_refused_naming_the_setting() -> None:
    from service.errors import BackendUnavailable
    from service.trainer.trainer import Trainer

    for precision in ("tf32", "bf16"):
        settings = ["train.backend=numpy", f"train.precision={precision}"]
        config = load_config(env={}, overrides=settings)
        with pytest.raises(BackendUnavailable, match=r"train\.precision: '(tf32|bf16)'"):
            Trainer(config)
    with pytest.raises(ConfigError, match=r"train\.precision"):
        load_config(env={}, overrides=["train.precision=fp16"])
