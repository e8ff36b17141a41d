"""MkDocs hook: the pages that are generated from the code when the site is built.

- `<!-- spreeze:config-reference -->` becomes a table of every run configuration key with
  its default and its doc, read by `spreeze.common.config_docs.field_docs` from the config
  dataclasses' source comments (the same rows `spreeze train --help` prints), one table
  per section. The algorithms' sections (`td3`, `sac`) and `sparse` come from their own
  dataclasses in `common/algorithms/configs.py` and `common/sparse_config.py`.
- `<!-- spreeze:configs-list -->` becomes a list of the files in `configs/` with the
  comment lines that open each.

So the site cannot drift from the code: a key added, renamed or re-documented there is what
the next build shows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG_REFERENCE = "<!-- spreeze:config-reference -->"
CONFIGS_LIST = "<!-- spreeze:configs-list -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


def config_reference() -> str:
    """Markdown: one table per config section, every leaf key with its default and doc."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from spreeze.common.config_docs import field_docs

    sections: dict[str, list[tuple[str, str, str]]] = {}
    for key, default, doc in field_docs():
        section = key.split(".", 1)[0] if "." in key else ""
        sections.setdefault(section, []).append((key, default, doc))
    out = []
    for section, rows in sections.items():
        out.append(f"## `{section}`" if section else "## Top level")
        out.append("")
        out.append("| key | default | meaning |")
        out.append("|---|---|---|")
        out += [f"| `{key}` | `{_cell(default)}` | {_cell(doc)} |" for key, default, doc in rows]
        out.append("")
    return "\n".join(out)


def configs_list() -> str:
    """Markdown: every file in configs/ with the comment lines at its top."""
    out = []
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            comment.append(line.lstrip("#").strip())
        out.append(f"- `configs/{path.name}`: {' '.join(comment)}")
    return "\n".join(out)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if CONFIG_REFERENCE in markdown:
        markdown = markdown.replace(CONFIG_REFERENCE, config_reference())
    if CONFIGS_LIST in markdown:
        markdown = markdown.replace(CONFIGS_LIST, configs_list())
    return markdown
