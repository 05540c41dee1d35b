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


def _agg_backend():
    """Context: MPLBACKEND=Agg for the kernels started inside it (they inherit os.environ)."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        env_backup = os.environ.get("MPLBACKEND")
        os.environ["MPLBACKEND"] = "Agg"
        try:
            yield
        finally:
            if env_backup is None:
                os.environ.pop("MPLBACKEND", None)
            else:
                os.environ["MPLBACKEND"] = env_backup
    return cm()


def execute(path: Path, timeout_s: int = 300):
    """Run every cell of ``path`` in a fresh python3 kernel (cwd: notebooks/, matplotlib Agg).

    Returns the executed notebook; raises nbclient's CellExecutionError on a failing cell.
    """
    nb, client = _client(path, timeout_s)
    with _agg_backend():
        client.execute()
    return nb


def execute_all(paths: list[Path], at_once: int = 2, timeout_s: int = 300) -> dict:
    """``execute`` for each of ``paths``, ``at_once`` kernels side by side (each notebook still
    has its own fresh kernel process, so nothing one computes is seen by another; the machine's
    second core runs one while the first runs another). Longest first.

    Returns {stem: executed notebook, or the exception its run raised}.
    """
    import asyncio

    order = sorted(paths, key=lambda p: -_EXPECTED_S.get(p.stem, 0.0))

    async def one(sem, path):
        async with sem:
            nb, client = _client(path, timeout_s)
            await client.async_execute()
            return nb

    async def run():
        sem = asyncio.Semaphore(at_once)
        return await asyncio.gather(*(one(sem, p) for p in order), return_exceptions=True)

    with _agg_backend():
        results = asyncio.run(run())
    return {p.stem: r for p, r in zip(order, results)}


#: rough seconds each notebook takes alone on a 2-core machine (only orders the runs)
_EXPECTED_S = {"01_quickstart": 11.0, "02_kv_cache_decode": 16.0, "03_sharding_plans": 6.0,
               "04_estimate_vs_measured": 7.0, "05_excess_movement": 4.0}


@pytest.fixture(scope="module")
def executed(request):
    """The notebooks whose ``test_notebook_runs`` this session selected, run two at a time
    (44 s one by one, 30 s two at a time here): {stem: notebook or exception}."""
    wanted = [item.callspec.params["path"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_notebook_runs"
              and item.module is request.module]
    return execute_all(wanted)


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
