"""A new run's pretrained blobs (``init --from-pretrained``): the weights (``init_weights``)
and ``tokenizer`` its model options name must be on this coordinator and be what they say,
judged before the run is created, so an owner cannot hand every hired worker a blob that is
missing, someone else's unrelated upload, or larger than the model it claims to be.
Retention then keeps them for the run's life (:func:`aitbc.training.pretrained.blob_cids`)."""

from __future__ import annotations

from collections.abc import Mapping

from aitbc.coordinator.context import Context
from aitbc.coordinator.errors import unprocessable
from aitbc.errors import AitbcError
from aitbc.storage.cid import is_cid
from aitbc.training.hf_models import hf_config, is_hf


def check_pretrained(ctx: Context, model_type: str, options: Mapping[str, object]) -> None:
    """422 ``bad_model`` unless every blob the options name is held and fits the config:
    the weights a safetensors blob whose header's names and shapes are the model's (float,
    at most 4 bytes a value, nothing beyond them), the tokenizer a ``tokenizer.json`` of at
    most ``vocab_size`` tokens. Both are touched: retention keeps them until the run names them."""
    if not is_hf(model_type):
        return
    cfg = hf_config(model_type, options)  # checked already (check_model): the options are valid
    for field, cid in (("init_weights", cfg.init_weights), ("tokenizer", cfg.tokenizer)):
        if cid is None:
            continue
        if not is_cid(cid) or not ctx.store.touch(cid):
            raise unprocessable(
                "bad_model", f"model option {field} names blob {cid}, which is not on this coordinator; upload it first"
            )
    try:
        if cfg.init_weights is not None:
            from aitbc.training.pretrained import check_lora_targets, check_weights_file

            check_weights_file(ctx.store.dir / cfg.init_weights, model_type, options)
            check_lora_targets(model_type, options)
        if cfg.tokenizer is not None:
            _check_tokenizer(ctx, cfg.tokenizer, cfg.vocab_size)
    except AitbcError as e:
        raise unprocessable("bad_model", str(e)) from None


def _check_tokenizer(ctx: Context, cid: str, vocab_size: int | None) -> None:
    from aitbc.training.tokenizer import MAX_TOKENIZER_BYTES, parse_tokenizer

    size = ctx.store.size(cid)
    if size > MAX_TOKENIZER_BYTES:
        raise unprocessable("bad_model", f"tokenizer blob {cid} is {size:,} bytes; at most {MAX_TOKENIZER_BYTES:,}")
    tok = parse_tokenizer(ctx.store.get_bytes(cid), f"tokenizer blob {cid}")
    n = max([*tok.get_vocab(with_added_tokens=True).values(), -1]) + 1  # ids need not be dense
    if vocab_size is not None and n > vocab_size:
        raise unprocessable(
            "bad_model", f"tokenizer blob {cid} has {n} tokens, more than the model's vocab_size {vocab_size}"
        )
