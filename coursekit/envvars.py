"""Every ``COURSE_*`` environment variable of the course, in one list: who reads it and why it is a
variable of the environment rather than a setting.

Grading settings are not given through the environment: they are declared in the grader's
settings schema (``autograder/course/schema.py``) and come from ``course.yml`` and the command line.
What remains here is what the notebook side needs (a student's kernel, the grader's kernels, which
get ``course.yml``'s ``env``), what one process hands to a child that a program in between starts
for it (jupyter_client starts the kernel's launcher; only the environment passes through), and the
switches of the tests and scripts.  Code reads a variable through ``get``, which refuses a name
that is not listed; ``tests/test_settings.py`` checks that every ``COURSE_*`` name in the code is
listed here and that the table in docs/GRADING.md is this list (``python -m coursekit.envvars``
prints it).

The grader passes every ``COURSE_*`` variable into the kernels, except those whose name says
KEY, TOKEN, SECRET or PASSWORD and the hand-offs of its own processes
(``autograder/isolation/policy.py``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

NOTEBOOK = "notebook"   # read in a notebook or a kernel (students' and the grader's)
GRADER = "grader"       # read by the grader's own processes
TOOLS = "tools"         # read by the tests and the scripts


@dataclass(frozen=True)
class Variable:
    name: str
    side: str
    readers: tuple[str, ...]    # the files that read it
    why: str                    # what it does, and why the environment carries it


VARIABLES: tuple[Variable, ...] = (
    # the notebook side
    Variable("COURSE_DEVICE", NOTEBOOK, ("coursekit/__init__.py",),
             "the torch device a notebook uses (`cpu` forces the CPU); the grader sets it for each kernel "
             "from the device its sandbox check found"),
    Variable("COURSE_CACHE_DIR", NOTEBOOK, ("coursekit/models.py",),
             "where offline models are built and cached; the grader hands its own cache to its workers' kernels"),
    Variable("COURSE_MODEL_SOURCE", NOTEBOOK, ("coursekit/models.py",),
             "`hub`, `offline` or `auto`: where models come from; course.yml's `env` sets `offline` for grading"),
    Variable("COURSE_PROFILE", NOTEBOOK, ("solutions/finetune/finetune.ipynb",),
             "`cpu` or `full`: the size of the fine-tuning runs; course.yml's `env` sets `cpu` for grading"),
    Variable("COURSE_LLM_BACKEND", NOTEBOOK, ("coursekit/llm/interface.py",),
             "`local`, `openai` or `llamacpp`: the language model behind the lab (docs/LLM_BACKENDS.md)"),
    Variable("COURSE_LLM_PINNED_BACKEND", NOTEBOOK, ("coursekit/llm/interface.py",),
             "a backend no notebook setting overrides; course.yml's `env` pins `local` for grading"),
    Variable("COURSE_LLM_BASE_URL", NOTEBOOK, ("coursekit/llm/interface.py",), "openai backend: the server's address"),
    Variable("COURSE_LLM_MODEL", NOTEBOOK, ("coursekit/llm/interface.py",),
             "openai: the model's name on the server; llamacpp: the .gguf file"),
    Variable("COURSE_LLM_KIND", NOTEBOOK, ("coursekit/llm/interface.py",), "`chat` or `text`: how prompts are sent"),
    Variable("COURSE_LLM_TIMEOUT", NOTEBOOK, ("coursekit/llm/interface.py",), "seconds for one whole answer of a server"),
    Variable("COURSE_LLM_MAX_REPLY_MB", NOTEBOOK, ("coursekit/llm/interface.py",), "the largest reply read from a server, in MiB"),
    Variable("COURSE_LLM_PRICE", NOTEBOOK, ("coursekit/llm/interface.py",),
             "USD per million input and output tokens, for the cost the lab prints"),
    Variable("COURSE_LLM_API_KEY", NOTEBOOK, ("coursekit/llm/keys.py",),
             "the key for a server other than OpenAI's; a secret: never passed into a kernel"),
    Variable("COURSE_MATHJAX_DIR", TOOLS, ("coursekit/sphinx_book.py",),
             "another copy of MathJax's es5 folder for the book's build"),
    # the grader's hand-offs between its processes
    Variable("COURSE_SCRATCH", GRADER, ("autograder/isolation/scratch.py",),
             "the run's scratch folder, handed to its worker processes (removed when the run ends)"),
    Variable("COURSE_GRADER_PID", GRADER, ("autograder/judge/worker.py",),
             "the grade process a worker dies with (set by autograder/backends/local.py)"),
    Variable("COURSE_SANDBOX_WORKDIR", GRADER, ("autograder/isolation/sandbox.py",),
             "the kernel's working folder, for its launcher, which jupyter_client starts from the kernelspec"),
    Variable("COURSE_SANDBOX_COPY", GRADER, ("autograder/isolation/sandbox.py",),
             "the submission the kernel's launcher copies into the sandbox (set by autograder/judge/kernel.py)"),
    Variable("COURSE_SANDBOX_ZYGOTE", GRADER, ("autograder/isolation/sandbox.py",),
             "the zygote's socket the kernel's launcher asks for a kernel (set by autograder/judge/execute.py)"),
    Variable("COURSE_SANDBOX_READONLY", GRADER, ("autograder/isolation/policy.py",),
             "folders of this machine a kernel may read besides the course's (packages installed elsewhere): "
             "a fact of the machine, not of the course"),
    Variable("COURSE_KEEP_WORKERS", GRADER, ("autograder/pipeline/run.py",),
             "keep a run's folder after it ends, to debug the grader"),
    Variable("COURSE_FAULT", GRADER, ("autograder/records/faults.py",),
             "`<step>:kill` or `<step>:enospc`: the tests' injected kill or full disk at a write point"),
    # the tests and the scripts
    Variable("COURSE_TEST_WORKERS", TOOLS, ("scripts/test.sh",), "pytest workers of the suite (0: one process)"),
    Variable("COURSE_TEST_RELEASES", TOOLS, ("tests/conftest.py",),
             "set by the tests: the session's folder of releases that runs with the fake backend copy"),
    Variable("COURSE_VENV", TOOLS, ("scripts/env.sh",), "where scripts/env.sh makes the virtual environment"),
    Variable("COURSE_LLAMACPP", TOOLS, ("scripts/env.sh",), "`1`: scripts/env.sh installs llama-cpp-python too"),
    Variable("COURSE_AG_NEWS_POOL", TOOLS, ("scripts/make_ag_news_subsets.py", "tests/test_data.py"),
             "the AG News pool the data subsets are drawn from"),
    Variable("COURSE_STRESS_PAIRS", TOOLS, ("tests/test_record_writer.py",),
             "concurrent grade pairs per database in the writer-lock test"),
    Variable("COURSE_SCREENSHOTS", TOOLS, ("tests/test_book_browser.py",),
             "`1`/`0`: the browser test writes (or not) each page's screenshots; default: written, not under CI"),
    Variable("COURSE_AXE_JS", TOOLS, ("tests/test_book_browser.py",), "another copy of axe-core's axe.min.js"),
    Variable("COURSE_PLANTED", TOOLS, ("tests/test_isolation.py",),
             "planted by one submission's kernel: the next kernel must not see it"),
    Variable("COURSE_PROBE_TEST", TOOLS, ("tests/test_sandbox.py",),
             "a changed environment: the sandbox probe must run again"),
    Variable("COURSE_ROOT", TOOLS, ("tests/tamper_corpus.py",),
             "looked for by a hostile submission of the tamper corpus: no kernel may find the checkout by it"),
)

BY_NAME = {v.name: v for v in VARIABLES}


def get(name: str, default: str | None = None) -> str | None:
    """The value of the listed variable ``name`` in this process's environment, else ``default``."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not a listed variable of the course (coursekit/envvars.py)")
    return os.environ.get(name, default)


def table() -> str:
    """The list as a markdown table (docs/GRADING.md holds it)."""
    rows = ["| variable | read by | side | what it does, and why a variable |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {', '.join(f'`{r}`' for r in v.readers)} | {v.side} | {v.why} |" for v in VARIABLES]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
