"""docs/owner.md's promises about errors ("Errors"), tried as a new user: usage errors exit 2 naming the
flag and what is allowed, checked before any request; ``--json`` errors are a JSON object
on stdout; a server that is not a coordinator is named, not dumped; help and completion.

The "coordinator" here is a real tiny HTTP server on loopback that answers HTML and
counts the requests it gets, so "before any request" is a count of 0."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

AITBC = Path(sys.executable).parent / "aitbc"


class _Html(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        code = 200 if self.path.startswith("/v1/runs") else 404
        body = b"<!DOCTYPE html><html><head><title>It works</title></head><body><h1>It works!</h1></body></html>"
        self.send_response(code)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_page():
    """A web server on 127.0.0.1 (a free port) that answers every path with an HTML page."""
    seen: list[str] = []
    handler = type("Handler", (_Html,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    server.seen = seen  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    return lines[0]


# --- exit 2, the flag named, nothing sent ----------------------------------------------------------

INIT = ("distributed-training", "init", "--wallet", "owner", "--target-workers", "2")


def cmd(name: str) -> tuple[str, ...]:
    """``aitbc distributed-training NAME`` on a run id that need not exist (refused first)."""
    return ("distributed-training", name, "--training-id", "training_x", "--wallet", "owner")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            (*INIT, "--model-type", "resnet", "--dataset-size", "1GB"),
            "--model-type: unknown model 'resnet'; allowed: cnn, mlp, transformer",
        ),
        (
            (*INIT, "--model-type", "mlp", "--dataset-size", "12 parsecs"),
            "--dataset-size: dataset size '12 parsecs' is not a size",
        ),
        (
            (*INIT, "--model-type", "mlp", "--dataset-size", "0GB"),
            "--dataset-size: dataset size '0GB' must be more than 0 bytes",
        ),
        (
            (*INIT, "--model-type", "mlp", "--dataset-size", "1GB", "--model-opt", "hidden=99999"),
            "--model-opt: model 'mlp': each of hidden must be in [1, 8192], got 99999",
        ),
        (
            (*INIT, "--model-type", "mlp", "--dataset-size", "1GB", "--budget", "0"),
            "--budget must be more than 0 AIT; got 0",
        ),
        (
            (*cmd("upload-data"), "--data-path", "mnist"),
            "--data-path 'mnist': no such file or folder, and not a dataset name (one of: digits, docs, npz, stdlib, text",
        ),
        (
            (*cmd("discover-workers"), "--required-workers", "2", "--min-gpu", "GTX1"),
            "--min-gpu: unknown GPU class 'GTX1'; known: H100",
        ),
        (
            (*cmd("distribute"), "--mode", "flood"),
            "--mode 'flood' is not a mode; choose one of: sync, async, gossip",
        ),
        (
            (*cmd("distribute"), "--mode", "gossip", "--topology", "star"),
            "--topology: unknown --topology 'star'; allowed: ring, random:K",
        ),
        (
            (*cmd("distribute"), "--mode", "gossip", "--topology", "random:0"),
            "--topology: random:K needs K >= 1 neighbours, got 'random:0'",
        ),
        (
            (*cmd("discover-workers"), "--required-workers", "0"),
            "--required-workers must be at least 1; got 0",
        ),
        (
            (*cmd("distribute"), "--aggregator", "avg"),
            "--aggregator: unknown aggregator 'avg'; allowed: bulyan, centered-clip, geometric-median, krum, mean",
        ),
        (
            (*cmd("distribute"), "--compression", "zip"),
            "--compression: unknown codec 'zip'; allowed: bf16, fp16, int4, int8, none, powersgd, sign, sparseloco, topk, topk-int8",
        ),
        (
            (*cmd("distribute"), "--compression", "topk:ratio=7"),
            "--compression: codec 'topk': ratio must be in (0, 1], got 7.0",
        ),
        (
            (*cmd("distribute"), "--outer", "adam"),
            "--outer: unknown outer optimizer 'adam'; allowed: diloco, fedavg",
        ),
        (
            (*cmd("distribute"), "--outer-lr", "0"),
            "--outer: outer optimizer 'fedavg': lr must be in (0, 10], got 0.0",
        ),
        (
            (*cmd("distribute"), "--outer", "diloco", "--outer-momentum", "1.5"),
            "--outer: outer optimizer 'diloco': momentum must be in [0, 0.99], got 1.5",
        ),
        (
            (*cmd("distribute"), "--precision", "fp16"),
            "--precision 'fp16' is not available; choose one of: fp32, bf16",
        ),
        (("demo", "--model", "resnet"), "--model: unknown model 'resnet'; allowed: cnn, mlp, transformer"),
        (("demo", "--aggregator", "avg"), "--aggregator: unknown aggregator 'avg'"),
        (("demo", "--min-gpu", "GTX1"), "--min-gpu: unknown GPU class 'GTX1'"),
        (("demo", "--dataset", "mnist"), "--dataset 'mnist': no such file or folder"),
        (("simulate", "--aggregator", "avg"), "--aggregator: unknown aggregator 'avg'"),
        (("simulate", "--compression", "int8:chunk=0"), "--compression: unknown codec 'int8' option 'chunk'"),
        (("simulate", "--dataset", "imagenet"), "--dataset: unknown dataset 'imagenet'; allowed: digits, docs, npz"),
        (("simulate", "--threads", "0"), "--threads must be at least 1; got 0"),
        (("wallet", "fund", "owner", "-5"), "amount must be more than 0 AIT; got -5"),
        (("wallet", "fund", "owner", "0"), "amount must be more than 0 AIT; got 0"),
        (("wallet", "send", "owner", "provider-1", "-0.5"), "amount must be more than 0 AIT; got -0.5"),
    ],
)
def test_usage_errors_exit_2_naming_the_flag_before_any_request(aitbc, web_page, args, expected):
    local = args[0] in ("demo", "simulate")  # no coordinator to point elsewhere
    proc = aitbc(*args) if local else aitbc(*args, "--coordinator", web_page.url)

    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = _one_error_line(proc)
    assert expected in line, line
    assert "between 0 and" not in line  # an amount's range never says 0 is allowed
    assert web_page.seen == []  # refused here: nothing reached the server
    assert not (aitbc.home / "stack.json").exists()  # demo started no stack


def test_usage_error_with_json_prints_the_error_object_on_stdout(aitbc, web_page):
    proc = aitbc(*INIT, "--model-type", "resnet", "--dataset-size", "1GB", "--json", "--coordinator", web_page.url)

    assert proc.returncode == 2
    assert json.loads(proc.stdout) == {
        "error": "usage",
        "detail": "--model-type: unknown model 'resnet'; allowed: cnn, mlp, transformer",
    }
    assert _one_error_line(proc) == "error: --model-type: unknown model 'resnet'; allowed: cnn, mlp, transformer"


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (("wallet", "show", "nobody", "--json"), 1, "not_found"),
        (("wallet", "fund", "nobody", "0", "--json"), 2, "bad_amount"),
        (("wallet", "show", "nobody", "--json", "--bogus"), 2, "usage"),  # the parser's error
        (("ipfs", "ls", "bafkreinotacid", "--json"), 2, "usage"),
        (("ipfs", "get", "bafkreinotacid", "--json"), 2, "usage"),
        (("down", "--json", "--workers", "3"), 2, "usage"),
    ],
)
def test_every_error_with_json_is_one_json_object_on_stdout(aitbc, args, code, error):
    proc = aitbc(*args)

    assert proc.returncode == code, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["error"] == error and set(obj) == {"error", "detail"}
    assert _one_error_line(proc) == f"error: {obj['detail']}"


# --- a server that is not a coordinator -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "answer"),
    [
        (("distributed-training", "list"), "200 text/html to GET /v1/runs"),
        (("distributed-training", "status", "--training-id", "training_x"), "200 text/html to GET /v1/runs/training_x"),
        (("market", "offers"), "404 text/html to GET /v1/market/offers"),
        (("ledger", "verify"), "text/html"),
    ],
)
def test_a_web_page_is_named_not_printed(aitbc, web_page, args, answer):
    proc = aitbc(*args, "--coordinator", web_page.url)

    assert proc.returncode == 1, proc.stderr
    line = _one_error_line(proc)
    assert f"{web_page.url} answered" in line and answer in line, line
    assert "not an aitbc coordinator (no JSON API at" in line and "/v1/health" in line
    assert "<" not in proc.stderr + proc.stdout  # no HTML


def test_a_signed_request_to_a_web_page(aitbc, web_page):
    assert aitbc("wallet", "create", "owner").returncode == 0

    proc = aitbc("wallet", "fund", "owner", "5", "--coordinator", web_page.url, "--json")

    assert proc.returncode == 1
    obj = json.loads(proc.stdout)
    assert obj["error"] == "not_a_coordinator"
    assert obj["detail"].startswith(f"{web_page.url} answered 404 text/html to POST /v1/")
    assert "<html" not in proc.stderr


# --- help and completion --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [(), ("distributed-training", "distribute"), ("wallet", "list"), ("up",), ("simulate",), ("ipfs", "ls")]
)
def test_help_shows_no_placeholder_on_flags(aitbc, command):
    proc = aitbc(*command, "--help")

    assert proc.returncode == 0, proc.stderr
    assert "<bool>" not in proc.stdout
    assert "--help" in proc.stdout


def test_shell_completion_is_offered_and_completes(aitbc):
    help_text = aitbc("--help").stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text

    script = aitbc("--show-completion", "bash")
    assert script.returncode == 0 and "_AITBC_COMPLETE=complete_bash" in script.stdout

    env = dict(os.environ, _AITBC_COMPLETE="complete_bash", COMP_WORDS="aitbc distributed-training mon", COMP_CWORD="2")
    done = subprocess.run([str(AITBC)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["monitor"]


# --- tables at 80 columns (the live commands' tables: tests/e2e/test_readme_usage.py) -------------


def test_simulate_table_at_80_columns_keeps_the_cid_whole(aitbc):
    env = dict(os.environ, AITBC_HOME=str(aitbc.home), OMP_NUM_THREADS="1", COLUMNS="80")
    args = ["simulate", "--workers", "2", "--rounds", "1", "--local-steps", "2"]
    proc = subprocess.run([str(AITBC), *args], capture_output=True, text=True, env=env, timeout=300)
    as_json = json.loads(aitbc(*args, "--json").stdout.splitlines()[-1])

    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout
    assert as_json["final_model_cid"] in proc.stdout  # same seed, same CID: whole, on one line
