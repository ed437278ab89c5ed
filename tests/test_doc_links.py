"""The README and docs/ have no dangling links: every relative link names a
file that exists and every #anchor a heading of its target (issue 31: a
README "Tuning" section that did not exist)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]*)\)")


def _anchors(md: Path) -> set:
    """GitHub's anchors for a Markdown file's headings."""
    out = set()
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def test_no_dangling_links():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = []
    for md in files:
        for target in LINK.findall(md.read_text(encoding="utf-8")):
            if not target or target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "dangling links:\n" + "\n".join(bad)
