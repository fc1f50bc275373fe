"""The documentation a user reads first: the README's length and quick start, and the
docstrings of the public API (``taskgraph.__all__`` and the public methods and
properties of its classes), each naming its function's real parameters."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import taskgraph as tg

README = Path(__file__).resolve().parent.parent / "README.md"
QUICK_START = ('pip install -e ".[test]" && taskgraph demo', "pytest")
MAX_README_LINES = 250
SKIPPED_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_readme_has_the_quick_start_commands() -> None:
    lines = [line.strip() for line in README.read_text().splitlines()]
    for command in QUICK_START:
        assert command in lines, f"README.md lacks the line {command!r}"


def _own(cls: type) -> list[type]:
    """``cls`` and its bases defined in taskgraph (not object, Exception, Enum...)."""
    return [c for c in cls.__mro__ if c.__module__.startswith("taskgraph")]


def _members(cls: type) -> dict[str, object]:
    """Public methods and properties of ``cls`` that taskgraph defines, by name."""
    found: dict[str, object] = {}
    for c in reversed(_own(cls)):
        for name, raw in vars(c).items():
            if name.startswith("_"):
                continue
            if isinstance(raw, classmethod | staticmethod):
                found[name] = raw.__func__
            elif isinstance(raw, property) or inspect.isfunction(raw):
                found[name] = raw
    return found


def public_api() -> dict[str, object]:
    """Every public name a user reaches from ``import taskgraph as tg``, dotted."""
    out: dict[str, object] = {}
    for name in tg.__all__:
        obj = getattr(tg, name)
        out[name] = obj
        if inspect.isclass(obj):
            for member, fn in _members(obj).items():
                out[f"{name}.{member}"] = fn
    return out


def _doc(obj: object) -> str:
    return (getattr(obj, "__doc__", None) or "").strip()


def _missing_parameters(obj: object) -> list[str]:
    """Parameters of a function's signature that its docstring never names."""
    fn = obj.fget if isinstance(obj, property) else obj
    if not callable(fn) or isinstance(fn, type):
        return []
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    doc = _doc(obj)
    return [
        p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls")
        and p.kind not in SKIPPED_KINDS
        and not re.search(rf"\b{re.escape(p.name)}\b", doc)
    ]


def _constructor_missing(cls: type) -> list[str]:
    """Constructor parameters named in neither the class's nor ``__init__``'s docstring."""
    init = next((c.__dict__["__init__"] for c in _own(cls) if "__init__" in c.__dict__), None)
    if init is None:
        return []
    doc = _doc(cls) + "\n" + _doc(init)
    return [
        p.name
        for p in inspect.signature(init).parameters.values()
        if p.name != "self"
        and p.kind not in SKIPPED_KINDS
        and not re.search(rf"\b{re.escape(p.name)}\b", doc)
    ]


def doc_problems() -> list[str]:
    """One line per public name without a docstring, or whose docstring leaves out
    parameters of its signature."""
    problems = []
    for name, obj in sorted(public_api().items()):
        if not _doc(obj):
            problems.append(f"{name}: no docstring")
            continue
        if inspect.isclass(obj):
            missing = _constructor_missing(obj)
        else:
            missing = _missing_parameters(obj)
        if missing:
            problems.append(f"{name}: docstring does not name {', '.join(missing)}")
    return problems


def test_public_api_is_found() -> None:
    api = public_api()
    assert {"Graph", "Cluster", "Trace.to_chrome", "TiledMatrix.gather"} <= set(api)
    assert len(api) > len(tg.__all__)


def test_public_names_have_docstrings_naming_their_parameters() -> None:
    problems = doc_problems()
    assert not problems, f"{len(problems)} public names:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "missing"),
    [
        ('def f(a, b):\n    """Uses a."""', ["b"]),
        ('def f(self, a, *args, **kw):\n    """Uses ``a``."""', []),
        ('def f(ab):\n    """Uses abc."""', ["ab"]),
    ],
)
def test_missing_parameters_finds_what_the_docstring_leaves_out(source, missing) -> None:
    namespace: dict = {}
    exec(source, namespace)
    assert _missing_parameters(namespace["f"]) == missing


ROOT = README.parent
USER_DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "slurm" / "README.md"]
USER_DOCS.append(ROOT / "notebooks" / "README.md")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_paths_in_the_docs_exist(doc: Path) -> None:
    text = doc.read_text()
    paths = set(re.findall(r"`(taskgraph/[\w/]+\.py)`", text))
    dotted = set(re.findall(r"`(taskgraph(?:\.\w+)+)", text))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    missing += sorted(d for d in dotted if not _resolves(d))
    assert not missing, f"{doc.name} names what the tree lacks: {missing}"


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of ``doc``."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_the_docs_resolve(doc: Path) -> None:
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([\w-]+))?\)", doc.read_text()):
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists() or (anchor and anchor not in _anchors(path)):
            broken.append(f"{target}#{anchor}" if anchor else target)
    assert not broken, f"{doc.name} links to what is not there: {broken}"


# words in backticks in a layer's entry of architecture.md that are not its modules
NOT_MODULES = {"config", "taskgraph", "wait", "result", "trace", "stats", "show"}


def _layer_entries() -> dict[str, str]:
    """Each layer's entry in architecture.md's "Where the code lives", by layer."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^- \*\*`taskgraph/(\w+)/`\*\*", section, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n- ", 1)[0] for i in range(1, len(parts), 2)}


def test_architecture_names_every_module_of_every_layer() -> None:
    entries = _layer_entries()
    assert set(entries) == {"core", "dsl", "plan", "trace", "run", "cluster", "batch"}
    problems = []
    for layer, entry in entries.items():
        folder = ROOT / "taskgraph" / layer
        modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
        named = set(re.findall(r"`([a-z_]+)`", entry)) - (NOT_MODULES - modules)
        problems += [f"taskgraph/{layer}/{m}.py is not described" for m in modules - named]
        problems += [f"taskgraph/{layer}/{m}.py does not exist" for m in named - modules]
    assert not problems, "docs/architecture.md, Where the code lives:\n" + "\n".join(problems)
