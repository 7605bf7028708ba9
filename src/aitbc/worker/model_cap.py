"""The job's model, built only within this worker's capacity (``max_params`` of its offer):
a model whose parameters count more is refused before any tensor of it is allocated (a
built-in or Hugging Face model, counted from its config) or, for ``module:callable`` code
that cannot be counted without running it, once built and before it trains."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from aitbc.errors import UsageError
from aitbc.training.allow_code import AllowCode
from aitbc.training.data_spec import DataSpec
from aitbc.training.hf_models import Weights, is_hf
from aitbc.training.models import TooManyParams, build_model, check_params
from aitbc.worker.records import ModelRefused


class ModelTooLarge(ModelRefused):
    """A job's model with more parameters than this worker trains."""


def build_within(
    name: str,
    spec: DataSpec,
    options: Mapping[str, object],
    *,
    allow_code: AllowCode,
    max_params: int | None,
    weights: Weights | None = None,
) -> nn.Module:
    """``build_model`` for a job, or :class:`ModelRefused` (code this operator did not allow,
    options past the bounds, a model over ``max_params``; None: no limit)."""
    try:  # code this operator did not allow is never imported; a model too large never allocated
        model = build_model(name, spec, options, allow_code=allow_code, max_params=max_params, weights=weights)
        if is_code(name):  # counted only now: a callable's parameters are known once it has run
            check_params(name, sum(p.numel() for p in model.parameters()), max_params)
    except TooManyParams as e:  # the cap: this worker's --max-params, or what its device's memory holds
        raise ModelTooLarge(str(e)) from None
    except UsageError as e:
        raise ModelRefused(str(e)) from None
    return model


def is_code(name: str) -> bool:
    """Whether model ``name`` is a ``module:callable`` (not a built-in or Hugging Face one)."""
    return ":" in name and not is_hf(name)
