"""The docs: every page in mkdocs.yml's nav exists and every page is in it, every relative link
of README.md and docs/ resolves (file and anchor), the configuration reference covers every
key, and the README stays a front door. Cheap checks on the files; `.ci/lint` builds the site
itself with `mkdocs build --strict`."""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

from spreeze.common.config_docs import field_docs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def nav_pages(node: Any) -> list[str]:
    """Every page path of an mkdocs.yml nav (entries are paths, {title: path} or {title: [...]})."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return []


def mkdocs_config() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "mkdocs.yml").read_text()))


def doc_pages() -> list[Path]:
    """The Markdown pages of the site: docs/**/*.md (with the linked spec and result tables)."""
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs' toc extension makes it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", re.sub(r"`", "", text)).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def links(page: Path) -> list[str]:
    """The link targets of a Markdown file, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [m.group(1) for m in LINK.finditer(text)]


def test_every_nav_page_exists_and_every_page_is_in_the_nav() -> None:
    config = mkdocs_config()
    assert config["docs_dir"] == "docs"
    pages = nav_pages(config["nav"])
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    left_out = [str(p.relative_to(DOCS)) for p in doc_pages() if str(p.relative_to(DOCS)) not in pages]
    assert not left_out, f"pages missing from mkdocs.yml's nav: {left_out}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *doc_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_configuration_reference_covers_every_key() -> None:
    spec = importlib.util.spec_from_file_location("docs_hooks_generated", DOCS / "hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (DOCS / "reference" / "configuration.md").read_text()
    assert hooks.CONFIG_REFERENCE in page and hooks.CONFIGS_LIST in page
    built = hooks.on_page_markdown(page)
    for key, default, _doc in field_docs():
        assert f"| `{key}` | `{default.replace('|', chr(92) + '|')}` |" in built, key
    for path in (ROOT / "configs").glob("*.yaml"):
        assert f"`configs/{path.name}`" in built


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024, "README.md grows past 12 KB: move the detail to a docs page"
    for needed in ("## Quick start", "### GPU install", ".venv/bin/python -m pytest -q", "mkdocs serve"):
        assert needed in text, needed


def test_the_front_pages_name_the_protocol_version_the_code_speaks() -> None:
    from spreeze.proto.codec import PROTOCOL_VERSION
    from spreeze.proto.messages import SPEC_VERSION

    named = f"protocol document version {SPEC_VERSION}, wire version {PROTOCOL_VERSION}"
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "protocol.md"):
        text = " ".join(page.read_text().split())
        assert named in text, f"{page.name} does not say '{named}'"
