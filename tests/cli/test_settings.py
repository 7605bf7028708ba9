"""Settings of the two services: a flag wins over an ``AITBC_...`` environment variable,
which wins over the default in the settings class; a bad value is one line naming where
it came from and what is allowed (exit 2). Real ``aitbc`` processes on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from aitbc.coordinator.config import Settings
from aitbc.errors import UsageError
from aitbc.settings import env_name, load_settings
from aitbc.worker.config import WorkerSettings

AITBC = Path(sys.executable).parent / "aitbc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any AITBC_ setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITBC_")}
    return {**env, "OMP_NUM_THREADS": "1", "COLUMNS": "200", **extra}


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        p = subprocess.Popen([str(AITBC), *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield p
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for(what: str, check, p: subprocess.Popen, log: Path, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert p.poll() is None, f"{what}: the process ended ({p.returncode}):\n{log.read_text()}"
        try:
            got = check()
        except httpx.TransportError:
            got = None
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} never happened:\n{log.read_text()}")


# --- the settings classes, in process ---------------------------------------------------


def test_environment_sets_and_a_flag_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("AITBC_LEASE_SECONDS", "7.5")
    monkeypatch.setenv("AITBC_TICK_SECONDS", "0.5")
    s = load_settings(Settings, {"home": tmp_path, "tick_seconds": 0.1, "port": None})
    assert (s.lease_seconds, s.tick_seconds) == (7.5, 0.1)
    assert s.port == Settings.model_fields["port"].default  # neither given: the class's default

    monkeypatch.setenv("AITBC_WORKER_HEARTBEAT_SECONDS", "0.25")
    monkeypatch.setenv("AITBC_WORKER_PRICE", "2.5")
    w = load_settings(WorkerSettings, {"price": "3"})
    assert (w.heartbeat_seconds, w.price) == (0.25, "3")


def test_bad_values_name_their_source(monkeypatch, tmp_path):
    monkeypatch.setenv("AITBC_LEASE_SECONDS", "soon")
    with pytest.raises(UsageError) as e:
        load_settings(Settings, {"home": tmp_path})
    assert (
        str(e.value)
        == "AITBC_LEASE_SECONDS='soon' is not allowed: input should be a valid number, unable to parse string as a number"
    )
    with pytest.raises(UsageError, match=r"^--lease -1\.0 is not allowed: input should be greater than 0$"):
        load_settings(Settings, {"home": tmp_path, "lease_seconds": -1.0}, flag_names={"lease_seconds": "--lease"})
    monkeypatch.setenv("AITBC_LEASE_SECONDS", "inf")  # a lease that never ends is no lease
    with pytest.raises(
        UsageError, match=r"^AITBC_LEASE_SECONDS='inf' is not allowed: input should be a finite number$"
    ):
        load_settings(Settings, {"home": tmp_path})
    monkeypatch.delenv("AITBC_LEASE_SECONDS")
    # the driver lease is renewed each quarter, by a thread that looks every eighth: over 4 ticks
    with pytest.raises(UsageError, match=r"^--driver-lease 0\.5 is not allowed: .*at least 4 x tick_seconds \(0\.8"):
        load_settings(
            Settings,
            {"home": tmp_path, "driver_lease_seconds": 0.5, "tick_seconds": 0.2},
            flag_names={"driver_lease_seconds": "--driver-lease"},
        )
    assert load_settings(Settings, {"home": tmp_path}).driver_lease_seconds == 5.0
    monkeypatch.setenv("AITBC_NETWORK", "mainnet")
    with pytest.raises(UsageError, match="AITBC_NETWORK='mainnet' is not allowed: network 'mainnet' is not available"):
        load_settings(Settings, {"home": tmp_path})
    monkeypatch.setenv("AITBC_WORKER_MAX_BOND", "lots")
    with pytest.raises(UsageError, match="AITBC_WORKER_MAX_BOND='lots' is not allowed: .*give AIT"):
        load_settings(WorkerSettings, {})


def test_device_and_gpus_are_checked_with_one_line_naming_the_flag(monkeypatch):
    from aitbc.cli.settings_flags import flag_names

    def refused(flags: dict) -> str:
        with pytest.raises(UsageError) as e:
            load_settings(WorkerSettings, flags, flag_names=flag_names(WorkerSettings))
        return str(e.value)

    for bad in ("gpu", "cuda:", "cuda:x", "cpu:0", "tpu", "cuda:-1"):
        assert refused({"device": bad}) == (
            f"--device {bad!r} is not allowed: device must be auto, cpu, cuda or cuda:N (N a GPU index), got {bad!r}"
        )
    assert refused({"gpus": 0}) == "--gpus 0 is not allowed: input should be greater than or equal to 1"
    assert refused({"gpus": 65}).startswith("--gpus 65 is not allowed: input should be less than or equal to 64")
    assert "give 1 with cheat" in refused({"gpus": 2, "cheat": "skip-half"})
    monkeypatch.setenv("AITBC_WORKER_GPUS", "two")
    assert refused({}).startswith("AITBC_WORKER_GPUS='two' is not allowed")
    monkeypatch.setenv("AITBC_WORKER_GPUS", "2")
    monkeypatch.setenv("AITBC_WORKER_DEVICE", "CUDA:1")
    w = load_settings(WorkerSettings, {})
    assert (w.device, w.gpus) == ("cuda:1", 2)  # the spelling is checked here; the hardware at start
    assert load_settings(WorkerSettings, {"device": "cpu"}).device == "cpu"  # a flag wins


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals of a machine without a GPU")
def test_worker_start_on_a_gpu_this_machine_lacks_is_one_line_and_exit_2(tmp_path):
    for args, says in [
        (["--device", "cuda:3"], "--device cuda:3: this machine has no CUDA GPU torch can use"),
        (["--device", "cuda", "--gpus", "2"], "--device cuda: this machine has no CUDA GPU"),
        (["--device", "npu"], "--device 'npu' is not allowed: device must be auto, cpu, cuda or cuda:N"),
        (["--gpus", "0"], "--gpus 0 is not allowed"),
    ]:
        home = tmp_path / "home"
        cmd = [str(AITBC), "worker", "start", "--home", str(home), "--coordinator", "http://127.0.0.1:9", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=120)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (args, r.stderr)
        assert not home.exists()  # refused before its wallet is made


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1:8700", "127.0.0.1:8700", "http://", "http://127.0.0.1:9,ws://x", "http://[::1", "http://x:abc"],
)
def test_worker_start_with_a_coordinator_url_no_request_can_reach_is_one_line_and_exit_2(tmp_path, url):
    """Such a URL was retried as an outage for ever (every 5 s, "is it running?")."""
    home = tmp_path / "home"
    cmd = [str(AITBC), "worker", "start", "--home", str(home), "--coordinator", url]
    r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not allowed: give http://HOST[:PORT] or https://HOST[:PORT]" in lines[0], r.stderr
    assert not home.exists()  # refused before its wallet is made


def test_worker_start_with_a_ca_cert_that_is_missing_writes_nothing(tmp_path):
    home = tmp_path / "home"
    ca = tmp_path / "no-such-ca.pem"
    cmd = [
        str(AITBC),
        "worker",
        "start",
        "--home",
        str(home),
        "--coordinator",
        "https://127.0.0.1:9",
        "--ca-cert",
        str(ca),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"CA certificate {ca} not found" in lines[0], r.stderr
    assert not home.exists()  # refused before its wallet is made


def test_a_worker_flag_is_checked_without_importing_torch():
    """The worker's settings (every flag's check, ``--device`` spelled right included) load
    without torch: a mistyped flag is refused in a fraction of a second, not after the second
    torch takes to import. Only a device that needs the hardware looked at imports it."""
    code = (
        "import sys; from aitbc.worker.config import WorkerSettings; from aitbc.training import devices; "
        "devices.check_device_spec('cuda:1'); assert 'torch' not in sys.modules, 'torch imported'; "
        "devices.resolve_devices('cpu'); assert 'torch' in sys.modules"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0, r.stderr


def test_every_setting_has_its_variable():
    assert env_name(Settings, "db_url") == "AITBC_DB_URL"
    assert env_name(Settings, "home") == "AITBC_HOME"
    assert env_name(WorkerSettings, "poll_seconds") == "AITBC_WORKER_POLL_SECONDS"


def test_serve_and_start_flag_every_setting():
    """Each field of the settings classes is a flag of its command, generated from the field
    (a tunable nobody can set from the command line is a default in disguise); ``--home`` is
    serve's own option, declared beside them."""
    import typer

    from aitbc.cli.main import app
    from aitbc.cli.settings_flags import setting_flags

    root = typer.main.get_command(app)
    ctx = typer._click.Context(root)
    for group, name, cls in (("coordinator", "serve", Settings), ("worker", "start", WorkerSettings)):
        command = root.get_command(ctx, group).get_command(ctx, name)
        options = {p.name: p for p in command.params}
        table = setting_flags(cls, declared={"home"})
        assert {f.field for f in table} == set(cls.model_fields) - {"home"}
        for f in table:
            assert options[f.field].opts == [f.flag], f.field
            assert options[f.field].help.startswith(cls.model_fields[f.field].description), f.field
            assert f"env {env_name(cls, f.field)})" in options[f.field].help, f.field
    assert "home" in {p.name for p in root.get_command(ctx, "coordinator").get_command(ctx, "serve").params}


def test_a_megabyte_flag_reaches_its_setting_in_bytes(tmp_path):
    from aitbc.cli.settings_flags import flag_names, setting_flags

    (blob,) = [f for f in setting_flags(Settings) if f.field == "max_blob_bytes"]
    assert (blob.flag, blob.value(1.5), blob.value(None)) == ("--max-blob-mb", 3 << 19, None)
    assert "(default 256 MiB; env AITBC_MAX_BLOB_BYTES)" in blob.help
    with pytest.raises(UsageError, match=r"^--max-blob-mb \(in bytes\) 0 is not allowed"):
        load_settings(Settings, {"home": tmp_path, "max_blob_bytes": blob.value(0.0)}, flag_names=flag_names(Settings))


# --- the commands -----------------------------------------------------------------------


def test_bad_environment_value_is_one_line_and_exit_2(tmp_path):
    for args, var, value, allowed in [
        (["coordinator", "serve"], "AITBC_LEASE_SECONDS", "soon", "valid number"),
        (["coordinator", "serve"], "AITBC_LOG_LEVEL", "loud", "'debug', 'info', 'warning' or 'error'"),
        (["coordinator", "serve"], "AITBC_BOOKS_NICE", "20", "less than or equal to 19"),
        (["worker", "start"], "AITBC_WORKER_AVAILABILITY", "2", "less than or equal to 1"),
    ]:
        env = clean_env(**{var: value}, AITBC_HOME=str(tmp_path / "home"))
        r = subprocess.run([str(AITBC), *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert f"{var}={value!r} is not allowed" in lines[0] and allowed in lines[0], lines[0]
    assert not (tmp_path / "home").exists()  # nothing written on refusal


def test_environment_and_flags_reach_both_services(tmp_path):
    """The coordinator takes its blob limit from the environment and its port from the flag
    over the environment's; a worker takes its price from the environment and its GPU from
    the flag over the environment's, and both show in the market."""
    port, env_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    coord_env = clean_env(AITBC_PORT=str(env_port), AITBC_MAX_BLOB_BYTES="1000", AITBC_LOG_LEVEL="warning")
    serve = ["coordinator", "serve", "--home", str(tmp_path / "coord"), "--port", str(port)]
    with process(serve, coord_env, tmp_path / "coordinator.log") as coord:
        wait_for(
            "the coordinator on --port",
            lambda: httpx.get(f"{url}/v1/health", timeout=1).is_success,
            coord,
            tmp_path / "coordinator.log",
        )
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{env_port}/v1/health", timeout=1)
        from aitbc.client import ApiError, CoordinatorClient
        from aitbc.ledger.wallet import Wallet
        from aitbc.storage.cid import cid_of_bytes

        with CoordinatorClient(url, Wallet.generate("u")) as c:
            c.put_blob(cid_of_bytes(b"x" * 1000), b"x" * 1000)
            with pytest.raises(ApiError) as e:
                c.put_blob(cid_of_bytes(b"x" * 1001), b"x" * 1001)
            assert e.value.status == 413

        worker_env = clean_env(AITBC_WORKER_PRICE="2.5", AITBC_WORKER_GPU="A100", AITBC_WORKER_LOG_LEVEL="warning")
        start = ["worker", "start", "--coordinator", url, "--home", str(tmp_path / "w"), "--gpu", "RTX4090"]
        with process(start, worker_env, tmp_path / "worker.log") as worker:
            offers = wait_for(
                "the worker's offer",
                lambda: httpx.get(f"{url}/v1/market/offers", timeout=5).json()["data"],
                worker,
                tmp_path / "worker.log",
            )
            assert [(o["gpu_type"], o["price"]) for o in offers] == [("RTX4090", "2.5")], offers
