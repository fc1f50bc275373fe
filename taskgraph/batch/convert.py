"""From a notebook to a batch script: ``taskgraph convert NOTEBOOK.ipynb -o script.py``.

A notebook drives ipyparallel engines from one client; a batch job runs the same
script on every MPI rank. The conversion keeps the user's code and changes only what
has no meaning in batch:

======================================  ================================================
in the notebook                         in the script
======================================  ================================================
``tg.Cluster(n=4)``                     ``_tgnb.JobCluster(n=4)``: the job's first 4 ranks
                                        (an error in a job of fewer ranks)
``tg.Cluster.attach(...)``              ``_tgnb.JobCluster()``: all the job's ranks
                                        (``mpiexec -n 4``, ``srun``)
``future.result()`` (from an engine)    unchanged: collective, every rank calls it and
                                        the rank holding the value sends it
``cluster.compile()``, ``.restart()``   unchanged: compile on every rank; nothing to
                                        restart in a job (see ``JobCluster``)
``A.gather()`` (array in the client)    ``A.gather(root=None)``: the array on every rank,
                                        so code after it runs the same everywhere
``run.show()``, a run displayed         ``run.show()``: a progress line, trace files in
                                        ``TASKGRAPH_TRACE_DIR``
the value of a cell's last expression,  ``_tgnb.display(...)``: printed as IPython
``display(x)``                          prints it (widgets print nothing)
``%time``, ``%%time``, ``%timeit``      timed once, ``Wall time: ...`` printed
``!cmd``, ``%%bash``, ``%%writefile``   run on rank 0 only, then a barrier
``x = !cmd``                            the command's lines, on every rank
``%env``, ``%cd``, ``%run``, ``%%capture``  ``os.environ``, ``os.chdir``, ``runpy``,
                                        output captured
``%matplotlib``, ``%load_ext``, ``?``   a comment (nothing to do in batch)
======================================  ================================================

Only rank 0 prints: the script's prologue (:func:`~taskgraph.batch.nbshim.rank0_prints`)
points ``sys.stdout`` of the other ranks at ``os.devnull`` (their ``stderr`` stays, so
every rank's errors and warnings are seen). Delete that line to hear from every rank.

How: IPython's own input transformer turns each cell's magics into
``get_ipython().run_line_magic(...)`` calls (the same tokens IPython runs); the
calls and the expressions above are then found in the syntax tree and their source
spans replaced, so the rest of the cell, comments included, is kept verbatim.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from dataclasses import dataclass, field
from pathlib import Path


class ConversionError(ValueError):
    """The notebook cannot be converted; the message says what to fix."""


# -- reading the notebook --------------------------------------------------------------


def read_notebook(path: str | os.PathLike):
    """The notebook at ``path`` (nbformat v4), or a ConversionError saying what is wrong."""
    import nbformat

    p = Path(path)
    if not p.exists():
        raise ConversionError(f"{p}: no such notebook; check the path (cwd is {os.getcwd()})")
    if p.is_dir():
        raise ConversionError(f"{p} is a directory; give a .ipynb file")
    try:
        nb = nbformat.read(p, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - nbformat raises JSON, validation, key errors
        raise ConversionError(
            f"{p} is not a Jupyter notebook ({type(exc).__name__}: {str(exc)[:200]}); "
            "give an .ipynb file saved by Jupyter, or a Python script to `taskgraph run`"
        ) from None
    return nb


# -- converting code --------------------------------------------------------------------


@dataclass
class Converter:
    """Converts cells one by one; remembers how taskgraph was imported, and notes."""

    imports_taskgraph: bool = False
    cluster_names: set[str] = field(default_factory=set)  # "tg.Cluster", "Cluster"
    notes: list[str] = field(default_factory=list)
    where: str = ""

    def cell(self, source: str, where: str) -> str:
        self.where = where
        return self.code(source, interactive=True)

    def code(self, source: str, interactive: bool) -> str:
        """Python for ``source`` (a cell, or a magic's argument): magics replaced."""
        from IPython.core.inputtransformer2 import TransformerManager

        python = TransformerManager().transform_cell(source)
        tree = self._parse(python)
        self._note_imports(tree)
        python = _apply(python, self._expression_edits(python, tree))
        tree = self._parse(python)
        return _apply(python, self._statement_edits(python, tree, interactive))

    def _parse(self, python: str) -> ast.Module:
        try:
            return ast.parse(python)
        except SyntaxError as exc:
            raise ConversionError(
                f"{self.where}, line {exc.lineno}: {exc.msg}; fix the cell (it would "
                "fail in the notebook too)"
            ) from None

    def _note_imports(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "taskgraph" or alias.name.startswith("taskgraph."):
                        self.imports_taskgraph = True
                        if alias.name == "taskgraph":
                            self.cluster_names.add(f"{alias.asname or 'taskgraph'}.Cluster")
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "taskgraph" or node.module.startswith("taskgraph."):
                    self.imports_taskgraph = True
                    for alias in node.names:
                        if alias.name in ("Cluster", "EngineCluster"):
                            self.cluster_names.add(alias.asname or alias.name)

    # -- pass 1: expressions ----------------------------------------------------------

    def _expression_edits(self, python: str, tree: ast.Module) -> list[_Edit]:
        edits = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = ast.get_source_segment(python, node.func) or ""
            if func in self.cluster_names or _attach_of(func, self.cluster_names):
                edits.append(_Edit.span(node, _batch_cluster(func, node)))
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "gather":
                if not node.args and not node.keywords:
                    edits.append(_Edit.span(node, f"{func}(root=None)"))
            elif isinstance(node.func, ast.Name) and node.func.id == "display":
                edits.append(_Edit.span(node.func, "_tgnb.display"))
            elif func in ("get_ipython().system", "get_ipython().getoutput"):
                edits.append(_Edit.span(node.func, "_tgnb." + func.rsplit(".", 1)[1]))
        return edits

    # -- pass 2: statements -----------------------------------------------------------

    def _statement_edits(self, python: str, tree: ast.Module, interactive: bool) -> list[_Edit]:
        edits = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Expr) and (magic := _magic(node.value)):
                edits.append(_Edit.lines(node, self._magic(*magic, last=node is tree.body[-1])))
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _magic(
                node.value
            ):
                raise ConversionError(
                    f"{self.where}, line {node.lineno}: the value of a magic "
                    f"({ast.get_source_segment(python, node)!r}) cannot be converted; "
                    "write the magic as a statement of its own"
                )
        last = tree.body[-1] if tree.body else None
        if (
            interactive
            and isinstance(last, ast.Expr)
            and not _magic(last.value)
            and not _shows_nothing(last.value)
            and not _ends_with_semicolon(python)
        ):
            text = ast.get_source_segment(python, last.value)
            edits.append(_Edit.span(last.value, f"_tgnb.display({text})"))
        return edits

    def _magic(self, kind: str, name: str, line: str, body: str, last: bool) -> str:
        """Python for one magic statement (without indentation)."""
        q = repr
        if kind == "cell":
            if name in ("time", "timeit"):
                inner = self.code(body, interactive=last)
                return f"with _tgnb.timed({q(name)}):\n" + _indent(inner)
            if name in ("bash", "sh", "script") and (name != "script" or line.strip()):
                shell = line.strip() if name == "script" else name
                return f"_tgnb.system({q(body)}, shell={q(shell)})"
            if name in ("writefile", "file"):
                return f"_tgnb.writefile({q(line.strip())}, {q(body)})"
            if name == "capture":
                words = [w for w in line.split() if not w.startswith("-")]
                var = words[-1] if words else "_"
                return f"with _tgnb.capture() as {var}:\n" + _indent(self.code(body, False))
            if name in ("html", "HTML", "javascript", "js", "markdown", "latex", "svg"):
                return f"# taskgraph convert: %%{name} cell left out (display only)"
            return self._unknown(f"%%{name} {line}".rstrip(), cell=True)
        if name in ("time", "timeit"):
            stmt = _strip_options(line) if name == "timeit" else line
            inner = self.code(stmt, interactive=last)
            return f"with _tgnb.timed({q(name)}):\n" + _indent(inner)
        if name == "env":
            if "=" in line:
                key, value = line.split("=", 1)
            elif len(line.split()) == 2:
                key, value = line.split()
            elif line.strip():
                return f"print(os.environ.get({q(line.strip())}))"
            else:
                return "print(dict(os.environ))"
            return f"os.environ[{q(key.strip())}] = {q(value.strip())}"
        if name == "cd":
            return f"os.chdir(os.path.expanduser({q(line.strip())}))"
        if name == "run":
            return f"globals().update(_tgnb.run_path({q(line.strip())}))"
        if name in ("sx", "system"):
            return f"_tgnb.system({q(line)})"
        if name in _COMMENTED:
            return f"# taskgraph convert: %{name} {line}  ({_COMMENTED[name]})".rstrip()
        return self._unknown(f"%{name} {line}".rstrip(), cell=False)

    def _unknown(self, text: str, cell: bool) -> str:
        first = text.splitlines()[0]
        self.notes.append(f"{self.where}: {first!r} has no batch equivalent; left out")
        return f"# taskgraph convert: left out {'cell ' if cell else ''}magic {first}"


_COMMENTED = {
    "matplotlib": "figures are saved, not shown, in batch",
    "pylab": "import numpy/matplotlib explicitly in batch",
    "load_ext": "no IPython extensions in batch",
    "reload_ext": "no IPython extensions in batch",
    "autoreload": "no IPython extensions in batch",
    "aimport": "no IPython extensions in batch",
    "config": "IPython configuration",
    "pip": "install packages before the job",
    "conda": "install packages before the job",
    "mamba": "install packages before the job",
    "pinfo": "help",
    "pinfo2": "help",
    "who": "interactive",
    "whos": "interactive",
    "history": "interactive",
    "precision": "interactive",
    "xmode": "interactive",
    "pdb": "interactive",
    "debug": "interactive",
    "load": "paste the file's code into the notebook instead",
    "ls": "interactive",
    "pwd": "interactive",
}


@dataclass
class _Edit:
    """Replace source from (line, col) to (end_line, end_col), 1-based lines."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str

    @classmethod
    def span(cls, node, text: str) -> _Edit:
        return cls((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text)

    @classmethod
    def lines(cls, node, text: str) -> _Edit:
        """Replace the statement's whole lines; ``text`` gets the statement's indent."""
        pad = " " * node.col_offset
        indented = "\n".join(pad + line if line else line for line in text.splitlines())
        return cls((node.lineno, 0), (node.end_lineno, 10**9), indented)


def _apply(source: str, edits: list[_Edit]) -> str:
    """``source`` with the edits made (an edit inside an earlier one is dropped)."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        line, col = pos
        text = lines[line - 1] if line - 1 < len(lines) else ""
        col = min(col, len(text.rstrip("\r\n")))
        # ast columns count UTF-8 bytes
        return starts[line - 1] + len(text.encode()[:col].decode(errors="ignore"))

    spans = sorted(((offset(e.start), offset(e.end), e.text) for e in edits), reverse=True)
    out, limit = source, len(source) + 1
    for a, b, text in spans:
        if b <= limit:
            out = out[:a] + text + out[b:]
            limit = a
    return out


def _magic(node: ast.expr | None) -> tuple[str, str, str, str] | None:
    """(kind, name, line, body) for ``get_ipython().run_line/cell_magic(...)``."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("run_line_magic", "run_cell_magic")
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    ):
        return None
    args = [ast.literal_eval(a) for a in node.args]
    if node.func.attr == "run_line_magic":
        return ("line", args[0], args[1], "")
    return ("cell", args[0], args[1], args[2])


def _batch_cluster(func: str, node: ast.Call) -> str:
    """``tg.Cluster(n, ...)`` in batch: the job's first n ranks (an error in a job of
    fewer: never silently another number), also under a plain ``python`` (one rank);
    ``.attach(...)``: all the job's ranks."""
    keep = ["workers", "blas_threads"]
    args = []
    if not func.endswith(".attach"):
        keep.append("n")
        args = [ast.unparse(a) for a in node.args[:1]]
    args += [ast.unparse(k) for k in node.keywords if k.arg in keep]
    return f"_tgnb.JobCluster({', '.join(args)})"


def _attach_of(func: str, cluster_names: set[str]) -> bool:
    return func.endswith(".attach") and func[: -len(".attach")] in cluster_names


def _shows_nothing(node: ast.expr) -> bool:
    """A call whose value is None or a live view: ``print(...)``, ``display(...)``,
    ``run.show()``, ``cluster.close()``, ``!cmd``. Not wrapped in ``_tgnb.display``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in ("print", "display")
    return isinstance(f, ast.Attribute) and f.attr in ("display", "show", "close", "system")


def _ends_with_semicolon(python: str) -> bool:
    """A cell ending in ``;`` shows nothing, as in IPython."""
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER}
    skip |= {tokenize.INDENT, tokenize.DEDENT}
    last = None
    for tok in tokenize.generate_tokens(io.StringIO(python).readline):
        if tok.type not in skip:
            last = tok
    return last is not None and last.string == ";"


def _strip_options(line: str) -> str:
    """``-n 10 -r 3 f()`` -> ``f()`` (timeit's options; one timed run in batch)."""
    words = line.split()
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in ("-n", "-r", "-p") else 1
    return " ".join(words[i:])


def _indent(code: str) -> str:
    body = "\n".join("    " + line if line.strip() else line for line in code.splitlines())
    return body if body.strip() else "    pass"


# -- the whole notebook -----------------------------------------------------------------

HEADER = '''\
#!/usr/bin/env python
"""{stem}: converted from the notebook {source} by `taskgraph convert`.

Run it on N MPI ranks (every rank runs this script; _tgnb.JobCluster(n) is the job's
first n ranks, an error in a job of fewer):

    mpiexec -n N python {script}
    taskgraph run -n N {script}

Only rank 0 prints (the _tgnb.rank0_prints() line below). run.show() prints a
progress line and writes the trace files into $TASKGRAPH_TRACE_DIR (default: the
current directory). Lines marked "taskgraph convert:" were IPython-only.
"""

import os  # noqa: F401 - used by converted magics

import taskgraph.batch.nbshim as _tgnb

_tgnb.rank0_prints()
'''


def convert_notebook(path: str | os.PathLike, script_name: str = "script.py") -> tuple[str, list]:
    """The batch script for the notebook at ``path``, and notes on what was left out."""
    nb = read_notebook(path)
    conv = Converter()
    parts = [HEADER.format(stem=Path(script_name).stem, source=Path(path).name, script=script_name)]
    count = 0
    for i, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        count += 1
        code = conv.cell(cell.source, f"{Path(path).name}, cell {i}")
        parts.append(f"\n# %% cell {i}\n{code.rstrip()}\n")
    if not conv.imports_taskgraph:
        what = f"its {count} code cells" if count else "it has no code cells, so"
        raise ConversionError(
            f"{path}: no taskgraph code ({what} never import taskgraph); add "
            "`import taskgraph as tg` and build a graph, or run it with jupyter nbconvert"
        )
    return "".join(parts), conv.notes


def convert_to_file(notebook: str | os.PathLike, script: str | os.PathLike) -> list[str]:
    """Write the batch script for ``notebook`` to ``script``; the notes."""
    text, notes = convert_notebook(notebook, Path(script).name)
    Path(script).write_text(text)
    return notes


def requested_ranks(python: str, where: str = "the script") -> list[tuple[int, int | None]]:
    """(line, n) for each ``Cluster(n)`` / ``JobCluster(n)`` call in ``python``: n
    when it is a literal number, None when it is computed (or absent: the job's ranks
    are meant, and the pair is left out). A syntax error is a ConversionError."""
    try:
        tree = ast.parse(python)
    except SyntaxError as exc:
        raise ConversionError(f"{where}, line {exc.lineno}: {exc.msg}") from None
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name not in ("Cluster", "JobCluster", "EngineCluster"):
            continue
        given = node.args[:1] + [k.value for k in node.keywords if k.arg == "n"]
        if not given:
            continue
        try:
            n = ast.literal_eval(given[0])
        except ValueError:
            n = None
        found.append((node.lineno, n if isinstance(n, int) else None))
    return found


def check_ranks(python: str, ranks: int, where: str = "the script") -> list[str]:
    """Notes on the clusters ``python`` asks for, in a job of ``ranks`` ranks; a
    ConversionError if one asks for more (it would fail as the job starts)."""
    notes = []
    for line, n in requested_ranks(python, where):
        if n is None:
            notes.append(
                f"{where}, line {line}: a cluster whose size is computed at run time: "
                f"it must be at most the job's {ranks} ranks"
            )
        elif n > ranks:
            raise ConversionError(
                f"{where}, line {line}: Cluster(n={n}) needs {n} ranks and the job has "
                f"{ranks} (nodes x ntasks-per-node): ask for more, or a smaller cluster"
            )
        elif n < ranks:
            notes.append(
                f"{where}, line {line}: Cluster(n={n}) runs on {n} of the job's {ranks} "
                "ranks; the others take part in none of its runs"
            )
    return notes


def is_notebook(path: str | os.PathLike) -> bool:
    return str(path).endswith(".ipynb")
