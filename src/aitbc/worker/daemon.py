"""The provider's worker: offer a GPU, heartbeat, pull a job, train, send signed updates.

:class:`Worker` builds the worker's parts and runs its job loop (:mod:`aitbc.worker.job_loop`):

- :class:`~aitbc.worker.calls.CoordinatorCalls`: every request to the coordinator;
- :class:`~aitbc.worker.fetcher.ModelFetcher`: global models and shards by CID, from peers
  or the coordinator, and the blobs it serves its peers (``--listen``);
- :class:`~aitbc.worker.round_training.RoundTrainer`: one round's update;
- :class:`~aitbc.worker.sending.SendPipeline`: updates sent, overlapped with training;
- :class:`~aitbc.worker.gossip.GossipLoop`: a gossip job's rounds;
- :class:`~aitbc.worker.spot_checks.SpotChecks`: committed states kept and revealed.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

from aitbc.client import CoordinatorClient
from aitbc.ledger.wallet import ensure_wallet
from aitbc.market.capacity import offer_max_params
from aitbc.market.gpus import detect_device
from aitbc.training.devices import resolve_devices
from aitbc.training.parallel import Ranks
from aitbc.worker.attack import Attacker
from aitbc.worker.calls import CoordinatorCalls
from aitbc.worker.config import WorkerSettings
from aitbc.worker.fetcher import ModelFetcher
from aitbc.worker.job_loop import JobLoop
from aitbc.worker.metrics import WorkerMetrics
from aitbc.worker.peers import BlobServer, parse_listen
from aitbc.worker.progress import Reporter
from aitbc.worker.round_training import RoundTrainer
from aitbc.worker.spot_checks import SpotChecks

log = logging.getLogger("aitbc.worker")


class Worker(JobLoop):
    """A provider's worker: its parts, and :meth:`run`, the job loop with its peer server
    and data-parallel ranks around it."""

    def __init__(
        self,
        cfg: WorkerSettings,
        *,
        coordinator: str,
        home: Path,
        ca_cert: Path | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.coordinator = coordinator
        # first: a device this machine lacks is refused before anything is written
        self.devices = resolve_devices(cfg.device, cfg.gpus)  # one per data-parallel rank
        # then the coordinator's URL and CA (ftp://, no host, an unreadable --ca-cert): before the wallet too
        self.client = CoordinatorClient(coordinator, timeout=cfg.poll_seconds + 30, ca_cert=ca_cert)
        metrics = metrics or WorkerMetrics()  # served on --metrics-port by the caller, if asked
        wallet = self.client.wallet = ensure_wallet(home, cfg.wallet)
        calls = CoordinatorCalls(
            self.client, stop=threading.Event(), backoff=cfg.backoff_seconds, max_backoff=cfg.max_backoff_seconds
        )
        fetcher = ModelFetcher(
            calls,
            metrics,
            home=home,
            wallet=wallet.name,
            cache_bytes=cfg.cache_bytes,
            peer_timeout=cfg.peer_timeout_seconds,
            advertise=cfg.advertise_url(),
            current_shard=lambda: self.job.shard_cid if self.job is not None else "",
        )
        reporter = Reporter(self._send_progress)  # progress goes out beside training, never in its way
        spot_checks = SpotChecks(
            calls, folder=home / "worker-proofs" / wallet.name, memory_bytes=cfg.proof_memory_bytes
        )
        attacker = Attacker(cfg.attack) if cfg.attack else None
        device = detect_device(self.devices)
        # what the offer states it trains, and the most this worker builds (None: no limit)
        sharing = len(self.devices) if device["device"] == "cpu" else 1  # CPU ranks share its RAM
        max_params = offer_max_params(device.get("memory_bytes"), override=cfg.max_params, sharing=sharing)
        trainer = RoundTrainer(
            cfg,
            fetcher=fetcher,
            spot_checks=spot_checks,
            metrics=metrics,
            reporter=reporter,
            devices=self.devices,
            attacker=attacker,
            max_params=max_params,
        )
        super().__init__(
            cfg,
            calls=calls,
            fetcher=fetcher,
            trainer=trainer,
            spot_checks=spot_checks,
            metrics=metrics,
            reporter=reporter,
            wallet=wallet,
            home=home,
            device=device,
        )
        _warm_up()

    def run(self) -> None:
        log.info(
            "worker %s (%s, training on %s x%d, advertised %s at %s AIT/round) -> %s",
            self.wallet.address,
            self.device.get("name"),
            self.devices[0],
            len(self.devices),
            self.cfg.gpu,
            self.cfg.price,
            self.coordinator,
        )
        if self.cfg.listen is not None:  # first: a port in use is an error before the offer is made
            host, port = parse_listen(self.cfg.listen)
            server = self.fetcher.server = BlobServer(
                host,
                port,
                self.fetcher.held,
                connections=self.cfg.peer_connections,
                corrupt=self.cfg.cheat == "bad-blobs",
                records=self.published.get,
                pace=self.gossip_pace,
            )
            log.info("serving held blobs to peers on %s:%d as %s", host, server.port, self.fetcher.advertise)
        if len(self.devices) > 1:
            self.trainer.ranks = Ranks(self.devices, allow_code=self.cfg.allow_code)
        try:
            self._run()
        finally:
            if self.trainer.ranks is not None:
                self.trainer.ranks.close()
            if self.fetcher.server is not None:
                self.fetcher.server.close()
            self.fetcher.close()


def _warm_up() -> None:
    """Pay torch's lazy imports now (the first optimizer pulls in torch._dynamo, about a
    second), not inside the first round's clock."""
    p = torch.zeros(1, requires_grad=True)
    torch.optim.AdamW([p]).step()


def run_worker(cfg: WorkerSettings, *, coordinator: str, home: Path) -> None:
    Worker(cfg, coordinator=coordinator, home=home).run()
