"""BENCHMARKS.md is where we stand: each bench's latest figures, with machine, date, commit and command.

Checked here: the file stays short (history lives in git), every bench entry point under bench/ has a
section, every repository path the file cites exists, and every bench section says which machine,
date and commit its figures come from.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "BENCHMARKS.md"
MAX_LINES = 300
# A path into the repository's bench/, scripts/, tests/ or docs/ folders, as the file cites one.
CITED = re.compile(r"(?<![\w./-])((?:bench|scripts|tests|docs)/[\w./-]*\w)")
PROVENANCE = re.compile(r"^Machine: .+; date: \d{4}-\d{2}-\d{2}; commit: [0-9a-f]{7,40}\b")


def sections() -> dict[str, str]:
    """``## `` heading -> that section's text (heading included), in file order."""
    out: dict[str, str] = {}
    heading = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            heading = line
            out[heading] = ""
        if heading is not None:
            out[heading] += line + "\n"
    return out


def bench_entry_points() -> list[str]:
    """bench/ scripts one runs: shell scripts, and Python files with a ``__main__`` block (not helpers)."""
    scripts = sorted((ROOT / "bench").glob("*.sh"))
    scripts += [p for p in sorted((ROOT / "bench").glob("*.py")) if "__name__ == \"__main__\"" in p.read_text()]
    return [p.relative_to(ROOT).as_posix() for p in scripts]


def test_at_most_300_lines():
    lines = DOC.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"BENCHMARKS.md has {len(lines)} lines: keep only the latest figures"


def test_every_bench_entry_point_has_a_section():
    entry_points = bench_entry_points()
    assert "bench/broker.py" in entry_points and "bench/gpu_check.sh" in entry_points
    texts = list(sections().values())
    missing = [path for path in entry_points if not any(path in text for text in texts)]
    assert not missing, f"bench scripts without a section in BENCHMARKS.md: {missing}"


def test_every_cited_path_exists():
    cited = sorted(set(CITED.findall(DOC.read_text())))
    assert cited, "the file cites no bench/ script"
    missing = [path for path in cited if not (ROOT / path).exists()]
    assert not missing, f"BENCHMARKS.md cites paths that are not in the repository: {missing}"


def test_every_bench_section_names_machine_date_and_commit():
    bench_sections = {h: text for h, text in sections().items() if "bench/" in h}
    assert len(bench_sections) >= len(bench_entry_points()) - 1  # gpu_check.sh and .py share one
    for heading, text in bench_sections.items():
        assert any(PROVENANCE.match(line) for line in text.splitlines()), (
            f"{heading!r}: no 'Machine: ...; date: YYYY-MM-DD; commit: <hash>' line")


def test_cited_commits_exist_in_history():
    """Each section's commit is one git knows (a short hash typo would send readers nowhere)."""
    import subprocess

    if not (ROOT / ".git").exists():
        return
    commits = set()
    for line in DOC.read_text().splitlines():
        if PROVENANCE.match(line):
            commits.update(re.findall(r"\b[0-9a-f]{7,40}\b", line.split("commit:", 1)[1]))
    assert commits
    for commit in sorted(commits):
        found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                               capture_output=True)
        assert found.returncode == 0, f"commit {commit} named in BENCHMARKS.md is not in the history"
