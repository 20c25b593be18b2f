"""Every local link of the docs leads somewhere: fast, no network, no site build.

``mkdocs build --strict`` (tests/test_docs.py, minutes) checks the links between the site's pages, but not
README.md or BENCHMARKS.md, which GitHub renders and whose links (``docs/evaluate/index.md#real-time-...``)
no build reads. This checks, for README.md, the repository's other top-level Markdown files and every page
of docs/:

- a relative link (``[text](path)``, ``![image](path)``, ``[label]: path``, ``href=``/``src=``) names a file
  or folder of the repository; a docs page only one inside docs/ (the site holds nothing else: link the
  file on GitHub, or write its path as code);
- its ``#anchor`` is a heading of the page it names (or an ``<a id>`` / ``{#id}`` there), slugged as the
  page's renderer slugs it: GitHub for the top-level files, mkdocs' toc extension for docs/.

External links (``http(s)://``, ``mailto:``) are not fetched. Links inside code (fenced blocks, inline
spans) are not links.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
HTML_ID = re.compile(r"""<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
ATTR_ID = re.compile(r"\s*\{[^}]*#([\w-]+)[^}]*\}\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and the other top-level Markdown files git tracks, then docs/**/*.md."""
    try:
        tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True,
                                 check=True).stdout.split()
        top = sorted(root / p for p in tracked if "/" not in p)
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        top = sorted(root.glob("*.md"))
    return [*top, *sorted((root / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text outside fenced code blocks, inline code spans blanked."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening[1]
            continue
        if fence is not None:
            if re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", line):
                fence = None
            continue
        out.append((number, CODE_SPAN.sub(lambda m: " " * len(m[0]), line)))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link in the text's prose."""
    found = []
    for number, line in prose_lines(text):
        targets = [m[1] for m in INLINE.finditer(line)] + [m[1] for m in HTML_ATTR.finditer(line)]
        definition = DEFINITION.match(line)
        if definition:
            targets.append(definition[1])
        found += [(number, t[1:-1] if t.startswith("<") and t.endswith(">") else t) for t in targets]
    return found


def heading_text(markdown: str) -> str:
    """A heading's text as rendered: links by their text, code and emphasis without their marks."""
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", markdown)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[`*]", "", text).strip()


def github_slug(text: str) -> str:
    """GitHub's heading anchor (github-slugger): lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc slugify, as mkdocs.yml's ``toc`` uses it (ASCII, runs of spaces and hyphens one hyphen)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(path: Path, github: bool) -> set[str]:
    """The ids a page's renderer gives it: each heading's slug (repeats numbered as the renderer numbers them),
    ``{#id}`` attributes, ``<a id=...>`` / ``<a name=...>``."""
    slug, sep = (github_slug, "-") if github else (mkdocs_slug, "_")
    found: set[str] = set()
    for _, line in prose_lines(path.read_text()):
        found.update(HTML_ID.findall(line))
        heading = HEADING.match(line)
        if not heading:
            continue
        text = heading[2]
        custom = ATTR_ID.search(text)
        if custom:
            found.add(custom[1])
            continue
        base = slug(heading_text(ATTR_ID.sub("", text)))
        candidate, n = base, 0
        while candidate in found:
            n += 1
            candidate = f"{base}{sep}{n}"
        found.add(candidate)
    return found


def broken_links(root: Path = ROOT) -> list[str]:
    """``page:line: target: why`` for every local link of the pages that leads nowhere."""
    problems, cache = [], {}
    docs = root / "docs"
    for page in pages(root):
        in_docs = docs in page.parents
        where = page.relative_to(root)
        for number, target in links(page.read_text()):
            if SCHEME.match(target) or target.startswith("//"):
                continue  # external: not fetched
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            if path_part.startswith("/"):
                problems.append(f"{where}:{number}: {target}: an absolute path; write it relative to the page")
                continue
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{where}:{number}: {target}: no such file")
                continue
            if root.resolve() not in [dest, *dest.parents]:
                problems.append(f"{where}:{number}: {target}: outside the repository")
                continue
            if in_docs and docs.resolve() not in [dest, *dest.parents]:
                problems.append(f"{where}:{number}: {target}: outside docs/, which the site does not hold; link it on "
                                "GitHub or write the path as code")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix != ".md":
                    problems.append(f"{where}:{number}: {target}: an anchor into a file that is not a page")
                    continue
                key = (dest, not in_docs)
                if key not in cache:
                    cache[key] = anchors(dest, github=not in_docs)
                if unquote(anchor) not in cache[key]:
                    problems.append(f"{where}:{number}: {target}: {dest.relative_to(root.resolve())} has no heading "
                                    f"#{anchor}")
    return problems


# ----------------------------------------------------------------------------- the repository's pages
def test_every_local_link_leads_somewhere():
    problems = broken_links()
    assert not problems, f"{len(problems)} broken link(s):\n" + "\n".join(problems)


def test_the_pages_are_read():
    """Nothing vacuous: README.md and the docs are found, with links of every kind the checks follow."""
    found = {p.relative_to(ROOT).as_posix(): links(p.read_text()) for p in pages()}
    assert "README.md" in found and "docs/index.md" in found and len(found) > 20
    targets = [t for page in found.values() for _, t in page]
    assert any("#" in t and not SCHEME.match(t) and t.split("#")[0] for t in targets)  # into another page
    assert any(t.startswith("#") for t in targets)  # within a page
    assert any(SCHEME.match(t) for t in targets)  # external, skipped


def test_slugs_are_the_renderers():
    """mkdocs' slugs are Python-Markdown's own (where it is installed), for every heading of docs/."""
    assert github_slug("Real time: the robot does not wait") == "real-time-the-robot-does-not-wait"
    assert github_slug("Serve: frames, `cameras` & keys") == "serve-frames-cameras--keys"
    assert mkdocs_slug("1. Collect, or bring, a dataset") == "1-collect-or-bring-a-dataset"
    assert mkdocs_slug("Serve: frames, cameras & keys") == "serve-frames-cameras-keys"
    toc = pytest.importorskip("markdown.extensions.toc")
    for page in (ROOT / "docs").rglob("*.md"):
        for _, line in prose_lines(page.read_text()):
            heading = HEADING.match(line)
            if heading and not ATTR_ID.search(heading[2]):
                text = heading_text(heading[2])
                assert mkdocs_slug(text) == toc.slugify(text, "-"), f"{page}: {line}"


def test_broken_links_are_found(tmp_path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "tool.py").write_text("")
    (tmp_path / "README.md").write_text(textwrap.dedent("""\
        # Title

        ## Real time: the robot waits

        [ok](docs/sub/page.md#a-heading) [ok](#real-time-the-robot-waits) [ok](tool.py) [ok](https://x.invalid/y)
        [gone](docs/sub/missing.md) [bad anchor](docs/sub/page.md#no-such-heading) [dup](docs/sub/page.md#twice-1)
        `[code](not/a/link.md)`

        ```bash
        echo "[in a block](nowhere.md)"
        ```

        [label]: docs/none.md
        """))
    (tmp_path / "docs" / "sub" / "page.md").write_text(textwrap.dedent("""\
        # A heading

        ## Twice

        ## Twice

        [ok](#twice_1) [github's](#twice-1) [outside](../../tool.py) [ok](page.md#a-heading) [x](../index.md)
        <a id="kept"></a>[ok](#kept) <img src="../img.png">
        """))
    assert broken_links(tmp_path) == [
        "README.md:6: docs/sub/missing.md: no such file",
        "README.md:6: docs/sub/page.md#no-such-heading: docs/sub/page.md has no heading #no-such-heading",
        "README.md:13: docs/none.md: no such file",
        "docs/sub/page.md:7: #twice-1: docs/sub/page.md has no heading #twice-1",
        "docs/sub/page.md:7: ../../tool.py: outside docs/, which the site does not hold; link it on GitHub or write "
        "the path as code",
        "docs/sub/page.md:7: ../index.md: no such file",
        "docs/sub/page.md:8: ../img.png: no such file",
    ]
