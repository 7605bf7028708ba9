"""Data parallelism inside one provider: ``aitbc worker start --gpus N``.

The worker's own process is rank 0; it starts ranks ``1..N-1`` as processes of their own
(``python -m aitbc.training.parallel``), which meet it over ``torch.distributed`` on
127.0.0.1 at a port the rank-0 store picked at run time (nccl between CUDA ranks, rank
``r`` on ``cuda:r``; gloo between CPU ranks). Nothing is pickled: rank 0 drives the
others over a gloo *control* group with JSON commands and raw tensor broadcasts.

A round: rank 0 broadcasts the round (its local config, the global parameters and its
inner optimizer's state, and the shard when it changed); every rank then runs the same
:meth:`~aitbc.training.local.LocalTrainer.train_round`: each draws the same global batch
of each step, trains on its contiguous slice under ``DistributedDataParallel`` with the
loss weighted by its share of the batch, so the averaged gradient is the whole batch's
and every rank takes the step one process would have taken. Rank 0 alone sends the one
update (its model's delta, the same on every rank) and keeps the proof.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Literal, TypedDict

import torch
import torch.distributed as dist
from torch import Tensor, nn

from aitbc.core.options import build_config
from aitbc.errors import AitbcError
from aitbc.json_value import JSONObject
from aitbc.training.data_spec import DataSpec
from aitbc.training.group import Group
from aitbc.training.local import LocalConfig, LocalTrainer, build_inner_optimizer
from aitbc.training.proof import load_optimizer_tensors, optimizer_tensors

log = logging.getLogger("aitbc.worker.ranks")

HOST = "127.0.0.1"
# A rank waits for rank 0's next command as long as the worker waits for its next job.
IDLE_TIMEOUT = timedelta(days=30)
_DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16)} | {
    str(t).removeprefix("torch."): t for t in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
}


class RankFailed(AitbcError):
    """A data-parallel rank of this worker exited: the worker stops (one line, exit 1)."""


# --- the control channel: JSON and tensors broadcast from rank 0 ---------------------------


class _Job(TypedDict):
    """A new job: every rank builds the model and takes its shard (tensors ``x``, ``y``)."""

    cmd: Literal["job"]
    model_type: str
    model_options: Mapping[str, object]
    spec: tuple[
        Literal["classification", "language"], list[int], int
    ]  # DataSpec's task, input shape and classes (a JSON array)
    allow_code: list[str]
    cfg: JSONObject  # the LocalConfig's fields
    seed: int
    weights: dict[str, str]  # a fine-tune's pretrained blobs: CID -> the file rank 0 fetched


class _Round(TypedDict):
    """Train a round from tensor ``params`` (and ``opt.*``; ``x``, ``y`` if the shard changed)."""

    cmd: Literal["round"]
    round: int
    cfg: JSONObject  # the LocalConfig's fields


class _Stop(TypedDict):
    cmd: Literal["stop"]


_Command = _Job | _Round | _Stop


def _send(group: Group, command: _Command, tensors: dict[str, Tensor] | None = None) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in (tensors or {}).items()}
    obj: dict[str, object] = dict(command)
    obj["tensors"] = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in tensors.items()]
    data = json.dumps(obj).encode()
    dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0, group=group.control)
    dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, group=group.control)
    for v in tensors.values():
        if v.numel():
            dist.broadcast(v, 0, group=group.control)


def _receive(group: Group) -> tuple[_Command, dict[str, Tensor]]:
    n = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(n, 0, group=group.control)
    data = torch.empty(int(n), dtype=torch.uint8)
    dist.broadcast(data, 0, group=group.control)
    obj = json.loads(bytes(data.numpy()).decode())
    tensors = {}
    for name, shape, dtype in obj.pop("tensors"):
        t = torch.empty(shape, dtype=_DTYPES[dtype])
        if t.numel():
            dist.broadcast(t, 0, group=group.control)
        tensors[name] = t
    return obj, tensors


def loopback_store(world: int) -> tuple[dist.TCPStore, socket.socket]:
    """Rank 0's rendezvous store on 127.0.0.1 only, at a port the kernel picks now (torch's
    own master store listens on every interface): the socket, kept open by the caller, is
    handed to the store. The other ranks connect to ``store.port``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    sock.listen(128)
    store = dist.TCPStore(
        HOST,
        sock.getsockname()[1],
        world,
        is_master=True,
        timeout=timedelta(seconds=120),
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
    )
    return store, sock


def _loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n.startswith("lo")), "lo")


def join_group(rank: int, world: int, device: torch.device, store: dist.Store) -> Group:
    """Join the group: gloo's and nccl's own sockets on the loopback interface (not the
    host name's address, which may be a public one), unless the operator named another."""
    lo = _loopback_interface()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=IDLE_TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT) if backend == "nccl" else dist.group.WORLD
    return Group(rank, world, device, control)


# --- rank 0 ---------------------------------------------------------------------------


class Ranks:
    """Rank 0's side: starts the other ranks, and sends them each job and round."""

    def __init__(self, devices: list[torch.device], *, allow_code: list[str] | tuple[str, ...] = ()) -> None:
        if len(devices) < 2:
            raise ValueError("a data-parallel group needs at least two ranks")
        if dist.is_initialized():
            raise RuntimeError("this process is already in a torch.distributed group")
        self.world = len(devices)
        self.allow_code = list(allow_code)
        store, self._listener = loopback_store(self.world)
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "aitbc.training.parallel", "--rank", str(r), "--world", str(self.world)]
                + ["--port", str(store.port), "--device", str(devices[r]), "--parent", str(os.getpid())]
            )
            for r in range(1, self.world)
        ]
        try:
            self.group = join_group(0, self.world, devices[0], store)
        except BaseException:
            self._kill()
            raise
        self._sent_data: tuple[Tensor, Tensor] | None = None
        self._closed = False
        log.info("data parallel over %d ranks (%s) on %s", self.world, dist.get_backend(), [str(d) for d in devices])

    def job(
        self,
        model_type: str,
        model_options: Mapping[str, object],
        spec: DataSpec,
        cfg: LocalConfig,
        seed: int,
        x: Tensor,
        y: Tensor,
        *,
        weights: Mapping[str, str] | None = None,
    ) -> None:
        """A new job: every other rank builds the model and takes the shard. The caller then
        builds its own :class:`LocalTrainer` with :attr:`group` (DDP's collective setup).
        ``weights``: the local files of the blobs a fine-tune's options name, by CID."""
        self._check()
        body: _Job = {
            "cmd": "job",
            "model_type": model_type,
            "model_options": model_options,
            "spec": (spec.task, list(spec.input_shape), spec.num_classes),
            "allow_code": self.allow_code,
            "cfg": asdict(cfg),
            "seed": seed,
            "weights": dict(weights or {}),
        }
        _send(self.group, body, {"x": x, "y": y})
        self._sent_data = (x, y)

    def round(self, trainer: LocalTrainer, params: Tensor, round: int) -> None:
        """Round ``round`` from ``params``: the others take rank 0's config, optimizer state
        (and shard, if it changed); then every rank calls ``train_round`` (the caller too)."""
        self._check()
        tensors = {"params": params, **{f"opt.{k}": v for k, v in optimizer_tensors(trainer.opt).items()}}
        sent = self._sent_data
        if sent is None or sent[0] is not trainer.x or sent[1] is not trainer.y:
            tensors |= {"x": trainer.x, "y": trainer.y}
            self._sent_data = (trainer.x, trainer.y)
        _send(self.group, {"cmd": "round", "round": round, "cfg": asdict(trainer.cfg)}, tensors)

    def _check(self) -> None:
        dead = [r for r, p in enumerate(self.procs, start=1) if p.poll() is not None]
        if dead:
            raise RankFailed(f"data-parallel rank {dead[0]} exited (code {self.procs[dead[0] - 1].returncode})")

    def failure(self, e: BaseException) -> RankFailed:
        """What a collective's error means: the rank that exited, if one did (it may take a
        moment to be reaped), else the error's first line."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                self._check()
            except RankFailed as dead:
                return dead
            time.sleep(0.05)
        first = (str(e).splitlines() or [type(e).__name__])[0][:300]
        return RankFailed(f"data-parallel training failed: {first}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if all(p.poll() is None for p in self.procs):
                _send(self.group, {"cmd": "stop"})
                for p in self.procs:
                    p.wait(timeout=30)
        except Exception as e:  # noqa: BLE001 - a rank already gone: killed below
            log.warning("data-parallel ranks did not stop cleanly: %s", e)
        finally:
            self._kill()
            dist.destroy_process_group()

    def _kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def draws_dropout(model: nn.Module) -> bool:
    """Whether ``model`` drops activations at random in training (a LoRA adapter's dropout,
    GPT-2's, the built-in transformer's). Ranks that split a batch draw their masks for their
    slices, not the slices of the whole batch's masks, so such a step does not replay on
    one machine: a job whose updates are spot-checked trains it on one rank."""
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


# --- ranks 1..N-1 -----------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    """Leave when the worker that started this rank is gone (killed without a goodbye)."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(1.0)


def _local_files(files: Mapping[str, str]) -> Callable[[str], Path]:
    """The pretrained blobs rank 0 fetched, by CID (one machine: its files are ours)."""

    def path(cid: str) -> Path:
        if cid not in files:
            raise RankFailed(f"rank 0 sent no file for blob {cid}")
        return Path(files[cid])

    return path


def serve(rank: int, world: int, port: int, device: torch.device) -> None:
    """A helper rank's loop: build each job's model, train each round as rank 0 says."""
    from aitbc.training.models import build_model

    store = dist.TCPStore(HOST, port, world, is_master=False, timeout=timedelta(seconds=120))
    group = join_group(rank, world, device, store)
    trainer: LocalTrainer | None = None
    while True:
        obj, ts = _receive(group)
        if obj["cmd"] == "stop":
            break
        cfg = build_config(LocalConfig, obj["cfg"], what="rank 0's local config")
        if obj["cmd"] == "job":
            task, shape, classes = obj["spec"]
            model = build_model(
                obj["model_type"],
                DataSpec(task, tuple(shape), classes),
                obj["model_options"],
                allow_code=obj["allow_code"],
                max_params=None,  # rank 0 held it to the worker's max_params before any rank was told
                weights=_local_files(obj.get("weights", {})),
            )
            trainer = None  # the last job's DDP goes before the next is built
            trainer = LocalTrainer(model, ts["x"], ts["y"], cfg, seed=int(obj["seed"]), device=device, group=group)
        elif obj["cmd"] == "round":
            assert trainer is not None, "a round before its job"
            data = (ts["x"], ts["y"]) if "x" in ts else None
            trainer.reconfigure(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, data=data)
            trainer.cfg = cfg
            trainer.opt = build_inner_optimizer(cfg, trainer.model.parameters())
            load_optimizer_tensors(trainer.opt, {k[4:]: v for k, v in ts.items() if k.startswith("opt.")})
            trainer.train_round(ts["params"], round=int(obj["round"]))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m aitbc.training.parallel", description="A data-parallel rank (started by the worker)."
    )
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--parent", type=int, required=True)
    a = p.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(a.parent,), daemon=True).start()
    try:
        serve(a.rank, a.world, a.port, torch.device(a.device))
    except Exception as e:  # noqa: BLE001 - one line to the worker's log; rank 0 sees this rank gone
        print(f"aitbc data-parallel rank {a.rank}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
