"""The research notebooks in notebooks/ run end to end (nbclient, CPU) and are stored
without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (ipykernel runs the notebooks)")


def _client(path: Path, timeout_s: int = 300):
    """(notebook, client) for ``path``: a fresh python3 kernel per notebook, cwd notebooks/."""
    nb = nbformat.read(path, as_version=4)
    return nb, nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                       resources={"metadata": {"path": str(path.parent)}})


def _kernel_env() -> dict:
    """The kernel's environment: this process's, with matplotlib's Agg backend."""
    return {**os.environ, "MPLBACKEND": "Agg"}


def execute(path: Path, timeout_s: int = 300):
    """Run every cell of ``path`` in a fresh python3 kernel (cwd: notebooks/, matplotlib Agg).

    Returns the executed notebook; raises nbclient's CellExecutionError on a failing cell.
    """
    nb, client = _client(path, timeout_s)
    client.execute(env=_kernel_env())
    return nb


#: rough seconds each notebook takes alone on a 2-core machine (only orders the runs)
_EXPECTED_S = {"01_quickstart": 11.0, "02_kv_cache_decode": 16.0, "03_sharding_plans": 6.0,
               "04_estimate_vs_measured": 7.0, "05_excess_movement": 4.0}


class NotebookRuns:
    """``execute`` for each of ``paths``, on an event loop in a thread of its own, ``at_once``
    kernels side by side, longest first. Each notebook still runs in its own fresh kernel
    process, so running them side by side, or while other tests run in this process, changes
    nothing they compute. ``result()`` waits for them all."""

    def __init__(self, paths: list[Path], at_once: int, timeout_s: int = 300):
        import asyncio
        import concurrent.futures
        import threading

        self.at_once = at_once
        self._order = sorted(paths, key=lambda p: -_EXPECTED_S.get(p.stem, 0.0))
        self._sem = asyncio.Semaphore(at_once)
        self._loop = asyncio.new_event_loop()
        self._done: concurrent.futures.Future = concurrent.futures.Future()
        self._timeout_s = timeout_s
        threading.Thread(target=self._main, daemon=True, name="test-notebooks").start()

    def _main(self):
        import asyncio

        asyncio.set_event_loop(self._loop)
        try:
            results = self._loop.run_until_complete(self._all())
            self._done.set_result({p.stem: r for p, r in zip(self._order, results)})
        except BaseException as e:  # noqa: BLE001 - raised by result()
            self._done.set_exception(e)
        finally:
            self._loop.close()

    async def _all(self):
        import asyncio
        return await asyncio.gather(*(self._one(p) for p in self._order), return_exceptions=True)

    async def _one(self, path: Path):
        async with self._sem:
            nb, client = _client(path, self._timeout_s)
            await client.async_execute(env=_kernel_env())
            return nb

    def result(self, at_once: int = 2) -> dict:
        """{stem: executed notebook, or the exception its run raised}; the runs not started yet
        run ``at_once`` at a time from now on."""
        for _ in range(max(0, at_once - self.at_once)):
            try:
                self._loop.call_soon_threadsafe(self._sem.release)
            except RuntimeError:   # the loop is closed: every run is done
                break
        self.at_once = max(at_once, self.at_once)
        return self._done.result()


def execute_all(paths: list[Path], at_once: int = 2, timeout_s: int = 300) -> dict:
    """{stem: executed notebook, or the exception its run raised}, ``at_once`` at a time."""
    return NotebookRuns(paths, at_once, timeout_s).result(at_once)


#: the runs conftest.py started in the background when the session began (start_in_background)
_BACKGROUND: list[NotebookRuns] = []


def _selected_notebooks(items) -> list[Path]:
    return [item.callspec.params["path"] for item in items
            if getattr(item, "originalname", None) == "test_notebook_runs"
            and getattr(item, "module", None) is not None and item.module.__name__ == __name__]


def start_in_background(items) -> None:
    """Called by conftest.py's pytest_collection_finish: when tests of other modules run
    before this one's notebooks, start the notebooks now, one kernel at a time, on the core
    the tests in this process leave idle (a notebook kernel is another process; the notebooks
    take ~45 s one by one, ~30 s two at a time when nothing else runs)."""
    wanted = _selected_notebooks(items)
    if not wanted or _BACKGROUND:
        return
    def module_name(item):
        return getattr(getattr(item, "module", None), "__name__", None)

    first = next(i for i, item in enumerate(items) if module_name(item) == __name__)
    if any(module_name(item) != __name__ for item in items[:first]):
        _BACKGROUND.append(NotebookRuns(wanted, at_once=1))


@pytest.fixture(scope="module")
def executed(request):
    """The notebooks whose ``test_notebook_runs`` this session selected: {stem: notebook or
    exception}. Started in the background at the session's start where other tests run
    first (the rest then run two at a time), else run here two at a time."""
    runs = _BACKGROUND[0] if _BACKGROUND else NotebookRuns(_selected_notebooks(request.session.items), at_once=2)
    return runs.result(at_once=2)


def test_there_are_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_quickstart", "02_kv_cache_decode"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, executed):
    nb = executed[path.stem]
    if isinstance(nb, BaseException):   # nbclient's CellExecutionError names the failing cell
        raise nb
    # the first cell says, in plain words, which question the notebook answers
    assert nb.cells[0].cell_type == "markdown" and "question" in nb.cells[0].source.lower()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # no accelerator-plugin start-up noise (a CUDA plugin traceback, libtpu warnings) in the
    # outputs: a notebook imports jaxmove before jax, so jax starts on the CPU here
    from jaxmove._platform import _NOISE
    noise = [o.text[:200] for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if o.output_type == "stream" and _NOISE.search(o.text)]
    assert not noise, noise
