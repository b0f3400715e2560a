"""What the Colab tier's tests share: the published course installed into a rebuilt Colab
runtime (tests/colab_runtime.py), and notebooks run there as a student runs them.

Notebooks run with the runtime's own nbclient and kernel, from a folder inside the published
course (so ``data/`` is found as in a clone of it), with the hub out of reach and the offline
models (``COURSE_MODEL_SOURCE=offline``): what a student on Colab gets from the hub instead is
the one difference. Each run's cells come back as JSON (text, errors).

The tier asks whether every cell runs on Colab's packages, not how well a model learns: the
exercises run at their smallest scale (``COURSE_PROFILE=smoke``, ``TIER_SCALE``: finetune trains on
96 rows instead of 1,200), and so do the book pages whose experiments take long: their ``SCALE``
comes from ``coursekit.book.page_scale``, an eighth of the book's under that profile, and a
conclusion such a page asserts is only printed as a note there (``coursekit.book.check_claim``). The grading of the ``cpu`` profile, accuracy included, is checked by
tests/test_finetune.py and, on Colab's packages, by tests/test_colab_grading.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import nbformat

from colab_runtime import CourseInstall, Snapshot, install_course
from conftest import ROOT, fill_solutions, read_nb

# what a run gives back of each code cell (both scripts below define it)
CELLS = textwrap.dedent("""
    def cells_of(nb, first=0):
        out = []
        for cell in nb.cells[first:]:
            if cell.cell_type != "code":
                continue
            outputs = cell.get("outputs", [])
            text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
            errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]
            out.append({"id": cell.get("id"), "source": cell.source, "text": text[-20000:], "errors": errors})
        return out
""")

RUN = CELLS + textwrap.dedent("""
    import json, sys
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(sys.argv[1], as_version=4)
    try:
        NotebookClient(nb, timeout=1800, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": sys.argv[2]}}).execute()
    finally:
        with open(sys.argv[3], "w") as fh:
            json.dump(cells_of(nb), fh)
""")


def run_cells(python: Path, notebook: Path, env: dict, scratch: Path, timeout: int = 1800) -> list[dict]:
    """Run ``notebook`` (in its own folder, left unchanged) with ``python``'s nbclient and kernel;
    its code cells as {id, source, text, errors}, also when the run stopped half-way."""
    scratch.mkdir(parents=True, exist_ok=True)
    result, script = scratch / f"{notebook.stem}.cells.json", scratch / "run_notebook.py"
    script.write_text(RUN)
    result.unlink(missing_ok=True)
    proc = subprocess.run([str(python), str(script), str(notebook), str(notebook.parent), str(result)],
                          capture_output=True, text=True, env=env, cwd=notebook.parent, timeout=timeout)
    assert result.exists(), f"{notebook.name} did not run with {python}:\n{proc.stderr[-3000:]}"
    return json.loads(result.read_text())


# One kernel for a module's notebooks: a Colab kernel spends 10-25 s importing torch, transformers,
# datasets and peft before a page's first line runs, more than most pages take at the tier's scale.
# The runtime's own nbclient runs each notebook in a kernel kept for the next one; before each, a
# first cell (dropped from the result) resets the user namespace, the input history and the
# execution count (``%reset`` leaves the last two), closes figures and moves to the notebook's folder, so that a notebook finds nothing another left
# but the modules already imported (which is what the tier asks about: does the code run on these
# packages). A notebook that kills its kernel is told as an error and the next one gets a new kernel.
SERVE = CELLS + textwrap.dedent("""
    import json, sys
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    FRESH = ("get_ipython().reset(new_session=True)\\nimport os as _o, matplotlib.pyplot as _p\\n_p.close('all'); _o.chdir({cwd!r})\\n"
             "del _o, _p")
    km = None
    for line in sys.stdin:
        job = json.loads(line)
        nb = nbformat.read(job["notebook"], as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(FRESH.format(cwd=job["cwd"])))
        if km is None or not km.is_alive():
            if km is not None:
                km.cleanup_resources()
            km = KernelManager(kernel_name="python3")
            km.start_kernel(cwd=job["cwd"])
        client = NotebookClient(nb, km=km, timeout=job["timeout"], kernel_name="python3", allow_errors=True)
        died = None
        try:
            client.execute()
        except DeadKernelError as exc:
            died = f"DeadKernelError: {exc}"
        finally:
            if client.kc is not None:
                client.kc.stop_channels()
        out = cells_of(nb, first=1)  # the reset cell is not the notebook's
        if died and out:
            out[-1]["errors"].append(died)
        with open(job["result"], "w") as fh:
            json.dump(out, fh)
        print(job["result"], flush=True)
    if km is not None:
        km.shutdown_kernel(now=True)
""")


class SharedKernel:
    """Notebooks run one after another in one kernel of ``python`` (see SERVE); ``run`` is
    run_cells' contract: the notebook's code cells as {id, source, text, errors}."""

    def __init__(self, python: Path, env: dict, scratch: Path):
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "serve_notebooks.py").write_text(SERVE)
        self.scratch = scratch
        self.proc = subprocess.Popen([str(python), str(scratch / "serve_notebooks.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=(scratch / "serve.log").open("w"),
                                     text=True, env=env, cwd=scratch)

    def run(self, notebook: Path, timeout: int = 1800) -> list[dict]:
        result = self.scratch / f"{notebook.parent.name}-{notebook.stem}.cells.json"
        result.unlink(missing_ok=True)
        job = {"notebook": str(notebook), "cwd": str(notebook.parent), "result": str(result), "timeout": timeout}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        done = self.proc.stdout.readline()
        assert done.strip() == str(result) and result.exists(), \
            f"{notebook.name} did not run:\n{(self.scratch / 'serve.log').read_text()[-3000:]}"
        return json.loads(result.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def publish_course(dest: Path) -> Path:
    from autograder.authoring.publish import publish

    publish(dest, ROOT)
    return dest


def course_in(snap: Snapshot, published: Path) -> CourseInstall:
    return install_course(snap, published)


# The size of the exercises' experiments in the tier: the smallest profile they have.
TIER_SCALE = {"COURSE_PROFILE": "smoke"}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(COURSE_MODEL_SOURCE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg", **TIER_SCALE)
    return env


_KERNELS: dict[tuple[Path, Path], SharedKernel] = {}


def kernel_of(install: CourseInstall) -> SharedKernel:
    """The kernel ``install``'s notebooks share (started at the first notebook)."""
    key = (install.python, install.course)
    if key not in _KERNELS:
        _KERNELS[key] = SharedKernel(install.python, _env(), scratch=install.course / ".tier" / "kernel")
    return _KERNELS[key]


def close_kernel(install: CourseInstall) -> None:
    kernel = _KERNELS.pop((install.python, install.course), None)
    if kernel is not None:
        kernel.close()


def run_notebook(install: CourseInstall, nb, folder: str, name: str) -> list[dict]:
    """Run ``nb`` as ``<published course>/<folder>/<name>`` in the rebuilt runtime, in the kernel
    the install's notebooks share; its cells."""
    where = install.course / folder
    where.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, where / name)
    return kernel_of(install).run(where / name)


def exercise_copy(install: CourseInstall, assignment: str, solved: bool) -> tuple[str, list[dict]]:
    """The published exercise, solved with the reference answers or untouched, run from a copy of
    its own folder; (the hand-in cell's text, every cell)."""
    folder = f"tier-{'solved' if solved else 'untouched'}/{assignment}"
    src = install.course / "exercises" / assignment
    shutil.rmtree(install.course / folder, ignore_errors=True)
    shutil.copytree(src, install.course / folder)
    nb = read_nb(src / f"{assignment}.ipynb")
    if solved:
        nb = fill_solutions(nb, read_nb(ROOT / "solutions" / assignment / f"{assignment}.ipynb"))
    cells = run_notebook(install, nb, folder, f"{assignment}.ipynb")
    (handin,) = [c for c in cells if "handin_report(" in c["source"]]
    return handin["text"] + "".join(handin["errors"]), cells


def pages_meeting_colab_packages(libraries=("transformers", "datasets", "peft"), loaders: bool = True) -> list[str]:
    """Book pages that import one of ``libraries`` (directly, or with ``loaders`` through coursekit's
    data and model loaders): the pages a clash between Colab's packages can break."""
    out = []
    for page in sorted((ROOT / "book").glob("[0-9]*.ipynb")):
        code = "\n".join(c.source for c in read_nb(page).cells if c.cell_type == "code")
        if any(f"import {lib}" in code or f"from {lib}" in code for lib in libraries) \
                or (loaders and ("coursekit.data" in code or "coursekit.models" in code)):
            out.append(page.stem)
    return out
