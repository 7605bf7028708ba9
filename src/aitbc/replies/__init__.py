"""Every reply of the coordinator's API, defined once: the coordinator's views build these
models and its routes send them, and the worker, the SDK and the CLI read the same models
back (``Model.model_validate(response.json())``).

Below the coordinator and its clients: a module here imports only pydantic, the standard
library and :mod:`aitbc.states`. Models forbid extra keys (:class:`~aitbc.replies.base.Reply`).
Lists are ``{data, count}`` (:class:`~aitbc.replies.base.Page`).

Money is shown as AIT text (``"1.5"``) and, where clients compute with it, as integer
micro-AIT in a ``*_micro`` field; prices (AIT per round) are numbers (``1.5``) with the
exact ``price_micro`` beside them. Times are unix seconds.

By domain, in dependency order: ``base`` (Reply, Page, ErrorBody, Ok), ``health``, ``blobs``
(stored blobs, pins, peer holders), ``gossip`` (the gossip roster and model records),
``jobs`` (a job, its orders, updates and spot checks), ``workers`` (offers, heartbeats),
``runs`` (a run's summary and detail, discovery), ``results`` (rounds, scores, results),
``money`` (payments, wallets, the ledger) and ``dashboard`` (the dashboard's allow-list).
"""
