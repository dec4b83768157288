"""The docs site: its generated reference pages are the code's, and it builds strictly (no broken link or anchor).

The strict build runs here as well as in ``make docs`` so that pytest alone catches a broken link; it
takes a few seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from markdown.extensions.toc import slugify  # type: ignore[import-untyped]
from pydantic import BaseModel, Field

from gpufleet.cli import docsref
from gpufleet.cli.app import app
from gpufleet.errors import SpecError
from gpufleet.spec import JobSpec, parse_spec

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


@pytest.fixture(scope="module")
def rendered() -> Iterator[tuple[dict[str, str], list[str]]]:
    """The pages as the code gives them, rendered in a narrow terminal: nothing on them may depend on its width."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("COLUMNS", "40")
        yield docsref.render_pages(DOCS)


def test_the_committed_reference_pages_are_the_codes(rendered: tuple[dict[str, str], list[str]]) -> None:
    pages, _ = rendered
    assert sorted(pages) == sorted(docsref.PAGES)
    stale = docsref.stale_pages(DOCS, pages)
    assert not stale, "\n".join(f"{name} is stale: run `{docsref.REGENERATE}`" for name in stale)


def test_every_jobspec_field_is_documented(rendered: tuple[dict[str, str], list[str]]) -> None:
    pages, missing = rendered
    assert missing == [], f"JobSpec fields without a docstring: {', '.join(missing)}"
    text = pages["jobspec.md"]
    for section in docsref.sections(JobSpec):
        assert f"\n## {section.title}\n" in text
        prefix = f"{section.paths[0]}." if section.paths[0] else ""
        for name, info in section.model.model_fields.items():
            assert f"| `{prefix}{info.alias or name}` |" in text, f"{prefix}{name} is missing from jobspec.md"


def test_every_command_is_in_the_cli_reference(rendered: tuple[dict[str, str], list[str]]) -> None:
    text = rendered[0]["cli.md"]
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="gpufleet")
    names = root.list_commands(ctx)  # type: ignore[attr-defined]
    assert len(names) > 20
    for name in names:
        assert f"\n### gpufleet {name}\n" in text, f"gpufleet {name} is missing from cli.md"
    assert "\n### gpufleet slurm account add\n" in text  # three levels down
    assert "| `--json` | flag |" in text


def test_cli_reference_groups_commands_by_panel() -> None:
    leaf = docsref.Command("tool b", "Usage: tool b", "B does b.", "Second", (), ())
    first = docsref.Command("tool a", "Usage: tool a", "A does a.\n\nMore.", "First", (), ())
    loose = docsref.Command("tool c", "Usage: tool c", "C.", None, (), ())
    root = docsref.Command("tool", "Usage: tool", "The tool.", None, (), (leaf, first, loose))
    text = docsref.cli_page(root)
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == ["Second", "First", "Commands"]
    assert "| [`tool a`](#tool-a) | A does a. |" in text


def test_every_operation_is_in_the_http_reference(rendered: tuple[dict[str, str], list[str]]) -> None:
    text = rendered[0]["http-api.md"]
    document = json.loads((DOCS / "openapi.json").read_text())
    for path, item in document["paths"].items():
        for method in item:
            assert f"| `{method.upper()}` | `{path}` |" in text


class _Inner(BaseModel):
    """An inner block.

    More about it."""

    mode: Literal["ddp", "fsdp"] = "ddp"
    """How it is split."""


class _Outer(BaseModel):
    """The outer model."""

    count: int = Field(default=8642, ge=1, le=10**9)
    """How many | of them."""
    ratio: float = Field(default=0.5, ge=1e-6)
    inner: _Inner | None = None
    items: list[_Inner] = Field(default_factory=list)
    """More inner blocks."""


def test_jobspec_rendering_of_types_defaults_and_constraints() -> None:
    text, missing = docsref.jobspec_page(_Outer)
    assert missing == ["ratio"]
    assert '| `inner.mode` | `"ddp"` \\| `"fsdp"` | `"ddp"` |  | How it is split. |' in text
    assert "| `count` | `int` | `8642` | ≥ 1, ≤ 1,000,000,000 | How many \\| of them. |" in text
    assert "| `ratio` | `float` | `0.5` | ≥ 0.000001 |" in text
    assert "| `inner` | [_Inner](#inner) \\| `null` | `null` |  | An inner block. |" in text
    assert "| `items` | list of [_Inner](#inner) | `[]` |" in text
    assert "`_Inner`, written at `inner`, `items[]`." in text
    assert "e-0" not in text and "e+" not in text


@pytest.mark.parametrize(
    ("text", "markdown"),
    [
        ("a ``code`` and `more`", "a `code` and `more`"),
        (":class:`~gpufleet.runtime.TrainSession` and :attr:`world_size`", "`TrainSession` and `world_size`"),
        ("6N + 12*L*H <pattern> [x]", "6N + 12\\*L\\*H \\<pattern\\> \\[x\\]"),
    ],
)
def test_inline_keeps_code_and_escapes_the_rest(text: str, markdown: str) -> None:
    assert docsref.inline(text) == markdown


def test_a_pipe_in_a_table_cell_is_escaped_even_in_code() -> None:
    assert docsref.inline("a|b `x|y`", cell=True) == "a\\|b x\\|y"


@pytest.mark.parametrize("heading", ["gpufleet quality monitor sample-data", "placement.any_of[]", "JobSpec"])
def test_anchors_are_the_sites(heading: str) -> None:
    assert docsref.slug(heading) == slugify(heading, "-")


def test_check_names_a_stale_page_and_write_fixes_it(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "reference").mkdir(parents=True)
    shutil.copy(DOCS / "openapi.json", docs / "openapi.json")
    lines: list[str] = []
    assert docsref.main(["--check", "--docs", str(docs)], out=lines.append) == 1
    assert f"docs/reference/cli.md is stale: run `{docsref.REGENERATE}`" in lines
    assert docsref.main(["--write", "--docs", str(docs)], out=lines.append) == 0
    lines.clear()
    assert docsref.main(["--check", "--docs", str(docs)], out=lines.append) == 0 and lines == []


def test_unknown_spec_field_points_at_the_reference() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "entrypoint": "m:f", "colour": "blue"})
    message = str(err.value)
    assert message.endswith("unknown field (check its spelling against the fields in docs/reference/jobspec.md)")
    named = re.search(r"docs/reference/\S+\.md", message)
    assert named is not None and (REPO / named.group(0)).is_file()


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env: dict[str, Any] = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    warnings = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings)
    assert (tmp_path / "site" / "reference" / "jobspec" / "index.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()
