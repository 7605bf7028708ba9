"""A fine-tune's pretrained model on the coordinator, for
:meth:`initialize_distributed_training` with ``from_pretrained=DIR``: the local Hugging Face
model directory is read and checked here (:func:`aitbc.training.pretrained.read_pretrained`:
safetensors only, never a pickle), its weights stored as one blob and its ``tokenizer.json``
as another, and the run's model type and options made from its config and the two CIDs
(with the LoRA adapter, if any). The coordinator checks the blobs again and keeps them for
the run's life."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aitbc_agent_sdk.errors import InvalidArgument
from aitbc_agent_sdk.protocol import AgentState, Offload, Op


@dataclass(frozen=True, slots=True)
class PretrainedModel:
    """What the run is created with: ``model_type`` (``hf:llama``, ...) and ``model_options``."""

    model_type: str
    model_options: dict[str, Any]


def lora_options(lora: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``lora`` (``"r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj"`` or that as a dict)
    as the model option, checked; an ``InvalidArgument`` (``bad_lora``) names what is wrong."""
    if lora is None:
        return None
    from aitbc.errors import UsageError
    from aitbc.training.hf_models import parse_lora

    try:
        if isinstance(lora, str):
            return parse_lora(lora)
        if isinstance(lora, Mapping):
            text = ",".join(
                f"{k}={'+'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in lora.items()
            )
            return parse_lora(text)
    except UsageError as e:
        raise InvalidArgument("bad_lora", str(e)) from None
    raise InvalidArgument(
        "bad_lora", f"lora must be 'r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj' or that as a dict, got {lora!r}"
    )


def upload_pretrained(
    self: AgentState,
    path: str | Path,
    model_type: str | None,
    model_options: Mapping[str, Any] | None,
    lora: str | Mapping[str, Any] | None,
) -> Op[PretrainedModel]:
    """Read the model directory ``path``, store its weights and tokenizer and return the
    run's model (``model_type``, if given, must be the config's family; ``model_options``
    the caller gave override the config's, e.g. ``context``)."""
    from aitbc.storage.cid import cid_of_bytes
    from aitbc.training.pretrained import check_lora_targets, read_pretrained, run_options
    from aitbc_agent_sdk import ipfs

    adapter = lora_options(lora)
    p = yield Offload(read_pretrained, (Path(path),))
    if model_type is not None and model_type != p.model_type:
        raise InvalidArgument(
            "bad_model", f"model_type {model_type!r}: the model in {path} is {p.model_type} (leave model_type out)"
        )
    own = dict(model_options or {})
    for key in ("init_weights", "tokenizer", "lora"):
        if key in own:
            raise InvalidArgument("bad_model", f"model option {key!r} is set by from_pretrained (and lora=), not given")
    weights_cid = yield Offload(cid_of_bytes, (p.weights,))
    tokenizer_cid = yield Offload(cid_of_bytes, (p.tokenizer,))
    options = {**run_options(p, weights_cid, tokenizer_cid, adapter), **own}
    # a LoRA target the model lacks, an option that breaks the config: refused before anything is uploaded
    yield Offload(check_lora_targets, (p.model_type, options))
    for blob in (p.weights, p.tokenizer):
        yield from ipfs.store_data(self, blob, False)
    return PretrainedModel(p.model_type, options)
