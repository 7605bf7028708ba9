"""``aitbc worker start --metrics-port``: a port that cannot be served is one clear line and a
non-zero exit before the worker does anything (no wallet made, no coordinator contacted); a
port out of range is a usage error naming the flag. The served endpoint of a live worker is
checked in tests/e2e/test_metrics.py."""

from __future__ import annotations

import socket


def test_a_port_in_use_is_one_line_and_exit_1(aitbc):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = aitbc("worker", "start", "--coordinator", "http://127.0.0.1:9", "--metrics-port", str(port), timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines == [f"error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: already in use"], r.stderr
    assert not (aitbc.home / "wallets").exists()  # nothing else was done


def test_a_port_out_of_range_is_a_usage_error(aitbc):
    for bad in ("0", "70000"):
        r = aitbc("worker", "start", "--coordinator", "http://127.0.0.1:9", "--metrics-port", bad, timeout=60)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert "--metrics-port" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_environment_sets_the_port_and_the_flag_wins(aitbc, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("AITBC_WORKER_METRICS_PORT", str(port))
        r = aitbc("worker", "start", "--coordinator", "http://127.0.0.1:9", timeout=60)
        assert r.returncode == 1 and f"--metrics-port {port}" in r.stderr, r.stderr
        monkeypatch.setenv("AITBC_WORKER_METRICS_PORT", "not-a-port")
        r = aitbc("worker", "start", "--coordinator", "http://127.0.0.1:9", "--metrics-port", str(port), timeout=60)
        assert r.returncode == 1 and f"--metrics-port {port}" in r.stderr, r.stderr


def test_a_host_that_is_no_address_is_one_line_and_exit_1(aitbc):
    # "a..b" is refused by the IDNA codec (a UnicodeError, not an OSError): it was a traceback
    for host in ("a..b", "nonexistent.invalid"):
        r = aitbc(
            "worker",
            "start",
            "--coordinator",
            "http://127.0.0.1:9",
            "--metrics-port",
            "9",
            "--metrics-host",
            host,
            timeout=60,
        )
        assert r.returncode == 1, (host, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --metrics-port 9: cannot listen on {host}:9: "), lines
        assert "Traceback" not in r.stderr
    assert not (aitbc.home / "wallets").exists()  # nothing else was done
