"""Every ```python block of README.md and of the documentation site (docs/*.md) runs, and where a plain ``` (or
```text) block follows it directly, that block is exactly what it printed. ```py blocks are illustrations and
are not run. Also: the README and the site's index link to every page of the site, and mkdocs.yml lists every
page (so a page cannot be added without a way to reach it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")


class Block(NamedTuple):
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence


class Snippet(NamedTuple):
    path: Path
    code: str
    line: int
    expected: str | None  # the output block right after it, if any


def fenced_blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text; a fence is a line of exactly three backticks and a language."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        assert j < len(lines), f"unclosed code block at line {i + 1}"
        blocks.append(Block(opening.group(1), "\n".join(lines[i + 1 : j]) + "\n", i + 1, j + 1))
        i = j + 1
    return blocks


def snippets(path: Path) -> list[Snippet]:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    blocks = fenced_blocks(text)
    out = []
    for k, block in enumerate(blocks):
        if block.lang != "python":
            continue
        expected = None
        if k + 1 < len(blocks):
            after = blocks[k + 1]
            between = lines[block.end : after.line - 1]
            if after.lang in ("", "text") and not any(line.strip() for line in between):
                expected = after.code
        out.append(Snippet(path, block.code, block.line, expected))
    return out


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


ALL = [s for path in documents() for s in snippets(path)]


def test_the_readme_and_the_site_have_python_examples() -> None:
    readme = [s for s in ALL if s.path.name == "README.md"]
    assert readme, "README.md lost its Python example"
    assert any(s.expected for s in readme), "README.md's example lost its printed output"
    assert len(ALL) > len(readme), "docs/ has no Python examples"


@pytest.mark.parametrize("snippet", ALL, ids=[f"{s.path.relative_to(ROOT)}:{s.line}" for s in ALL])
def test_python_block_runs_and_prints_what_follows_it(
    snippet: Snippet, capsys: pytest.CaptureFixture[str]
) -> None:
    where = f"{snippet.path.relative_to(ROOT)}[python block at line {snippet.line}]"
    exec(compile(snippet.code, where, "exec"), {"__name__": "__docs_snippet__"})
    if snippet.expected is not None:
        printed = capsys.readouterr().out
        assert printed.rstrip("\n") == snippet.expected.rstrip("\n"), (
            f"{where}: the output block after it is not what it printed:\n{printed}"
        )


def test_fenced_blocks_and_their_outputs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "a\n```python\nprint(1)\n```\n\n```\n1\n```\n"  # a block and its output
        "inline ```` ```python ```` stays text\n"
        "```python\nx = 2\n```\ntext between\n```\nnot its output\n```\n"  # no output block
        "```py\nillustration\n```\n"
    )
    assert [b.lang for b in fenced_blocks(page.read_text())] == ["python", "", "python", "", "py"]
    found = snippets(page)
    assert [(s.code, s.line, s.expected) for s in found] == [("print(1)\n", 2, "1\n"), ("x = 2\n", 10, None)]


def _nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return re.findall(r":\s*([\w-]+\.md)\s*$", text, flags=re.M)


def test_mkdocs_nav_lists_every_page() -> None:
    pages = {p.name for p in DOCS.glob("*.md")}
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), "a page is listed twice in mkdocs.yml's nav"
    assert set(nav) == pages, f"nav and docs/ differ: {sorted(set(nav) ^ pages)}"
    assert "stress.md" in nav


@pytest.mark.parametrize(("document", "prefix"), [("README.md", "docs/"), ("docs/index.md", "")])
def test_readme_and_index_link_to_every_page(document: str, prefix: str) -> None:
    text = (ROOT / document).read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(" + re.escape(prefix) + r"([\w-]+\.md)(?:#[\w-]*)?\)", text))
    pages = {p.name for p in DOCS.glob("*.md")} - ({"index.md"} if document == "docs/index.md" else set())
    assert pages <= linked, f"{document} does not link to {sorted(pages - linked)}"
