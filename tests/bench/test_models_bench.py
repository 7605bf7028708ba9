"""bench/models.py cannot rot: its sizes are what it says (the Llama and the transformer of
about the same parameters), its LoRA base is a folder ``init --from-pretrained`` reads, the
Llama's simulator task (``communication.py --tasks llama``, which took its SparseLoCo part
over) builds, and bad flags are refused. The live
runs themselves are minutes: ``python bench/models.py --size small`` runs them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def models_bench():
    sys.path.insert(0, str(BENCH))  # its siblings (_common, communication) import by name
    try:
        spec = importlib.util.spec_from_file_location("bench_models", BENCH / "models.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up by name
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_models", None)
        sys.path.remove(str(BENCH))


def test_the_two_models_are_of_one_size(models_bench):
    from aitbc.training.data_spec import DataSpec
    from aitbc.training.models import count_params, model_config

    size = models_bench.SIZES["25m"]
    llama = count_params(
        "hf:llama", model_config("hf:llama", size.llama), DataSpec("language", (128,), size.vocab_size)
    )
    transformer = count_params(
        "transformer", model_config("transformer", size.transformer), DataSpec("language", (128,), 256)
    )
    assert 24e6 <= llama <= 27e6 and 24e6 <= transformer <= 27e6, (llama, transformer)
    assert abs(llama - transformer) / transformer < 0.05


def test_the_lora_base_is_a_folder_from_pretrained_reads(models_bench, tmp_path):
    from aitbc.training.checkpoint import checkpoint_bytes
    from aitbc.training.data_spec import DataSpec
    from aitbc.training.models import build_model
    from aitbc.training.pretrained import read_pretrained
    from aitbc.training.tokenizer import train_tokenizer

    size = models_bench.SIZES["small"]
    tok = train_tokenizer([f"def f{i}(x):\n    return x + {i}\n" for i in range(200)], 300)
    torch.manual_seed(0)
    model = build_model("hf:llama", DataSpec("language", (32,), tok.vocab_size), size.llama)
    run = tmp_path / "run"
    (run / "fetched" / "blobs").mkdir(parents=True)
    (run / "fetched" / "blobs" / "cid").write_bytes(
        checkpoint_bytes(model, model_name="hf:llama", model_options=size.llama, round=2)
    )
    (run / "tokenizer.json").write_bytes(tok.data)

    folder = models_bench.pretrained_dir(run, size, tok.vocab_size, tmp_path / "hf")
    got = read_pretrained(folder)
    assert got.model_type == "hf:llama"
    assert got.tokenizer == tok.data
    assert got.params == sum(p.numel() for p in model.parameters())  # the run's model, every weight
    assert {k: got.options[k] for k in ("hidden_size", "num_hidden_layers")} == {
        "hidden_size": 64,
        "num_hidden_layers": 2,
    }


def test_the_simulator_task_builds(models_bench):
    import communication
    from aitbc.sim.config import SimConfig

    shared, steps = communication.TASKS["llama"]
    SimConfig(**shared, rounds=1)  # every option checked on construction
    assert shared["model"] == "hf:llama" and steps == communication.TASKS["transformer"][1]
    labels = {c["label"] for c in communication.configs("llama", False)}
    assert {"diloco H=50, none", "sparseloco H=50, 2%, 2-bit"} <= labels  # the equal-rounds pair


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--parts", "lora"], "add live"),
        (["--parts", "live,gossip"], "--parts takes live and lora"),
        (["--size", "7b"], "invalid choice"),
        (["--parts", "live,sparseloco"], "communication.py --tasks llama"),
    ],
)
def test_bad_flags_are_refused(models_bench, argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        models_bench.main(argv)
    assert e.value.code == 2 and said in capsys.readouterr().err
