"""A worker builds a fine-tune's model on the base its fetcher brings by CID: weights that
fit load (a LoRA model then trains its adapter alone); weights that do not (another model's,
or not safetensors: a coordinator or peer cannot be trusted to hand the right bytes) refuse
the job with one line instead of crashing the daemon."""

from __future__ import annotations

import pytest
from tests.pretrained import tiny_pretrained_dir

from aitbc.storage.cid import cid_of_bytes
from aitbc.training.data_spec import DataSpec
from aitbc.training.pretrained import read_pretrained, run_options
from aitbc.worker.model_cap import build_within
from aitbc.worker.records import ModelRefused

LORA = {"r": 2, "alpha": 4, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}


def test_the_job_model_loads_the_fetched_base_or_is_refused(tmp_path):
    p = read_pretrained(tiny_pretrained_dir(tmp_path))
    opts = run_options(p, cid_of_bytes(p.weights), cid_of_bytes(p.tokenizer), LORA) | {"context": 16}
    spec = DataSpec("language", (16,), p.options["vocab_size"])
    fetched = []

    def fetch(blob: bytes):
        def get(cid: str):
            fetched.append(cid)
            path = tmp_path / f"blob-{len(fetched)}"
            path.write_bytes(blob)
            return path

        return get

    model = build_within(p.model_type, spec, opts, allow_code=(), max_params=None, weights=fetch(p.weights))
    assert fetched == [opts["init_weights"]]
    assert sum(t.numel() for t in model.parameters()) == 2 * 2 * (2 * 32 + 32 * 2)
    other = read_pretrained(tiny_pretrained_dir(tmp_path, layers=1, name="other")).weights
    for bad, words in ((other, "do not fit the config"), (b"not safetensors", "not a safetensors file")):
        with pytest.raises(ModelRefused, match=words) as e:
            build_within(p.model_type, spec, opts, allow_code=(), max_params=None, weights=fetch(bad))
        assert "\n" not in str(e.value)
