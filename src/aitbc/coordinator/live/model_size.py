"""A run's model size in parameters, counted from its config without building it: checked
against this coordinator's limit (``Settings.max_params``) when its data is attached (at
init ``check_model`` checks the lower bound the options give), and against the offers'
``max_params`` when workers are hired."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

from aitbc.coordinator.errors import unprocessable
from aitbc.coordinator.live.runtime import data_spec
from aitbc.coordinator.store.models import Run
from aitbc.errors import AitbcError
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import check_params, count_params, model_config


def model_params(model_type: str, options: Mapping[str, object], spec: DataSpec | None) -> int | None:
    """Parameters of the model (``spec`` None: a lower bound, before the data is known); None
    for ``module:callable`` code, which cannot be counted without importing it. The options
    must have passed ``check_model``."""
    return _counted(model_type, json.dumps(options, sort_keys=True, default=str), spec)


@functools.lru_cache(maxsize=256)
def _counted(model_type: str, options_json: str, spec: DataSpec | None) -> int | None:
    cfg = model_config(model_type, json.loads(options_json), max_params=None)  # counted, not capped
    return None if cfg is None else int(count_params(model_type, cfg, spec))


def run_params(run: Run) -> int | None:
    """Parameters of ``run``'s model: exact once its data is attached, a lower bound before."""
    spec = data_spec(run.manifest) if run.manifest is not None else None
    return model_params(run.model_type, run.model_options, spec)


def require_within_limit(model_type: str, options: Mapping[str, object], spec: DataSpec, limit: int) -> None:
    """A 422 ``bad_model`` naming the count and the limit where the model, counted exactly
    for data of ``spec``, has more than ``limit`` parameters (or where the data's spec does
    not fit the model). Raised before any write."""
    try:
        params = model_params(model_type, options, spec)
        if params is not None:
            check_params(model_type, params, limit)
    except AitbcError as e:
        raise unprocessable("bad_model", str(e)) from None
