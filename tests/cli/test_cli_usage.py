"""The command line as a user meets it before any server runs: --version, help on every option
and subcommand with its default, errors that name the flag given, files `act` cannot send."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from service.backend import cuda_available
from service.cli import main
from service.client.client import with_default_port
from service.config import Config
from service.testing.serverproc import trident_cli


def help_text(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def subcommands(capsys: pytest.CaptureFixture[str], *command: str) -> list[str]:
    """Every subcommand of `command`, as argparse lists them when refusing an unknown one."""
    with pytest.raises(SystemExit):
        main([*command, "no-such-command"])
    (listed,) = re.findall(r"choose from (.*)\)", capsys.readouterr().err)
    return re.findall(r"'([^']+)'", listed)


def entries_without_help(text: str) -> list[str]:
    """The options, positionals and subcommands in a help text that have no help of their own:
    an entry is followed by its help on the same line (after two spaces) or on the next,
    indented deeper. A subcommand group's own line (its entries follow, indented) is skipped."""
    lines = text.splitlines()
    missing, in_section = [], False
    for at, line in enumerate(lines):
        if line and not line.startswith(" "):
            in_section = line in ("positional arguments:", "options:")
            continue
        indent = len(line) - len(line.lstrip())
        if not in_section or indent not in (2, 4):
            continue
        following = lines[at + 1] if at + 1 < len(lines) else ""
        deeper = len(following) - len(following.lstrip())
        if re.search(r"\S {2,}\S", line) or (following.strip() and deeper > indent + 2):
            continue
        if deeper != indent + 2:  # not a group header whose subcommands follow
            missing.append(line.strip())
    return missing


def entry(text: str, option: str) -> str:
    """The help entry of `option`: its line and the deeper-indented lines that continue it."""
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if re.match(rf"  {option}\b(?!-)", line)]
    rest = lines[at + 1 :]
    ends = [i for i, line in enumerate(rest) if len(line) - len(line.lstrip()) <= 4]
    return " ".join(part.strip() for part in [lines[at], *rest[: ends[0] if ends else None]])


def test_version_and_top_level_help() -> None:
    version = trident_cli("--version")
    assert version.returncode == 0 and re.fullmatch(r"trident \S+\n", version.stdout)
    top = trident_cli("--help")
    assert top.returncode == 0 and "--version" in top.stdout
    assert "service/" not in top.stdout and ".py" not in top.stdout  # no source paths
    # each command's line says what it takes: train's every env
    train = " ".join(top.stdout.split("\n    train ")[1].split("\n    eval ")[0].split())
    assert "LobSim" in train and "gymnasium:ID" in train and "bandit" in train, train


def test_every_option_and_subcommand_has_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    commands = [(name,) for name in subcommands(capsys)]
    commands += [("checkpoint", name) for name in subcommands(capsys, "checkpoint")]
    assert ("serve",) in commands and ("checkpoint", "restore") in commands
    listed = help_text(capsys)
    for (name,) in [c for c in commands if len(c) == 1]:
        assert re.search(rf"^    {name}(  +\S|\n {{6,}}\S)", listed, re.M), f"{name} has no help"
    for command in [(), *commands]:
        text = help_text(capsys, *command)
        assert entries_without_help(text) == [], (command, text)


def test_help_shows_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TRIDENT_TOKEN", "not-for-help-text")
    act = help_text(capsys, "act")
    defaults = (("--mode", "sample"), ("--epsilon", "0.0"), ("--timeout", "30.0"),
                ("--server", "127.0.0.1:50051"), ("--token", "$TRIDENT_TOKEN"))  # fmt: skip
    for option, default in defaults:
        assert entry(act, option).endswith(f"(default: {default})"), entry(act, option)
    assert "not-for-help-text" not in act
    serve = help_text(capsys, "serve")
    for option, default in (("--port", "50051"), ("--metrics-port", "9464"),
                            ("--host", "127.0.0.1"), ("--backend", "auto")):  # fmt: skip
        assert entry(serve, option).endswith(f"default: {default})"), entry(serve, option)
    assert "--auth-token-file" in serve and "--tls-cert" in serve and "--tls-ca" in serve
    # What a plain serve runs, before the options: the defaults' values, LobSim's model first.
    model, train, every = Config().model, Config().train, Config().checkpoint.every_s
    plain = " ".join(serve.split("options:")[0].split())
    for said in (f"model.obs_dim {model.obs_dim}, num_actions {model.num_actions}, aux_dim "
                 f"{model.aux_dim} (LobSim's)", f"train.rollout_len {train.rollout_len}",
                 "train.steps 0: no end", f"every {every:g} s (checkpoint.every_s)",
                 "runs/serve-<port>/checkpoints", "127.0.0.1:50051"):  # fmt: skip
        assert said in plain, (said, plain)


def test_errors_name_the_flag_given(tmp_path: Path) -> None:
    by_flag = trident_cli("serve", "--port", "70000", cwd=tmp_path)
    assert by_flag.returncode == 2
    assert by_flag.stderr == (
        "trident: error: server.port = 70000 is out of range; must be in [0, 65535] (from --port)\n"
    )
    by_set = trident_cli("serve", "--set", "server.port=70000", cwd=tmp_path)
    assert by_set.returncode == 2 and "(from --set server.port=70000)" in by_set.stderr
    (tmp_path / "empty").write_text("\n")
    no_token = trident_cli("serve", "--auth-token-file", "empty", cwd=tmp_path)
    assert no_token.returncode == 2
    assert no_token.stderr == (
        "trident: error: --auth-token-file empty: expected a token, got an empty file\n"
    )


def test_act_refuses_what_is_not_float_observations(tmp_path: Path) -> None:
    """Each file fails before any server is asked, exit 2, in one line naming it."""
    (tmp_path / "notes.md").write_text("# not an array\n")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "flat.npy", np.zeros(6, np.float32))
    np.save(tmp_path / "words.npy", np.array([["a", "b"]]))
    expected = {
        "notes.md": "got notes.md, which is not a .npy file",
        "objects.npy": "got objects.npy, which NumPy cannot read",
        "flat.npy": "got shape (6,) in flat.npy",
        "words.npy": "got dtype <U1 in words.npy",
        "missing.npy": "got missing.npy: No such file or directory",
    }
    for name, got in expected.items():
        done = trident_cli("act", name, "--server", "127.0.0.1:1", cwd=tmp_path)
        assert done.returncode == 2, (name, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith(
            "trident: error: obs: expected a .npy file (numpy.save) of float32 observations"
        ), line
        assert got in line, line


def test_a_host_without_a_port_means_the_server_port() -> None:
    assert with_default_port("localhost") == "localhost:50051"
    assert with_default_port("10.1.2.3") == "10.1.2.3:50051"
    assert with_default_port("::1") == with_default_port("[::1]") == "[::1]:50051"
    for target in ("localhost:7", "[::1]:7", "dns:///trident.internal:7", "unix:/run/t.sock"):
        assert with_default_port(target) == target
    # 127.0.0.2: a README test's `trident serve` may hold 127.0.0.1:50051 meanwhile.
    done = trident_cli("health", "--server", "127.0.0.2", "--timeout", "5")
    assert done.returncode == 1 and "at 127.0.0.2:50051: connection refused" in done.stderr


@pytest.mark.skipif(cuda_available(), reason="a GPU is visible: --backend cuda would serve")
def test_backend_cuda_without_a_gpu_says_how_to_install(tmp_path: Path) -> None:
    done = trident_cli("serve", "--backend", "cuda", "--port", "0", "--metrics-port", "0",
                       cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("trident: error: train.backend: 'cuda' needs CuPy")
    assert "pip install '.[cuda]'" in line  # as README says


@pytest.mark.parametrize(
    "command", [("train",), ("serve",), ("eval", "CKPT"), ("checkpoint", "save"), ("config",)]
)
def test_an_unknown_flag_is_answered_with_the_subcommands_usage(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """argparse on its own hands a subcommand's leftovers to the top-level parser, whose usage
    (`trident [-h] [--version] COMMAND ...`) says nothing of the subcommand's options."""
    with pytest.raises(SystemExit) as done:
        main([*command, "--bogus"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    name = " ".join(c for c in command if c != "CKPT")
    assert err.startswith(f"usage: trident {name} [-h]"), err
    assert f"trident {name}: error: unrecognized arguments: --bogus" in err


def test_config_lists_every_setting_with_its_default_and_doc(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`trident config` is TOML that reads back to the defaults, every setting under its doc;
    with --set, the value set and the default beside it; never the auth token."""
    from service.config import Config, load_config
    from service.config_docs import setting_docs

    assert main(["config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "all.toml").write_text(printed)
    assert load_config(tmp_path / "all.toml", env={}) == Config()
    docs = setting_docs()
    assert len(docs) == sum(len(table) for table in Config().to_dict().values())
    assert [d.key for d in docs if not d.help] == []  # every field has its comment
    lines = printed.splitlines()
    at = lines.index("log_every = 20")
    assert lines[at - 1] == "# training steps between log lines (int, >= 1)"
    assert main(["config", "--set", "train.log_every=7", "--set", "server.auth_token=s3cr3t"]) == 0
    printed = capsys.readouterr().out
    assert "log_every = 7  # default: 20" in printed.splitlines()
    assert "s3cr3t" not in printed and "# auth_token = (set; not shown)" in printed
