"""The documentation: every public name has a docstring, the API reference builds from them
(`make docs`, pdoc), and no link within the docs is broken."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from api_docs import public_modules  # noqa: E402 (what `make docs` documents)


def test_every_public_name_has_a_docstring():
    missing = []
    for name in public_modules():
        module = importlib.import_module(name)
        if not inspect.getdoc(module):
            missing.append(name)
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or getattr(value, "__module__", None) != name:
                continue
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if not inspect.getdoc(value):
                missing.append(f"{name}.{attribute}")
            if inspect.isclass(value):
                missing += [f"{name}.{attribute}.{m}" for m in _undocumented_members(value)]
    assert not missing, "no docstring:\n" + "\n".join(missing)


def _undocumented_members(cls: type) -> list[str]:
    found = []
    for member, value in vars(cls).items():
        if member.startswith("_"):
            continue
        function = value.fget if isinstance(value, property) else value
        if isinstance(function, (staticmethod, classmethod)):
            function = function.__func__
        if inspect.isfunction(function) and not _doc(cls, member, function):
            found.append(member)
    return found


def _doc(cls: type, member: str, function: object) -> str | None:
    """The member's docstring, or the one it overrides (pdoc shows inherited docstrings)."""
    if inspect.getdoc(function):
        return inspect.getdoc(function)
    for base in cls.__mro__[1:]:
        inherited = vars(base).get(member)
        if inherited is not None:
            inherited = inherited.fget if isinstance(inherited, property) else inherited
            if getattr(inherited, "__doc__", None):
                return inherited.__doc__
    return None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.anchors: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.anchors.add(values["id"] or "")
        if tag == "a" and values.get("href"):
            self.links.append(values["href"] or "")


def _local(link: str) -> bool:
    parsed = urlparse(link)
    return not parsed.scheme and not link.startswith(("mailto:", "//"))


@pytest.mark.slow
def test_the_api_reference_builds_with_no_broken_links(tmp_path):
    subprocess.run(  # what `make docs` runs
        [sys.executable, "scripts/api_docs.py", str(tmp_path)],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    pages = {page: _Links() for page in tmp_path.rglob("*.html")}
    assert len(pages) > 40, "the reference should have a page per module"
    for page, parser in pages.items():
        parser.feed(page.read_text())
    broken = []
    for page, parser in pages.items():
        for link in filter(_local, parser.links):
            target, _, anchor = unquote(link).partition("#")
            file = (page.parent / target).resolve() if target else page
            if not file.exists():
                broken.append(f"{page.relative_to(tmp_path)}: {link}")
            elif anchor and file.suffix == ".html" and anchor not in pages[file].anchors:
                broken.append(f"{page.relative_to(tmp_path)}: {link} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(sorted(set(broken))[:50])


def test_markdown_links_stay_inside_the_repository_and_resolve():
    broken = []
    for document in [ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/*.md")]:
        for link in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if not _local(link) or link.startswith("#"):
                continue
            target = (document.parent / unquote(link).partition("#")[0]).resolve()
            if ROOT not in target.parents or not target.exists():
                broken.append(f"{document.name}: {link}")
    assert not broken, "\n".join(broken)
