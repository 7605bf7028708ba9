"""The README and the guides under docs/ stay readable and whole: the README fits a few
screens and sends the reader to the guides; the guides speak of behaviour, not of the
project's history (no issue numbers); and every relative link, in the README and in every
file under docs/, names a file that exists (and, into a Markdown file, a heading that
exists)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250

# Files under docs/ that are not guides: the code's map, the generated SDK reference, and the
# design and style notes, which may cite the project's history.
NOT_GUIDES = {"ARCHITECTURE.md", "SDK.md", "DESIGN.md", "STYLE.md"}

ISSUE_REF = re.compile(r"\bissues?\s+\d+|(?<![\w&/])#\d+\b", re.IGNORECASE)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _guides() -> list[Path]:
    return [README, *(p for p in sorted(DOCS.glob("*.md")) if p.name not in NOT_GUIDES)]


def _all_docs() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(path: Path) -> str:
    """The file's text without its fenced code blocks (a shell comment is not a link)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*)$", _prose(path), re.MULTILINE)}


def test_the_readme_fits_in_250_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md is {n} lines; move detail into a guide under docs/"


@pytest.mark.parametrize("path", _guides(), ids=lambda p: p.name)
def test_no_issue_numbers_in_the_guides(path):
    hits = [
        f"{path.name}:{i}: {line.strip()}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_REF.search(line)
    ]
    assert not hits, "say what the behaviour is, not which issue brought it:\n" + "\n".join(hits)


@pytest.mark.parametrize("path", _all_docs(), ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    broken = []
    for m in LINK.finditer(_prose(path)):
        target = m[1] or m[2]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{path.name}:\n" + "\n".join(broken)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns refuse what they should and let the rest through."""
    assert ISSUE_REF.search("fixed in issue 17") and ISSUE_REF.search("see #33")
    assert not ISSUE_REF.search("`--rounds 10`, [1, 100000], &#39; 0x33")
    assert _slug("An owner's config is bounded") == "an-owners-config-is-bounded"
    assert _slug("Metrics (Prometheus)") == "metrics-prometheus"
    assert _slug("Putting `aitbc` on your PATH") == "putting-aitbc-on-your-path"
    text = "[a](x.md) ![b](y.png) [c](https://e.org)\n```\n[d](not-a-link.md)\n```\n"
    (tmp_path / "t.md").write_text(text)
    assert [m[1] or m[2] for m in LINK.finditer(_prose(tmp_path / "t.md"))] == ["x.md", "y.png", "https://e.org"]
