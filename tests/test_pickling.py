"""A function that travels by value keeps its file: a traceback from another process
(an engine, a thief rank, a process task) names the script or the notebook cell, and
shows the line, where plain cloudpickle reads ``<dynamic-code>``."""

import linecache
import subprocess
import sys
import textwrap

import pytest

from taskgraph.core import pickling

RAISE_IN_ANOTHER_PROCESS = textwrap.dedent(
    """
    import pickle, sys, traceback
    f = pickle.loads(sys.stdin.buffer.read())
    try:
        f(0)
    except Exception:
        print(traceback.format_exc())
    """
)


def _traceback_elsewhere(fn) -> str:
    """The traceback of ``fn(0)`` called in a fresh Python process, fn by value."""
    blob = pickling.dumps(fn)
    proc = subprocess.run(
        [sys.executable, "-c", RAISE_IN_ANOTHER_PROCESS], input=blob, capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode()


def _defined_in(source: str, filename: str):
    """The function ``f`` of ``source``, compiled as from ``filename``, in a module that
    is no module (cloudpickle takes it by value, as a notebook's or a script's)."""
    ns: dict = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), ns)
    return ns["f"]


def test_a_script_function_names_its_file_and_line_in_another_process(tmp_path):
    path = tmp_path / "script.py"
    source = "def f(x):\n    squares = [i * i for i in range(3)]\n    return squares[2] / x\n"
    path.write_text(source)
    text = _traceback_elsewhere(_defined_in(source, str(path)))
    assert f'File "{path}", line 3, in f' in text, text
    assert "return squares[2] / x" in text and "<dynamic-code>" not in text, text


def test_a_notebook_cell_function_brings_its_lines_along():
    # as IPython keeps a cell: in linecache, under a file name with no file behind it
    filename = "/nonexistent/ipykernel_0/cell_17.py"
    source = "def f(x):\n    return {}['missing ' + str(x)]\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        text = _traceback_elsewhere(_defined_in(source, filename))
    finally:
        linecache.cache.pop(filename, None)
    assert f'File "{filename}", line 2, in f' in text, text
    assert "return {}['missing ' + str(x)]" in text, text


def test_only_the_functions_own_lines_of_a_cell_travel():
    filename = "/nonexistent/ipykernel_0/cell_18.py"
    source = "TOKEN = 'secret-abc'\n\ndef f(x):\n    return 1 / x\n" + "# filler\n" * 5000
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        blob = pickling.dumps(_defined_in(source, filename))
        text = _traceback_elsewhere(_defined_in(source, filename))
    finally:
        linecache.cache.pop(filename, None)
    assert b"secret-abc" not in blob and b"filler" not in blob and len(blob) < 4000
    assert f'File "{filename}", line 4, in f' in text and "return 1 / x" in text, text


def test_nested_code_keeps_its_file_and_the_pickle_stays_a_cloudpickle(tmp_path):
    import cloudpickle

    path = tmp_path / "nested.py"
    source = "def f(x):\n    def inner(y):\n        return 1 / y\n    return inner(x)\n"
    path.write_text(source)
    fn = _defined_in(source, str(path))
    text = _traceback_elsewhere(fn)
    assert f'File "{path}", line 3, in inner' in text and "return 1 / y" in text, text
    again = cloudpickle.loads(pickling.dumps(fn))
    assert again.__code__.co_filename == str(path) and again(4) == 0.25
    with pytest.raises(ZeroDivisionError):
        again(0)


SCRIPT = """
import time
import taskgraph as tg

def leaf(i):
    time.sleep(0.05)
    raise ValueError(f"bad leaf {{i}}")

def parent(n):
    seen = []
    for f in [tg.spawn(leaf, i) for i in range(n)]:
        try:
            f.result()
        except ValueError as e:
            seen.append((e.rank, e.traceback))
    return seen

cluster = tg.Cluster(n=2)
for attempt in range(5):  # (until the other rank has stolen one)
    with tg.Graph("tb") as g:
        r = tg.task(parent)(8)
    cluster.run(g).wait()
    stolen = [tb for rank, tb in r.result() if rank == 1]
    if stolen:
        break
if cluster.rank == 0:
    print("STOLEN", len(stolen))
    print(stolen[0] if stolen else "")
"""


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_a_stolen_script_call_names_its_file_in_the_traceback(mpirun, tmp_path):
    script = tmp_path / "stolen.py"
    script.write_text(SCRIPT.format())
    proc = mpirun(2, [str(script)], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "STOLEN 0" not in out, out
    assert f'File "{script}", line 7, in leaf' in out, out
    assert 'raise ValueError(f"bad leaf {i}")' in out and "<dynamic-code>" not in out, out
