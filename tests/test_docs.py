"""The documentation: every public name has a docstring, the API reference builds from them
(`make docs`, pdoc), the guides' Python examples under `docs/` run as written (the README's
are `test_readme.py`'s), every guide is linked from the README, and no link within the docs
is broken, anchors included."""

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


DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(ROOT.glob("docs/*.md"))]
GUIDES = sorted(ROOT.glob("docs/*.md"))
FENCE = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)


def _python_blocks(document: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.DOTALL)


def _runnable(block: str) -> bool:
    """As in test_readme.py: a block that uses a placeholder builder, or loads SmolLM2 (what
    test_cli_and_examples.py runs more cheaply), is shown, not run."""
    return "countdown_rows" not in block and "smollm2" not in block


GUIDE_BLOCKS = [
    pytest.param(block, id=f"{guide.name}:{index}")
    for guide in GUIDES
    for index, block in enumerate(_python_blocks(guide))
    if _runnable(block)
]


@pytest.fixture
def restore_registry():
    import gymnasium

    from toolgym import registry

    before, gym_before = dict(registry._registry), set(gymnasium.registry)
    yield
    registry._registry.clear()
    registry._registry.update(before)
    for gym_id in set(gymnasium.registry) - gym_before:
        del gymnasium.registry[gym_id]


@pytest.mark.usefixtures("restore_registry")
@pytest.mark.parametrize("block", GUIDE_BLOCKS)
def test_guide_block_runs(block, request):
    exec(compile(block, request.node.callspec.id, "exec"), {})


@pytest.mark.usefixtures("restore_registry")
def test_guide_registration_blocks_run_with_the_readmes_countdown():
    readme = _python_blocks(ROOT / "README.md")
    countdown = [block for block in readme if "Countdown" in block]  # the class, the builder
    blocks = [b for guide in GUIDES for b in _python_blocks(guide) if "countdown_rows" in b]
    assert blocks, "environments.md shows registering with a dataset builder"
    for block in blocks:
        namespace: dict = {}
        for index, shown in enumerate(countdown):
            exec(compile(shown, f"README.md Countdown block {index}", "exec"), namespace)
        exec(compile(block, "a guide's registration block", "exec"), namespace)


def test_every_guide_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {unquote(link).partition("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", readme)}
    missing = [guide.name for guide in GUIDES if f"docs/{guide.name}" not in linked]
    assert not missing, f"not linked from README.md: {missing}"


def _anchors(document: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", document.read_text()), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 1
        while anchor in anchors:
            anchor, n = f"{slug}-{n}", n + 1
        anchors.add(anchor)
    return anchors


def test_markdown_links_stay_inside_the_repository_and_resolve():
    broken = []
    for document in DOCUMENTS:
        for link in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", document.read_text())):
            if not _local(link):
                continue
            path, _, anchor = unquote(link).partition("#")
            target = (document.parent / path).resolve() if path else document
            if ROOT not in target.parents or not target.exists():
                broken.append(f"{document.name}: {link}")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{document.name}: {link} (no such heading)")
    assert not broken, "\n".join(broken)
