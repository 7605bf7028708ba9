"""How rounds are organised: ``sync``, ``async`` and ``gossip``.

Each mode is one loop over a prepared :class:`~aitbc.sim.cluster.Cluster`, using its
``work`` (workers train and send), ``receive`` (decode and check), ``apply`` (aggregate
and outer step) and ``record`` (evaluate, metrics row). Virtual time only moves here.

- ``sync``: every worker starts from the same global model; the round waits for all of
  them, or, with ``--deadline D``, for at most ``D`` seconds -- workers past it are
  dropped from that round -- but always for at least ``--quorum`` updates.
- ``async`` (buffered, as FedBuff, Nguyen et al. 2022): workers run back to back; each
  update is checked on arrival, dropped if more than ``--max-staleness`` aggregations
  old, else scaled by the staleness rule and buffered; every ``--buffer`` updates are
  aggregated with the run's (robust) rule. A round is one aggregation.
- ``gossip``: no global model. Each worker trains from its own model, then replaces it
  by the aggregate (the run's rule, applied locally) of its own and its neighbours'
  models on a ``ring`` or ``random:K`` topology. The reported model is the average of the
  honest workers' models; ``spread`` is their mean L2 distance to it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

import torch
from torch import Tensor

from aitbc.core.compression import decode as decode_update
from aitbc.core.gossip import mix_weight, neighbours, robust_combine
from aitbc.core.staleness import async_weight
from aitbc.core.staleness import buffer_size as buffer_size_of
from aitbc.errors import IntegrityError
from aitbc.json_value import JSONObject
from aitbc.sim.cluster import Cluster
from aitbc.storage.cid import cid_of_bytes


def run_sync(sim: Cluster) -> None:
    cfg, ids = sim.cfg, sim.present
    for r in range(1, cfg.rounds + 1):
        down = len(sim.checkpoint(sim.params, r - 1))  # every worker downloads the global model blob
        sent = sim.work(ids, dict.fromkeys(ids, sim.params), down)
        order = sorted(sent, key=lambda s: (s.seconds, s.worker))
        on_time = [s for s in order if cfg.deadline is None or s.seconds <= cfg.deadline]
        if len(on_time) < cfg.quorum:
            on_time = order[: cfg.quorum]  # wait past the deadline for the quorum
        sim.dropped += len(order) - len(on_time)
        if cfg.deadline is not None and len(on_time) < len(order):
            round_seconds = max(cfg.deadline, on_time[-1].seconds)
        else:
            round_seconds = on_time[-1].seconds  # everyone waits for the slowest
        updates, weights = [], []
        for s in on_time:
            u = sim.receive(s.blob)
            if u is not None:
                updates.append(u)
                weights.append(float(sim.samples[s.worker]))
        sim.apply(updates, weights)
        sim.clock += round_seconds
        sim.round = r
        if sim.record(
            train_losses=[s.loss for s in on_time if s.loss is not None],
            train_accuracies=[s.accuracy for s in on_time if s.accuracy is not None],
            accepted=len(updates),
        ):
            return


def run_async(sim: Cluster) -> None:
    cfg = sim.cfg
    n = len(sim.present)
    buffer_size = buffer_size_of(cfg.buffer, n)
    version = 0  # aggregations so far
    # (arrival, worker, version, blob, loss, training accuracy)
    events: list[tuple[float, int, int, bytes, float | None, float | None]] = []
    recent_honest: deque[Tensor] = deque(maxlen=n)  # what colluding attackers have seen lately

    def start(i: int, now: float) -> None:
        down = len(sim.checkpoint(sim.params, version))
        (s,) = sim.work([i], {i: sim.params}, down, colluding=list(recent_honest))
        if i not in sim.byzantine:
            recent_honest.append(decode_update(s.blob))  # attackers read honest updates off the wire
        heapq.heappush(events, (now + s.seconds, i, version, s.blob, s.loss, s.accuracy))

    for i in sim.present:
        start(i, 0.0)
    buffer: list[Tensor] = []
    weights: list[float] = []
    losses: list[float] = []
    accuracies: list[float] = []
    while version < cfg.rounds:
        now, i, v, blob, loss, accuracy = heapq.heappop(events)
        sim.clock = now
        weight = async_weight(sim.staleness_weight, version - v, cfg.max_staleness)  # as the live coordinator
        if weight is None:
            sim.dropped += 1
        else:
            u = sim.receive(blob)
            if u is not None:
                buffer.append(weight * u)
                weights.append(float(sim.samples[i]))
                if loss is not None:
                    losses.append(loss)
                if accuracy is not None:
                    accuracies.append(accuracy)
        if len(buffer) >= buffer_size:
            sim.apply(buffer, weights)
            version += 1
            sim.round = version
            if sim.record(train_losses=losses, train_accuracies=accuracies, accepted=len(buffer)):
                return
            buffer, weights, losses, accuracies = [], [], [], []
        start(i, now)


def run_gossip(sim: Cluster) -> None:
    cfg = sim.cfg
    present = sim.present  # position k is worker present[k] (all of them unless --attack absent)
    n = len(present)
    peers_of = neighbours(cfg.topology, n, sim.mode_gen)  # the live workers' own draw (core/gossip), by position
    models = {i: sim.params.clone() for i in present}  # (d,) each worker's own model
    honest = [k for k, i in enumerate(present) if i not in sim.byzantine]
    samples = [float(sim.samples[i]) for i in present]
    for r in range(1, cfg.rounds + 1):
        # Workers train from their own models on the round's own batch order (as a live
        # worker: aitbc.worker.gossip); only models travel (encoded), not updates.
        sent = sim.work(present, models, 0, count_bytes=False, data_round=r)
        local = [models[s.worker] - s.update for s in sent]  # start minus (possibly crafted) update
        messages = [sim.plain_codec.encode(m) for m in local]
        peers = peers_of()
        seconds = [0.0] * n
        accepted = 0
        new_models = dict(models)
        for k in honest:
            own = sim.receive(messages[k])  # what its neighbours get (a lossy codec: the same rounding)
            received, weights = [own if own is not None else local[k]], [samples[k]]
            for j in peers[k]:
                m = sim.receive(messages[j])
                sim.updates_sent += 1
                sim.bytes_up += len(messages[j])
                sim.bytes_down += len(messages[j])
                seconds[k] += sim.profiles[present[k]].transfer_seconds(len(messages[j]))
                weight = mix_weight(samples[j], 0, sim.staleness_weight, cfg.max_staleness)  # as live
                if m is not None and weight is not None:  # (live: its newest may be rounds old)
                    received.append(m)
                    weights.append(weight)
            accepted += len(received) - 1
            mixed = sim.aggregate(received, weights, round_index=r)  # (k+1, d) -> (d,), as a live worker's mix
            new_models[present[k]] = mixed if mixed is not None else received[0]
        for k, s in enumerate(sent):
            seconds[k] += s.seconds
        models = new_models
        stack = torch.stack([models[present[k]] for k in honest])  # (h, d)
        sim.params = stack.mean(dim=0)  # the reported model: honest workers' average
        sim.spread = float((stack - sim.params).norm(dim=1).mean())
        sim.clock += max(seconds)
        sim.round = r
        extra: JSONObject = {
            "spread": sim.spread,
            # each worker's published model's CID: what a live worker on that shard signs
            "published": [cid_of_bytes(m) for m in messages],
            "consensus_val_loss": _consensus_loss(sim, messages, samples, r),
        }
        if sim.record(
            train_losses=[s.loss for s in sent if s.loss is not None],
            train_accuracies=[s.accuracy for s in sent if s.accuracy is not None],
            accepted=accepted,
            extra=extra,
        ):
            return


def _consensus_loss(sim: Cluster, messages: list[bytes], samples: list[float], r: int) -> float | None:
    """The validation loss of what a live coordinator records as round ``r``'s model (its
    consensus: :func:`aitbc.core.gossip.robust_combine` over every published model, as
    :func:`aitbc.coordinator.rounds.gossip_close.close_round`); None on a round that is not evaluated.
    ``samples``: each message's sender's sample count."""
    if r % sim.cfg.eval_every and r != sim.cfg.rounds:
        return None
    models, weights = [], []
    for i, blob in enumerate(messages):
        try:
            m = decode_update(blob, max_numel=sim.d)
        except IntegrityError:
            continue
        if m.shape == (sim.d,) and torch.isfinite(m).all():
            models.append(m.to(torch.float32))
            weights.append(samples[i])
    if not models:
        return None
    out = robust_combine(
        models,
        weights,
        aggregator=sim.aggregator,
        norm_bound=sim.norm_bound,
        round_index=r,
    ).result
    return None if out is None else sim.evaluate(out)[0]


MODE_LOOPS: dict[str, Callable[[Cluster], None]] = {"sync": run_sync, "async": run_async, "gossip": run_gossip}
