"""`aitbc simulate --report DIR` as a user runs it: a real process, a tiny simulation,
the report's PNGs and page read back; a folder it cannot write refuses before training."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PIL import Image

from aitbc.reports import PLOTS


def test_simulate_report_writes_plots_and_a_page_with_the_numbers(aitbc, tmp_path):
    out = tmp_path / "report"
    proc = aitbc(
        "simulate",
        "--workers", "4", "--rounds", "3", "--local-steps", "3",
        "--byzantine", "1", "--attack", "sign-flip", "--aggregator", "median",
        "--out", str(tmp_path / "run"), "--report", str(out), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert f"report: {out / 'report.html'}" in proc.stderr
    for name in PLOTS:
        png = out / f"{name}.png"
        assert png.stat().st_size > 5000
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] >= 400
    page = (out / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == len(PLOTS)
    assert f"{result['final_val_loss']:.4f}" in page
    assert result["final_model_cid"] in page
    (byz,) = result["byzantine_workers"]
    assert f"worker {byz} (byzantine)" in page
    rows = [json.loads(line) for line in Path(result["metrics_path"]).read_text().splitlines()]
    assert all(f"{r['val_loss']:.4f}" in page for r in rows)
    # the workers' training accuracy (the attacker's crafted update reports none): a fraction, in the table
    assert all(r["train_accuracy"] is not None and 0 <= r["train_accuracy"] <= 1 for r in rows)
    assert all(f'<td class="n">{r["train_accuracy"]:.4f}</td>' in page for r in rows)
    assert "does not score workers" in page  # the heatmap says what it shows


def test_simulate_report_into_a_file_refuses_before_training(aitbc, tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    proc = aitbc("simulate", "--rounds", "1", "--out", str(tmp_path / "run"), "--report", str(f))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("is a file, not a folder")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert f.read_text() == "mine"
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written
