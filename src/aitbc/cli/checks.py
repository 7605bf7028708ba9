"""Option values checked on this machine before any request, each refusal naming its flag.

docs/owner.md promises exit 2 for every usage error. The coordinator refuses a bad name or
value too (a 422), but it only knows its request's fields (``rounds``, ``local_steps``),
not the flags a user typed. So the commands check here, with the same registries the
coordinator builds from (one rule, two callers), before anything is sent; and
:func:`naming_flags` turns the coordinator's own 422 fields back into flags for what
only it can check (ranges, a rule's condition on the hired workers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from aitbc.errors import AitbcError, UsageError

T = TypeVar("T")


class OptionError(UsageError):
    """A bad option value; ``code`` as the API would name it (``bad_config``, ...)."""

    def __init__(self, message: str, code: str = "usage") -> None:
        super().__init__(message)
        self.code = code


def flag(field: str) -> str:
    """``local_steps`` -> ``--local-steps``."""
    return "--" + field.replace("_", "-")


def _checked(option: str, check: Callable[[], T]) -> T:
    """``check()``'s result, or its refusal as one line that starts with ``option``."""
    try:
        return check()
    except AitbcError as e:
        raise OptionError(_naming(option, _text(e)), getattr(e, "code", "usage")) from None
    except (ValueError, TypeError) as e:  # a config class's __post_init__
        raise OptionError(_naming(option, str(e))) from None


def _naming(option: str, message: str) -> str:
    return message if message.startswith(option) else f"{option}: {message}"


def _text(e: AitbcError) -> str:
    return str(getattr(e, "detail", None) or e)


def amount(value: str, *, option: str = "amount") -> int:
    """AIT more than 0, as micro-AIT."""
    from aitbc.units import parse_amount

    return _checked(option, lambda: parse_amount(value, field=option))


def price(value: str, *, option: str) -> int:
    """AIT from 0, as micro-AIT."""
    from aitbc.units import parse_price

    return _checked(option, lambda: parse_price(value, field=option))


def size(value: str, *, option: str = "--dataset-size") -> int:
    from aitbc.units import parse_size

    return _checked(option, lambda: parse_size(value))


def gpu_class(value: str, *, option: str = "--min-gpu") -> str:
    from aitbc.market.gpus import check_gpu_class

    return _checked(option, lambda: check_gpu_class(value))


def model(name: str, options: Mapping[str, object], *, option: str = "--model-type") -> None:
    """A built-in model and its options, within their bounds. A ``module:callable`` is
    for the coordinator's operator to allow (``--allow-code``): only its shape is checked;
    its parameter count for the coordinator's (``--max-params``: a 422 naming both)."""
    from aitbc.training.models import check_model

    def check() -> object:
        return check_model(name, options, allow_code=True, max_params=None)

    _checked(option if not options else f"{option} / --model-opt", check)


_UNUPLOADED = "bafkreinotuploadedyet"  # a CID-shaped stand-in for weights checked before their upload


def pretrained(path: Path, model_type: str | None, lora: str | None) -> None:
    """A fine-tune's model directory, checked before anything is sent or the wallet made: its
    config.json on the allow-list (``model_type``, if given, its family), safetensors weights
    (never a pickle), ``--lora`` well formed and its targets modules of the model. The
    weights themselves are read as they are uploaded."""
    from aitbc.training.hf_models import options_from_hf_config, parse_lora
    from aitbc.training.pretrained import check_lora_targets, read_config, weight_files

    where = f"--from-pretrained {path}"
    if lora is not None:
        _checked("--lora", lambda: parse_lora(lora))

    def check() -> None:
        if not path.is_dir():
            raise UsageError(f"{where}: not a directory (a Hugging Face model directory: config.json, *.safetensors)")
        name, options = options_from_hf_config(read_config(path, where))
        if model_type is not None and model_type != name:
            raise UsageError(f"--model-type {model_type}: the model in {path} is {name} (leave --model-type out)")
        weight_files(path, where)
        if lora is not None:  # on the meta device; the blob's CID is not known until upload
            check_lora_targets(name, options | {"lora": parse_lora(lora), "init_weights": _UNUPLOADED})

    _checked(where, check)


def dataset(data_path: str, *, option: str = "--data-path") -> str:
    """A dataset name (``digits``, ``stdlib``, ``text:PATH``, ``npz:PATH``) or an existing
    file or folder; returns the dataset spec."""
    from aitbc.training.datasets import DATASETS
    from aitbc.training.packaging import resolve_source

    def check() -> str:
        spec = resolve_source(data_path)
        DATASETS.get(spec.partition(":")[0])
        return spec

    try:
        return check()
    except AitbcError as e:  # "no such file or folder, and not a dataset name": a bad value
        msg = _text(e).removeprefix("--data-path")  # resolve_source names upload-data's flag
        raise OptionError(_naming(option, option + msg if msg != _text(e) else msg)) from None


def dataset_name(spec: str, *, option: str = "--dataset") -> None:
    """A dataset spec (``digits``, ``text:PATH``, ...): its name must be registered."""
    from aitbc.training.datasets import DATASETS

    _checked(option, lambda: DATASETS.get(spec.partition(":")[0]))


def aggregator(spec: str, *, option: str = "--aggregator") -> None:
    """Names and options of every stage; a rule's condition on the number of workers is
    the coordinator's to check once it knows them."""
    from aitbc.core.aggregation import parse_aggregator

    _checked(option, lambda: parse_aggregator(spec, default_f=0))


def topology(spec: str, *, option: str = "--topology") -> None:
    """The form (ring, random:K with K >= 1); K against the workers is the coordinator's check."""
    from aitbc.core.gossip import check_topology

    kind, _, arg = spec.partition(":")
    if kind == "random" and arg.isdigit() and int(arg) < 1:
        raise OptionError(f"{option}: random:K needs K >= 1 neighbours, got {spec!r}")
    n = int(arg) + 1 if kind == "random" and arg.isdigit() else 2
    _checked(option, lambda: check_topology(spec, n))


def codec(spec: str, *, option: str = "--compression") -> None:
    from aitbc.core.compression import build_codec
    from aitbc.core.options import parse_spec

    def check() -> None:  # the coordinator's own builder: error_feedback[_decay] options included
        build_codec(*parse_spec(spec, what="codec"))

    _checked(option, check)


def outer_options(lr: float | None, momentum: float | None) -> dict[str, float]:
    """The outer optimizer's options that ``--outer-lr`` and ``--outer-momentum`` set (an unset
    flag leaves the optimizer's own default)."""
    return {k: v for k, v in (("lr", lr), ("momentum", momentum)) if v is not None}


def outer(name: str, options: Mapping[str, object] | None = None, *, option: str = "--outer") -> None:
    from aitbc.core.outer import build_outer

    _checked(option, lambda: build_outer(name, options))


def at_least(value: int | float | None, low: int | float, option: str) -> None:
    if value is not None and not value >= low:
        raise OptionError(f"{option} must be at least {low}; got {value}")


def more_than(value: float | None, low: float, option: str) -> None:
    if value is not None and not value > low:
        raise OptionError(f"{option} must be more than {low:g}; got {value:g}")


# --- the coordinator's 422s, in flags ------------------------------------------------------

_PYDANTIC = re.compile(r"^(\w+): (?:Value error, )?")


def flagged(detail: str, fields: tuple[str, ...], renamed: dict[str, str] | None = None) -> str:
    """A 422's detail with the request's field names as the flags that set them:
    ``rounds: Value error, rounds must be in [1, 100000], got 0`` ->
    ``--rounds must be in [1, 100000], got 0``."""
    m = _PYDANTIC.match(detail)
    if m and m.group(1) in fields:
        rest = detail[m.end() :]
        detail = rest if rest.startswith(m.group(1)) else f"{m.group(1)}: {rest}"
    if not fields:
        return detail
    names = "|".join(sorted(map(re.escape, fields), key=len, reverse=True))
    # A field as the subject of a refusal: "rounds must", "min_workers (3)", "aggregator 'x'",
    # "quorum:"; not the same word in a sentence ("3 rounds").
    pattern = re.compile(rf"(?<![\w-])({names})(?=( must| is| \(| '|:|$))")
    flags = renamed or {}
    return pattern.sub(lambda mm: flags.get(mm.group(1)) or flag(mm.group(1)), detail)


@contextmanager
def naming_flags(*fields: str, **renamed: str) -> Iterator[None]:
    """A coordinator's 422 for this command's options as a usage error (exit 2) naming
    the flags (``fields``: the request's fields, each set by the flag :func:`flag` names;
    ``renamed``: a field whose flag is another, ``model_options="--model-opt"``)."""
    from aitbc_agent_sdk.errors import AgentError

    try:
        yield
    except AgentError as e:
        if e.status != 422:
            raise
        raise OptionError(flagged(e.detail, (*fields, *renamed), renamed), e.code) from None
