"""`trident actor` against real `trident serve` processes: CartPole through Gymnasium, LobSim,
a model that does not fit, and the Gymnasium adapter's same-step autoreset."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from conftest import free_port, running_server, wait_until

from service.actor import ActorError, DropLines, OutageLines, Rate, check_dims
from service.api.trident.v1 import trainer_pb2 as pb
from service.checkpoint import list_checkpoints
from service.client.client import TridentClient
from service.client.resilient import MAX_WAIT_S, LinkCounts
from service.config import Config, LobsimConfig, load_config
from service.envs import GymnasiumVectorEnv, check_env_name, env_dims, make_gymnasium_env
from service.errors import InvalidInput
from service.lobsim.env import observation_dim
from service.testing.serverproc import ServerProcess, clean_env, trident_cli
from service.types import ActMode
from service.vector_env import collect_rollout

CARTPOLE = ("model.obs_dim=4", "model.num_actions=2", "model.aux_dim=0")
ONE_ROLLOUT_A_STEP = "train.num_envs=4"  # the actors' --num-envs: a rollout fills a Step
SAME_STEP = {"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}
# The actor's lines about an outage: the server gone, back, and the done line's resends.
AWAY = re.compile(
    r"trident actor: server at (?P<target>\S+) unavailable \((?P<code>[A-Z_]+): .*\): "
    r"keeping (?P<kept>\d+) rollouts? to send again \((?P<unanswered>\d+) unanswered, "
    r"(?P<unconfirmed>\d+) answered but in no checkpoint yet\)"
)
BACK = re.compile(
    r"trident actor: server at (?P<target>\S+) back after [\d.]+ s "
    r"\((?P<attempts>\d+) attempts?\), a restarted state at global step (?P<step>\d+): "
    r"resent (?P<resent>\d+) rollouts?: (?P<trained>\d+) trained, (?P<replayed>\d+) "
    r"replayed \(already applied\), (?P<dropped>\d+) dropped"
)
DONE = re.compile(
    r"done: .*, (?P<behind>\d+) dropped behind the policy lag, (?P<ahead>\d+) dropped ahead "
    r"of the server's state\), .*\| \d+ rollouts, (?P<resent>\d+) resent, "
    r"(?P<replayed>\d+) replayed, (?P<reconnects>\d+) reconnects \|"
)
ATTEMPT = re.compile(r"trident actor: reconnect attempt (\d+) in [\d.]+ s \(backoff up to "
                     r"[\d.]+ s; [\d.]+ s of [\d.]+ s waited")  # fmt: skip


@pytest.fixture(scope="module")
def cartpole_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("cartpole"), *CARTPOLE,
                        ONE_ROLLOUT_A_STEP) as server:  # fmt: skip
        yield server


class Output:
    """A process's stdout lines as they come (a thread reads them), for a test to wait on."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def finish(self, timeout_s: float) -> str:
        """Wait for the process to exit and its stdout to be read; its stderr."""
        assert self.process.stderr is not None
        self.process.wait(timeout_s)
        self._reader.join(timeout_s)
        return self.process.stderr.read()


def global_step(server: ServerProcess) -> int:
    with TridentClient(server.target) as client:
        return client.status().global_step


def actor(server: ServerProcess, env: str, *args: str) -> tuple[int, list[str], str]:
    done = trident_cli(
        "actor", "--server", server.target, "--env", env, "--num-envs", "4",
        "--rollout-len", "8", "--log-every", "1", *args,
    )  # fmt: skip
    return done.returncode, done.stdout.splitlines(), done.stderr


def test_actor_trains_the_server_on_cartpole(cartpole_server: ServerProcess) -> None:
    before = global_step(cartpole_server)
    code, lines, stderr = actor(cartpole_server, "gymnasium:CartPole-v1", "--steps", "3")
    assert code == 0, stderr
    assert lines[0].startswith("trident actor: runs 4 gymnasium:CartPole-v1 environments in "
                               "one group, rollouts of 8 steps each, 3 rollouts, then exit | "
                               "model obs_dim 4, 2 actions | seed 0 | actor id "), lines[0]
    progress = [line for line in lines if line.startswith("rollout ")]
    assert [line.split()[1] for line in progress] == ["1/3", "2/3", "3/3"]
    assert all(re.search(r"\| +\d+ env steps/s \(last [\d.]+ s\) \| episode return ", line)
               for line in progress), progress  # fmt: skip
    assert "pi " in progress[-1] and "total " in progress[-1]
    assert global_step(cartpole_server) == before + 3


def test_a_model_that_does_not_fit_stops_the_actor(cartpole_server: ServerProcess) -> None:
    before = global_step(cartpole_server)
    code, lines, stderr = actor(cartpole_server, "lobsim", "--steps", "1")
    assert code == 2 and not lines
    D = observation_dim(LobsimConfig())
    assert f"model.obs_dim = 4, the env needs {D}" in stderr
    assert "model.num_actions = 2, the env needs 9" in stderr
    assert f"--set model.obs_dim={D}" in stderr
    code, _, stderr = actor(cartpole_server, "gymnasium:Acrobot-v1", "--steps", "1")
    assert code == 2 and "model.obs_dim = 4, the env needs 6" in stderr
    assert global_step(cartpole_server) == before


def test_a_misfit_is_told_the_settings_it_lacks_and_a_plain_server_fits_lobsim() -> None:
    """A plain server's model (the config's defaults) fits `--env lobsim`; one that does not
    is told the --env that sizes it, or the one --set that is missing, not every size."""
    lobsim = env_dims("lobsim", LobsimConfig())
    check_dims(pb.GetStatusResponse(config_json=json.dumps(Config().to_dict())), lobsim, "lobsim")
    narrow = load_config(env={}, overrides=["model.obs_dim=40"]).to_dict()
    with pytest.raises(ActorError) as refused:
        check_dims(pb.GetStatusResponse(config_json=json.dumps(narrow)), lobsim, "lobsim")
    assert str(refused.value).endswith(
        f"model.obs_dim = 40, the env needs {lobsim.obs_dim}. Start the server with --env "
        f"lobsim (it sizes the model for the env), or add --set model.obs_dim={lobsim.obs_dim}"
    ), refused.value


def test_an_actor_started_before_its_server_waits_for_it(tmp_path: Path) -> None:
    """A fleet may start before its server: the actor says so on its first line, a line per
    attempt to reach it, waits, says when it answered and trains once the server listens; one
    that never comes stops the actor at the timeout (exit 2)."""
    port = free_port()
    command = [sys.executable, "-m", "service.cli", "actor", "--server", f"127.0.0.1:{port}",
               "--env", "gymnasium:CartPole-v1", "--num-envs", "4", "--rollout-len", "8",
               "--steps", "2", "--reconnect-timeout", "120"]  # fmt: skip
    early = subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out = Output(early)
        first = wait_until(lambda: out.lines, 60, "the actor's first line")[0]
        assert first.startswith(f"trident actor: no server at 127.0.0.1:{port} yet (UNAVAILABLE)")
        assert "waiting up to 120 s" in first and "retrying with backoff up to 2 s" in first
        with running_server(tmp_path, *CARTPOLE, ONE_ROLLOUT_A_STEP,
                            extra_args=["--port", str(port)]) as server:  # fmt: skip
            err = out.finish(120)
            assert early.returncode == 0 and not err.strip(), err
            assert global_step(server) == 2
    finally:
        early.kill()
    lines = out.lines
    started = next(i for i, line in enumerate(lines) if line.startswith("trident actor: runs "))
    waited = lines[1 : started - 1]  # the lines between the first and the answer
    attempts = [int(ATTEMPT.match(line)[1]) for line in waited]  # type: ignore[index]
    assert attempts[0] == 1 and attempts == sorted(set(attempts)), lines  # each at most once
    answered = re.fullmatch(rf"trident actor: server at 127\.0\.0\.1:{port} answered after "
                            r"[\d.]+ s \((\d+) attempts?\)", lines[started - 1])  # fmt: skip
    assert answered and int(answered[1]) >= attempts[-1], lines
    assert not any("unavailable" in line for line in lines), lines  # a start, not an outage
    command[command.index("--reconnect-timeout") + 1] = "1"
    gone = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and "did not come back within 1 s" in gone.stderr, gone.stderr


def test_an_actor_says_when_its_server_goes_away_and_when_it_is_back(tmp_path: Path) -> None:
    """The server is killed mid-run and started again on its port, from scratch (it saves no
    checkpoints): the actor says on a line that it went away and what it keeps to send again,
    a line per reconnect attempt with its backoff, and, once it is back, what it resent and
    what became of each; its done line counts the same resends."""
    port = free_port()

    def serve(life: int) -> ServerProcess:
        return running_server(tmp_path / f"life-{life}", *CARTPOLE, ONE_ROLLOUT_A_STEP,
                              extra_args=["--port", str(port)])  # fmt: skip

    server = serve(0)
    actor = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "actor", "--server", server.target, "--env",
         "gymnasium:CartPole-v1", "--num-envs", "4", "--rollout-len", "8", "--steps", "8",
         "--log-every", "1", "--reconnect-timeout", "120"],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out = Output(actor)
        wait_until(lambda: global_step(server) >= 3, 60, "three Steps from the actor")
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        wait_until(lambda: any(map(ATTEMPT.match, out.lines)), 60, "a reconnect attempt line")
        with serve(1) as server:
            err = out.finish(120)
    finally:
        actor.kill()
    lines = out.lines
    assert actor.returncode == 0 and not err.strip(), err
    at = lambda pattern: [i for i, line in enumerate(lines) if pattern.match(line)]  # noqa: E731
    (away,), (back,), attempts = at(AWAY), at(BACK), at(ATTEMPT)
    assert away < attempts[0] and attempts[-1] < back, lines
    gone, came = AWAY.match(lines[away]), BACK.match(lines[back])
    assert gone and came and gone["target"] == came["target"] == f"127.0.0.1:{port}"
    assert gone["code"] in ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED"), lines[away]
    kept = int(gone["kept"])
    assert kept == int(gone["unanswered"]) + int(gone["unconfirmed"]) >= 3, lines[away]
    numbers = [int(ATTEMPT.match(lines[i])[1]) for i in attempts]  # type: ignore[index]
    assert numbers[0] == 1 and "(backoff up to 0.1 s;" in lines[attempts[0]], lines
    assert numbers == sorted(set(numbers)) and int(came["attempts"]) >= numbers[-1], lines
    # Back from scratch: every rollout kept was sent again, and each was trained, answered
    # from the ledger or dropped (for its policy version, ahead of a state that went back).
    resent = int(came["resent"])
    assert resent == kept, (lines[away], lines[back])
    outcomes = int(came["trained"]) + int(came["replayed"]) + int(came["dropped"])
    assert outcomes == resent, lines[back]
    assert came["step"] == "0"
    done = DONE.match(lines[-1])
    assert done, lines[-1]
    assert int(done["resent"]) == resent and int(done["reconnects"]) == 1, lines[-1]
    assert int(done["behind"]) + int(done["ahead"]) >= int(came["dropped"]), lines
    assert int(done["replayed"]) >= int(came["replayed"]), lines


def test_attempt_lines_thin_out_once_the_backoff_stops_growing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A long outage: a line per attempt while the backoff grows, then one each
    ATTEMPT_LINE_S (a clock stands in for the waits)."""
    now = [0.0]
    lines = OutageLines("trainer:50051", reconnect_s=300, clock=lambda: now[0])
    lines.starting = False
    backoff, number = 0.1, 0
    while now[0] < 300:
        number += 1
        lines.attempt(number, backoff / 2, backoff, now[0])
        now[0] += backoff / 2
        backoff = min(MAX_WAIT_S, 2 * backoff)
    said = [int(ATTEMPT.match(line)[1]) for line in capsys.readouterr().out.splitlines()]  # type: ignore[index]
    assert said[:6] == [1, 2, 3, 4, 5, 6]  # backoffs 0.1 to 1.6 s, then the first at 2 s
    capped = said[5:]  # attempts 1 s apart, the first 1.55 s in: one line each 10 s
    assert len(capped) == 30 and number > 250, (capped, number)


def test_actor_trains_the_server_on_lobsim(tmp_path: Path) -> None:
    D = observation_dim(LobsimConfig())
    dims = (f"model.obs_dim={D}", "model.num_actions=9", "model.aux_dim=3")
    with running_server(tmp_path, *dims, ONE_ROLLOUT_A_STEP, "checkpoint.every_s=0") as server:
        code, lines, stderr = actor(
            server, "lobsim", "--steps", "2", "--set", "lobsim.horizon=4", "--seed", "3",
            "--env-groups", "2",
        )  # fmt: skip
        assert code == 0, stderr
        assert global_step(server) == 2
    progress = [line for line in lines if line.startswith("rollout ")]
    assert [line.split()[1] for line in progress] == ["1/2", "2/2"]
    assert "episode return n/a" not in progress[0]  # 8 steps of a 4-step horizon
    assert "bce " in progress[-1] and "aux " in progress[-1]  # the labels reached the server
    done = re.match(
        r"done: 2 rollouts \(2 trained in 2 Steps, 0 dropped behind the policy lag, "
        r"0 dropped ahead of the server's state\), \d+ Acts, (\d+) env steps "
        r"\(([\d.]+) % trained, (\d+) in unfinished rollouts\) in ",
        lines[-1],
    )
    assert done, lines[-1]
    stepped, share, unfinished = int(done[1]), float(done[2]), int(done[3])
    assert stepped - unfinished == 2 * 8 * 4  # two whole rollouts, the rest left over
    assert share == round(100 * 2 * 8 * 4 / stepped, 1)
    assert " | Step p50 " in lines[-1] and " | Act p50 " in lines[-1]
    # The server saves no periodic checkpoints: the line says so, plainly.
    assert lines[-1].endswith("| durable: none of 2 answered (the server saves no periodic "
                              "checkpoints, checkpoint.every_steps and .every_s are 0: a restart "
                              "loses them; "
                              "--wait-checkpoint asks it for one)")  # fmt: skip


def test_a_finishing_actor_waits_until_a_checkpoint_holds_its_steps(tmp_path: Path) -> None:
    """--wait-checkpoint against a server without periodic checkpoints: the actor asks for one
    (no token: it may), and its line counts every Step durable; the checkpoint holds them."""
    with running_server(tmp_path, *CARTPOLE, ONE_ROLLOUT_A_STEP) as server:
        code, lines, stderr = actor(server, "gymnasium:CartPole-v1", "--steps", "3",
                                    "--wait-checkpoint")  # fmt: skip
        assert code == 0, stderr
        assert lines[-1].endswith("| durable: 3 of 3 answered in a checkpoint, 0 not yet")
        with TridentClient(server.target) as client:
            (saved,) = client.list_checkpoints()
    assert saved.global_step == 3


def test_sigint_stops_the_actor_with_its_summary_and_no_traceback(tmp_path: Path) -> None:
    """Ctrl-C mid-run: the Steps sent are answered, the summary and how to go on are printed,
    exit code 130, nothing on stderr."""
    with running_server(tmp_path, *CARTPOLE, ONE_ROLLOUT_A_STEP) as server:
        command = [sys.executable, "-m", "service.cli", "actor", "--server", server.target,
                   "--env", "gymnasium:CartPole-v1", "--num-envs", "4", "--rollout-len", "8",
                   "--log-every", "1", "--steps", "100000"]  # fmt: skip
        running = subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert running.stdout is not None
            for line in running.stdout:  # a Step answered: the actor is in its loop
                if line.startswith("rollout "):
                    break
            running.send_signal(signal.SIGINT)
            out, err = running.communicate(timeout=60)
        finally:
            running.kill()
        lines = out.splitlines()
        assert running.returncode == 130 and err == "", err
        assert lines[-1].startswith("trident actor: stopped by SIGINT; the partial rollout's")
        done = re.match(r"done: (\d+) rollouts \((\d+) trained", lines[-2])
        assert done and done[1] == done[2], lines[-2]
        assert global_step(server) >= int(done[2]) >= 1


def cartpole(num_envs: int, **kwargs: object) -> gymnasium.vector.VectorEnv:
    return gymnasium.make_vec(
        "CartPole-v1", num_envs, vectorization_mode="sync", vector_kwargs=SAME_STEP, **kwargs
    )


def test_truncations_match_single_envs_and_the_server_takes_them(
    cartpole_server: ServerProcess, seed: int, rng: np.random.Generator
) -> None:
    """Episodes cut at 5 steps: every step is a transition of the single env, a truncated one
    hands over its final observation, and the rollout passes the server's validation."""
    N, limit = 3, 5
    env = GymnasiumVectorEnv(cartpole(N, max_episode_steps=limit), seed)
    singles = [gymnasium.make("CartPole-v1", max_episode_steps=limit) for _ in range(N)]
    obs = [single.reset(seed=seed + i)[0] for i, single in enumerate(singles)]
    np.testing.assert_array_equal(env.obs, np.stack(obs))
    truncations = 0
    for _ in range(3 * limit):
        actions = rng.integers(0, 2, N)
        moved = env.step(actions)
        finals = []
        for i, single in enumerate(singles):
            obs_i, reward, terminated, truncated, _ = single.step(int(actions[i]))
            assert moved.rewards[i] == reward
            assert moved.terminated[i] == terminated
            assert moved.truncated[i] == (truncated and not terminated)
            if terminated or truncated:
                if not terminated:
                    finals.append(obs_i)
                obs_i, _ = single.reset()
            np.testing.assert_array_equal(moved.obs[i], obs_i)
        np.testing.assert_array_equal(moved.final_obs, np.reshape(finals, (-1, 4)))
        truncations += len(finals)
    assert truncations > 0
    assert len(env.take_returns()) >= N and env.take_returns() == []

    before = global_step(cartpole_server)
    with TridentClient(cartpole_server.target) as client:
        act = lambda obs: client.act(obs, ActMode.SAMPLE)  # noqa: E731
        rollout = collect_rollout(act, env, horizon=2 * limit)
        assert rollout.truncated.any()
        assert rollout.final_obs.shape == (rollout.truncated.sum(), 4)
        np.testing.assert_array_equal(
            rollout.final_obs_index, np.flatnonzero(rollout.truncated.reshape(-1))
        )
        assert rollout.policy_version == before
        reply = client.step(rollout)
    assert not reply.skipped and reply.global_step == before + 1


def test_unsupported_gymnasium_envs_are_refused() -> None:
    with pytest.raises(InvalidInput, match=r"--env: expected an env with Discrete actions, "
                                           r"got Box"):  # fmt: skip
        make_gymnasium_env("Pendulum-v1", 2, seed=0)
    with pytest.raises(InvalidInput, match=r"Box observations \(of any rank\), got Discrete"):
        make_gymnasium_env("FrozenLake-v1", 2, seed=0)
    with pytest.raises(InvalidInput, match="No-Such-Env"):
        make_gymnasium_env("No-Such-Env-v0", 2, seed=0)
    next_step = gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync")
    with pytest.raises(InvalidInput, match="SAME_STEP"):
        GymnasiumVectorEnv(next_step, seed=0)
    with pytest.raises(InvalidInput, match=r"got 'CartPole-v1' \(a Gymnasium env: --env "
                                           r"gymnasium:CartPole-v1\)"):  # fmt: skip
        check_env_name("CartPole-v1")


class Grid(gymnasium.Env):
    """Observations of rank 3 ([2, 3, 4], drawn from the env's seeded generator), two actions,
    episodes of 5 steps."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2, 3, 4), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def _observe(self) -> np.ndarray:
        return self.np_random.uniform(-1, 1, (2, 3, 4)).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action: int) -> tuple:
        self.t += 1
        return self._observe(), float(action), False, self.t >= 5, {}


def test_observations_of_any_rank_are_flattened(seed: int, rng: np.random.Generator) -> None:
    """Every observation, final ones included, is the env's own in C order, [N, 24] float32."""
    gymnasium.register("TridentGrid-v0", entry_point=Grid)
    env = make_gymnasium_env("TridentGrid-v0", 3, seed)
    raw = gymnasium.make_vec("TridentGrid-v0", 3, vectorization_mode="sync",
                             vector_kwargs=SAME_STEP)  # fmt: skip
    try:
        assert env.dims.obs_dim == 24
        want, _ = raw.reset(seed=seed)
        np.testing.assert_array_equal(env.obs, want.reshape(3, 24))
        truncations = 0
        for _ in range(7):
            actions = rng.integers(0, 2, 3)
            moved = env.step(actions)
            want, _, _, truncated, infos = raw.step(actions)
            assert moved.obs.shape == (3, 24) and moved.obs.dtype == np.float32
            np.testing.assert_array_equal(moved.obs, want.reshape(3, 24))
            finals = [infos["final_obs"][i].reshape(24) for i in np.flatnonzero(truncated)]
            np.testing.assert_array_equal(moved.final_obs, np.reshape(finals, (-1, 24)))
            truncations += len(finals)
        assert truncations == 3  # every env ended its 5-step episode once
    finally:
        env.close()
        raw.close()


def test_a_setting_warning_reaches_the_actor_once(tmp_path: Path) -> None:
    """A C51 support far narrower than CartPole's returns: the server's warning rides on the
    Step replies (every 100 Steps while it holds) and the actor prints it once, naming the
    setting to change."""
    narrow = ("c51.v_min=-0.01", "c51.v_max=0.01", "replay.min_size=16", "replay.batch_size=16",
              "train.steps=200")  # the 115 Steps end no learning-rate schedule  # fmt: skip
    with running_server(tmp_path, *CARTPOLE, ONE_ROLLOUT_A_STEP, *narrow) as server:
        code, lines, stderr = actor(server, "gymnasium:CartPole-v1", "--steps", "115",
                                    "--log-every", "1000")  # fmt: skip
    assert code == 0, stderr
    warned = [line for line in lines if line.startswith("trident actor: the server warns")]
    assert len(warned) == 1, lines
    assert "c51: " in warned[0] and "--set c51.v_min=" in warned[0]
    assert len(server.events("setting")) >= 2  # the replies carried it more than once


def test_an_actor_runs_to_the_end_of_the_servers_run_whatever_its_share(tmp_path: Path) -> None:
    """No --steps: the actor sends until the server's global step reaches train.steps, however
    many of its rollouts make one Step (here three: one environment of a Step's three
    columns). The server commits a checkpoint at its run's end, and a drain after it, with
    nothing new, commits none; an actor after the end is told the run has ended."""
    run = ("train.num_envs=3", "train.rollout_len=4", "train.steps=5")
    with running_server(tmp_path, *CARTPOLE, *run) as server:
        done = trident_cli("actor", "--server", server.target, "--env", "gymnasium:CartPole-v1",
                           "--num-envs", "1")  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert ("runs 1 gymnasium:CartPole-v1 environment in one group, rollouts of 4 steps "
                "each, until the server's global step reaches 5 (its train.steps)") in lines[0]
        assert global_step(server) == 5
        summary = re.match(r"done: (\d+) rollouts \((\d+) trained in 5 Steps, ", lines[-1])
        assert summary and summary[1] == summary[2], lines[-1]
        assert "| global step 5/5 |" in lines[-1], lines[-1]
        assert re.search(r"\| global step 5/5 \|", [line for line in lines
                         if line.startswith("rollout ")][-1])  # fmt: skip
        assert lines[-1].endswith(f"durable: {summary[2]} of {summary[2]} answered in a "
                                  "checkpoint, 0 not yet"), lines[-1]  # fmt: skip
        late = trident_cli("actor", "--server", server.target, "--env", "gymnasium:CartPole-v1")
        assert server.terminate() == 0, server.stderr()[-3000:]
    assert late.returncode == 2 and late.stdout == ""
    assert "the server's run has ended: its global step 5 has reached train.steps = 5" in \
        late.stderr  # fmt: skip
    assert [c.name for c in list_checkpoints(server.checkpoint_dir)] == ["step-0000000005"]
    (skipped,) = server.events("final checkpoint")
    assert skipped["name"] is None and skipped["newest"] == "step-0000000005", skipped


def test_a_dropped_rollout_is_said_on_the_actors_terminal_once_per_reason(
    tmp_path: Path,
) -> None:
    """train.max_policy_lag = 0 and acting beside training: each rollout after the first began
    acting before its predecessor's Step (the first and any that follows a dropped one are
    trained), so the server drops it behind the lag. The actor says the first drop as it
    happens, with the server's words, then counts the rest."""
    with running_server(tmp_path, *CARTPOLE, ONE_ROLLOUT_A_STEP, "train.max_policy_lag=0") \
            as server:  # fmt: skip
        code, lines, stderr = actor(server, "gymnasium:CartPole-v1", "--steps", "4")
    assert code == 0, stderr
    said = [line for line in lines if line.startswith("trident actor: the server dropped")]
    assert len(said) == 1, lines
    assert said[0].startswith("trident actor: the server dropped a rollout behind the policy "
                              "lag (acted on more than train.max_policy_lag"), said  # fmt: skip
    assert "policy_version: expected a version in" in said[0], said
    assert lines.index(said[0]) < len(lines) - 1  # as it happened, before the done: line
    counted = re.match(r"done: 4 rollouts \((\d+) trained in \d+ Steps, (\d+) dropped behind",
                       lines[-1])  # fmt: skip
    assert counted and int(counted[1]) + int(counted[2]) == 4 and int(counted[2]) >= 1, lines[-1]
    # Later ones: counted at the end of each progress line, by reason.
    assert DropLines.counts(LinkCounts(dropped_behind=2)) == " | dropped 2 behind"
    assert DropLines.counts(LinkCounts(dropped_ahead=1)) == " | dropped 1 ahead"
    assert DropLines.counts(LinkCounts()) == ""


def test_a_progress_lines_rate_is_the_last_intervals() -> None:
    """Each line's rate is over the interval since the line before (not since the start); a
    line that comes within a burst of replies takes the span back to a line a second old."""
    rate = Rate(started=0.0)
    assert rate.since(2.0, 2000) == "   1000 env steps/s (last 2.0 s)"
    assert rate.since(4.0, 2500) == "    250 env steps/s (last 2.0 s)"  # slowed: said at once
    assert rate.since(4.0, 2500) == "    250 env steps/s (last 2.0 s)"  # a burst: same span
    assert rate.since(6.0, 6500) == "   2000 env steps/s (last 2.0 s)"
