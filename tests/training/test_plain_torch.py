"""The owner's guide's plain-PyTorch load path for built-in models, run as written: the
code blocks of its section are taken from docs/owner.md and run in a fresh interpreter in
which importing aitbc fails, beside a checkpoint of ours; what they build must give our
model's outputs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aitbc.training.checkpoint import checkpoint_bytes
from aitbc.training.data_spec import DataSpec
from aitbc.training.models import build_model

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "owner.md"
SECTION = "### A built-in model in plain PyTorch"
NO_AITBC = r"""
import importlib.abc, sys
class NoAitbc(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("aitbc", "aitbc_agent_sdk"):
            raise ImportError("the snippet must run without aitbc: " + name)
sys.meta_path.insert(0, NoAitbc())
"""


def _snippets() -> list[str]:
    text = GUIDE.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ")]
    return re.findall(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE)


def _run(code: str, cwd: Path) -> str:
    p = subprocess.run(
        [sys.executable, "-c", NO_AITBC + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_the_guide_has_the_two_snippets():
    blocks = _snippets()
    assert len(blocks) == 2 and "class Transformer" in blocks[0] and "nn.Sequential" in blocks[1]


def test_the_transformer_snippet_rebuilds_the_model_and_writes_its_text(tmp_path):
    opts = {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 16}
    torch.manual_seed(0)
    model = build_model("transformer", DataSpec("language", (16,), 256), opts)
    for p in model.parameters():  # weights far from their start, so a wrong rebuild shows
        p.data.add_(torch.randn_like(p) * 0.5)
    (tmp_path / "model.safetensors").write_bytes(
        checkpoint_bytes(model, model_name="transformer", model_options=opts, round=4)
    )
    probe = torch.tensor([list(b"hello, world")])
    check = f"\nimport json\nprint(json.dumps(model(torch.tensor({probe.tolist()}))[0, -1, :8].tolist()))\n"
    lines = _run(_snippets()[0] + check, tmp_path).splitlines()
    model.eval()
    seq = torch.tensor([list(b"def main(")])  # the snippet's greedy loop, with our model
    with torch.no_grad():
        for _ in range(20):
            seq = torch.cat([seq, model(seq[:, -16:])[0, -1].argmax().view(1, 1)], dim=1)
        ours = model(probe)[0, -1, :8].tolist()
    assert json.loads(lines[-1]) == pytest.approx(ours, abs=1e-5)
    assert "\n".join(lines[:-1]) == bytes(seq[0].tolist()).decode("utf-8", errors="replace")


def test_the_mlp_snippet_rebuilds_the_model(tmp_path):
    opts = {"hidden": [24, 12]}
    torch.manual_seed(0)
    model = build_model("mlp", DataSpec("classification", (1, 8, 8), 10), opts).eval()
    (tmp_path / "model.safetensors").write_bytes(checkpoint_bytes(model, model_name="mlp", model_options=opts, round=1))
    x = torch.rand(3, 1, 8, 8)
    check = f"\nimport json\nprint(json.dumps(model(torch.tensor({x.tolist()}).flatten(1).float()).tolist()))\n"
    got = json.loads(_run(_snippets()[1] + check, tmp_path).splitlines()[-1])
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(got), model(x), atol=1e-5, rtol=0)
