"""Publish the student course: ``python -m autograder publish DIR``.

This repository is the instructor's (solutions, hidden tests, mark schemes, the grader):
keep it private.  ``publish`` writes, into ``DIR``, what students and readers may see: the
book, the released exercises, the ``coursekit`` package (with the self-check specs, which hold
visible tests and the one-line descriptions of hidden tests only), the course data, the book's
configuration, and a student README, requirements, package metadata, scripts and tests.
Every link points at the student repository of ``course.yml``.  Push ``DIR`` to that
repository.

Before writing, it checks that the released exercises and every generated link match the
course file, and that every file under ``exercises/`` and ``book/`` is one it can prove clean:
the released notebook of each assignment of course.yml, the pages of ``_toc.yml``, the
bibliography of ``_config.yml`` and the book's templates and style sheets in the folders it names
(``templates_path``, ``html_static_path``: small, and no notebook rendered as HTML), each a
notebook without outputs, attachments or grading markers (or a text file).  Anything else there (an HTML, PDF or ``.py`` export of a solution, a
draft, a link) stops it with one line naming the file, since a rendered export need not hold
one line of the solution intact; so does a file under ``data/`` that ``data/MANIFEST`` does not
list with its sha256.  After writing, it proves every file it wrote: UTF-8 text (a binary or an
archive only as a data file listed in ``data/MANIFEST``), scanned, every string of a notebook or
JSON file included (metadata, outputs, attachments), for a line of a hidden test or a mark
scheme, three lines of a solution, or a run of ``RUN`` normalised tokens of one (``tokenize``;
comments, layout and names do not matter), and it refuses the result if it finds one.  The same
holds for the worked solutions of the book's exercises (``instructor/exercises/``: a line of a
solution page, a run of its code, a ``{solution}`` directive), and for the answer of every compute
exercise (``answers.json``) in any form a student might search for (``answer_forms``: digits,
rounded, scientific).
"""
from __future__ import annotations

import ast
import base64
import builtins
import functools
import hashlib
import json
import keyword
import re
import shutil
import tempfile
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

from autograder import ROOT, SOURCE_DIR
from autograder.course.model import Course, load

from .stamp import check, readme_table

COPIED = ["book", "exercises", "coursekit", "data", "_config.yml", "_toc.yml", "scripts/env.sh", "scripts/build.sh",
          "tests/book_cache.py"]
_INSTRUCTOR_ONLY = re.compile(r"# >>> instructor only.*?# <<< instructor only\n", re.S)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "_build", "*.egg-info")
# student package: coursekit only, with ranges wide enough for what Colab ships
STUDENT_DEPENDENCIES = ["torch>=2.4", "transformers>=4.56", "datasets>=3.0", "safetensors>=0.4.3",
                        "numpy>=2.0", "matplotlib>=3.9", "tqdm>=4.66.3"]
# what the student tree does not need from requirements.txt (the grader and its tools)
NOT_FOR_STUDENTS = {"nbgrader", "sqlalchemy", "pyyaml", "distributed", "dask-jobqueue", "psycopg",
                    "pytest-xdist", "nh3", "defusedcsv", "latex2mathml", "fastapi", "uvicorn", "import-linter"}

_SOLUTION = re.compile(r"### BEGIN SOLUTION(.*?)### END SOLUTION", re.S)
# the exercises' worked solutions and answers (autograder/authoring/instructor_book.py): never published
EXERCISE_SOLUTIONS = Path("instructor") / "exercises"
EXERCISE_ANSWERS = EXERCISE_SOLUTIONS / "answers.json"
_DIRECTIVE_LINE = re.compile(r"^(`{3,}|:{3,})(\{[\w-]+\}.*)?$|^:[\w-]+:")  # a fence, or a directive's option
_SOLUTION_DIRECTIVE = re.compile(r"(`{3,}|:{3,})\{solution(-start)?\}|\.\. solution::")
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", re.S)


class PublishError(RuntimeError):
    pass


@dataclass
class Secrets:
    """What must not reach students: every line of a hidden test or a mark scheme (they are
    distinctive), every run of three consecutive lines of a solution, and every run of ``RUN``
    tokens of a solution, normalised (``tokenize``: comments, whitespace and
    indentation gone; names renamed consistently within the run), so that a reformatted copy is
    caught too.  Single lines such as ``loss.backward()`` also appear, rightly, in the book, and
    runs that the released notebooks show (given code) are not secret."""

    lines: set[str]
    windows: set[tuple[str, ...]]
    runs: set[tuple[str, ...]] = field(default_factory=set)
    shapes: set[tuple[str, ...]] = field(default_factory=set)  # the runs with every name as "$" (a fast filter)


WINDOW = 3
# tokens: about three lines of code.  The book and coursekit rightly share shorter runs with solutions
# (the sinusoidal table of 03_positional_encoding: 31 tokens; the causal mask of coursekit/gpt/modern.py:
# 35 tokens, names renamed); none this long.
RUN = 40
RUN_FIXED = 12    # tokens of a run that are not renamed names (operators, keywords, attributes, literals)


def _norm(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
_KEPT_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))


@dataclass
class _Tokens:
    text: list[str]     # each token, normalised
    line: list[int]     # its line (1-based) in the text
    named: list[bool]   # a name that is renamed (not a keyword, builtin or attribute)


@functools.lru_cache(maxsize=4096)  # a course's files are read again by each proof of a tree: read once
def _tokens(text: str) -> _Tokens:
    """Python's tokens of ``text``, without comments, line breaks and indentation; any text is
    accepted (prose, CSV): where ``tokenize`` gives up, it starts again on the next line.  The
    result is shared between callers: read it, never change it."""
    lines = text.splitlines(keepends=True)
    out = _Tokens([], [], [])
    start = 0
    while start < len(lines):
        feed = iter(lines[start:])
        try:
            for tok in tokenize.generate_tokens(lambda: next(feed, "")):
                if tok.type in _SKIPPED or (tok.type == tokenize.ERRORTOKEN and not tok.string.strip()):
                    continue
                s = tok.string
                if tok.type == tokenize.STRING:
                    try:
                        s = repr(ast.literal_eval(s))   # 'a' and "a" alike
                    except (ValueError, SyntaxError, MemoryError, RecursionError):
                        pass
                named = tok.type == tokenize.NAME and s not in _KEPT_NAMES and not (out.text and out.text[-1] == ".")
                out.text.append(s)
                out.line.append(start + tok.start[0])
                out.named.append(named)
            break
        except (tokenize.TokenError, SyntaxError):
            start = max(out.line[-1] if out.line else start, start + 1)  # the line after the last token read
    return out


def _shape(toks: _Tokens) -> list[str]:
    return ["$" if n else t for t, n in zip(toks.text, toks.named)]


def _canonical(toks: _Tokens, i: int) -> tuple[str, ...] | None:
    """The run of RUN tokens from ``i``, names renamed in order of appearance (None when the run
    is mostly names: prose, not code)."""
    names: dict[str, str] = {}
    out = []
    for t, n in zip(toks.text[i:i + RUN], toks.named[i:i + RUN]):
        out.append(names.setdefault(t, f"${len(names)}") if n else t)
    return tuple(out) if RUN - len(names) >= RUN_FIXED and len(out) == RUN else None


def _runs(text: str) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    toks = _tokens(text)
    shape = _shape(toks)
    runs, shapes = set(), set()
    for i in range(len(toks.text) - RUN + 1):
        run = _canonical(toks, i)
        if run is not None:
            runs.add(run)
            shapes.add(tuple(shape[i:i + RUN]))
    return runs, shapes


def secrets(root: Path = ROOT, min_len: int = 12) -> Secrets:
    lines, public, windows = set(), set(), set()
    runs, shapes, public_runs = set(), set(), set()
    for path in sorted((root / SOURCE_DIR).glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            src = cell.source
            meta = cell.metadata.get("nbgrader", {})
            hidden = _HIDDEN.findall(src)
            whole = meta.get("solution") and not _SOLUTION.search(src)
            code = cell.cell_type == "code"
            if whole:
                hidden.append(src)  # a whole-cell answer: a mark scheme
            for region in hidden:
                lines.update(ln for ln in _norm(region) if len(ln) >= min_len)
            for region in _SOLUTION.findall(src):
                code_lines = [ln for ln in _norm(region) if not ln.startswith("#")]
                windows.update(tuple(code_lines[i:i + WINDOW]) for i in range(len(code_lines) - WINDOW + 1))
                if code:
                    found = _runs(region)
                    runs |= found[0]
                    shapes |= found[1]
            if not whole:
                given = _HIDDEN.sub("", _SOLUTION.sub("", src))
                public.update(_norm(given))
                if code:
                    public_runs |= _runs(given)[0]
    # the worked solutions of the book's exercises (instructor/exercises/): every line of prose or
    # code that is not a directive, and every run of tokens of their code
    for path in sorted((root / EXERCISE_SOLUTIONS).glob("*.md")):
        lines.update(ln for ln in _norm(path.read_text(encoding="utf-8"))
                     if len(ln) >= min_len and not _DIRECTIVE_LINE.match(ln))
    for path in sorted((root / EXERCISE_SOLUTIONS).glob("*.py")):
        text = path.read_text(encoding="utf-8")
        code_lines = [ln for ln in _norm(text) if not ln.startswith("#")]
        windows.update(tuple(code_lines[i:i + WINDOW]) for i in range(len(code_lines) - WINDOW + 1))
        found = _runs(text)
        runs |= found[0]
        shapes |= found[1]
    return Secrets(lines - public, windows, runs - public_runs, shapes)


def _strings(value) -> Iterator[str]:
    """Every string of a JSON value; a list of strings also as one text (a notebook keeps a
    multi-line text as a list of lines); a string in base64 also decoded, when that is text."""
    if isinstance(value, str):
        yield value
        if len(value) >= 16 and _BASE64.fullmatch(value.replace("\n", "")):
            try:
                yield base64.b64decode(value, validate=False).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                pass
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        if value and all(isinstance(v, str) for v in value) and all(v.endswith("\n") for v in value[:-1]):
            yield from _strings("".join(value))  # the lines of one text
        else:
            if len(value) > 1 and all(isinstance(v, str) for v in value):
                yield "\n".join(value)  # lines kept without their line breaks
            for v in value:
                yield from _strings(v)


_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def _texts(path: Path, text: str) -> list[str]:
    """The texts of a file to scan: the file itself, and for a notebook or a JSON file every
    string it holds (sources, outputs, metadata, attachments: all of them alike)."""
    texts = [text]
    if path.suffix in (".ipynb", ".json"):
        try:
            texts += list(_strings(json.loads(text)))
        except ValueError:  # not JSON after all
            pass
    return texts


def _file_lines(path: Path, text: str) -> list[list[str]]:
    """The file's lines (for a notebook or JSON file: each string's), normalised, in runs to scan."""
    return [_norm(t) for t in _texts(path, text)]


def _near_copies(text: str, found_secrets: Secrets) -> list[str]:
    """The lines of ``text`` holding a run of tokens of a solution or a hidden test, one entry
    per stretch of overlapping runs."""
    if not found_secrets.runs or len(text) < RUN:  # a token is one character or more
        return []
    toks = _tokens(text)
    shape = _shape(toks)
    hits: list[list[int]] = []
    for i in range(len(toks.text) - RUN + 1):
        if tuple(shape[i:i + RUN]) in found_secrets.shapes and _canonical(toks, i) in found_secrets.runs:
            first, last = toks.line[i], toks.line[i + RUN - 1]
            if hits and first <= hits[-1][1]:
                hits[-1][1] = max(hits[-1][1], last)
            else:
                hits.append([first, last])
    lines = text.splitlines()
    return [" / ".join(_norm("\n".join(lines[a - 1:b]))) for a, b in hits]


def _text_pieces(tree: Path):
    """(path relative to ``tree``, text, whether it is a JSON file's raw text) for every text file
    of ``tree`` (outside .venv and .git); of a notebook or a JSON file, also every string it holds,
    metadata and attachments included."""
    for path in sorted(p for p in Path(tree).rglob("*") if p.is_file()):
        if any(part in (".venv", ".git") for part in path.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(tree)
        for piece in _texts(path, text):
            yield rel, piece, piece is text and path.suffix in (".ipynb", ".json")


def leaks(tree: Path, found_secrets: Secrets) -> list[str]:
    """'file: line' for every secret found in a text file of ``tree`` (in a notebook or a JSON
    file: in any string it holds, metadata and attachments included)."""
    found = []
    for rel, piece, raw_json in _text_pieces(tree):
        run = _norm(piece)
        for line in sorted(found_secrets.lines & set(run)):
            found.append(f"{rel}: {line}")
        code = [ln for ln in run if not ln.startswith("#")]
        for i in range(len(code) - WINDOW + 1):
            if tuple(code[i:i + WINDOW]) in found_secrets.windows:
                found.append(f"{rel}: " + " / ".join(code[i:i + WINDOW]))
        if not raw_json:  # of the raw JSON, its strings are read
            found += [f"{rel}: {stretch}" for stretch in _near_copies(piece, found_secrets)]
    return sorted(set(found))


def exercise_answers(root: Path = ROOT) -> dict[str, float]:
    """The answers of the book's compute exercises (instructor/exercises/answers.json, which
    tests/test_exercises.py checks against the worked solutions)."""
    path = Path(root) / EXERCISE_ANSWERS
    if not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def _significant(form: str) -> int:
    mantissa = re.split(r"[eE]", form)[0]
    return len(re.sub(r"[^0-9]", "", mantissa).lstrip("0"))


def answer_forms(value: float, min_digits: int = 3) -> set[str]:
    """How an answer may be written where a student could search for it: its digits (plain and
    with thousands separators), rounded to 1-6 decimals and to 2-8 significant digits, and in
    scientific notation (``2.89e9``, ``2.89e+09``, ``2.89E+09``), and for a large number its
    mantissa in thousands, millions, billions or trillions (``2.89`` billion); a negative answer also
    without its sign.  Forms of fewer
    than ``min_digits`` significant digits (``2``, ``1.8``) are left out: they occur everywhere."""
    forms = {repr(value), f"{value:g}"}
    if float(value).is_integer():
        forms |= {str(int(value)), f"{int(value):,}"}
    for k in range(0, 7):
        forms |= {f"{value:.{k}f}", f"{value:,.{k}f}"}
    for k in range(2, 9):
        forms.add(f"{value:.{k}g}")
    for k in range(1, 5):
        e = f"{value:.{k}e}"
        mantissa, exp = e.split("e")
        n = int(exp)
        forms |= {e, e.upper(), f"{mantissa}e{n}", f"{mantissa}E{n}", f"{mantissa}e+{n}" if n >= 0 else e}
    for power in (3, 6, 9, 12):
        if abs(value) >= 10 ** power:
            forms |= {f"{value / 10 ** power:.{k}f}" for k in range(1, 4)}
    if value < 0:  # a student may search without the sign
        forms |= answer_forms(-value, min_digits)
    return {f for f in forms if _significant(f) >= min_digits}


def answers_found(tree: Path, answers: dict[str, float]) -> list[str]:
    """'file: exercise N's answer as FORM' for every answer of a compute exercise, in any form of
    ``answer_forms``, in a text file of ``tree`` (a number, not part of a longer one or of a word)."""
    patterns = {name: re.compile(r"(?<![\w.])(" + "|".join(re.escape(f) for f in sorted(answer_forms(v), key=len,
                                                                                          reverse=True))
                                 + r")(?![\w]|\.\d)") for name, v in answers.items()}
    # one pass for any form at all (most files hold none), then each answer's own pattern
    anywhere = re.compile("|".join(re.escape(f) for v in answers.values() for f in answer_forms(v)) or r"(?!)")
    found = []
    for rel, piece, _ in _text_pieces(tree):
        if not anywhere.search(piece):
            continue
        for name, pattern in patterns.items():
            m = pattern.search(piece)
            if m:
                found.append(f"{rel}: exercise {name}'s answer as {m.group(1)}")
    return sorted(set(found))


def solutions_found(tree: Path) -> list[str]:
    """'file: ...' for every {solution} directive in a text file of ``tree``."""
    found = []
    for path in sorted(p for p in Path(tree).rglob("*") if p.is_file()):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for piece in _texts(path, text):
            m = _SOLUTION_DIRECTIVE.search(piece)
            if m:
                found.append(f"{path.relative_to(tree)}: a solution directive ({m.group(0)})")
    return sorted(set(found))


PROVABLE_DIRS = ("exercises", "book")
_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN MARK SCHEME",
            "Mark scheme (graders only)", "{solution}", "{solution-start}")


def _ignored(rel: Path) -> bool:
    """What publish never copies (caches and build folders), so need not prove clean."""
    return any(part in ("__pycache__", ".ipynb_checkpoints", "_build") or part.endswith((".pyc", ".egg-info"))
               for part in rel.parts)


def publishable(root: Path, course: Course) -> set[str]:
    """The files of exercises/ and book/ publish may write: each assignment's released
    notebook, the pages of _toc.yml, the bibliography of _config.yml and the book's theme files."""
    allowed = {f"exercises/{a.id}/{a.notebook}" for a in course.assignments}

    def pages(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("file", "root") and isinstance(value, str):
                    yield value
                else:
                    yield from pages(value)
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)

    for name in ("_toc.yml", "_config.yml"):
        path = root / name
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
        if name == "_toc.yml":
            for page in pages(data):
                allowed.update(f"{page}{suffix}" for suffix in (".ipynb", ".md") if (root / f"{page}{suffix}").exists())
        else:
            allowed.update(str(f) for f in (data or {}).get("bibtex_bibfiles", []))
            allowed.update(theme_files(root, data or {}))
    return {a for a in allowed if a.split("/")[0] in PROVABLE_DIRS}


THEME_SUFFIXES = (".html", ".css", ".js")
THEME_MAX_BYTES = 32 * 1024   # a template or a style sheet; an nbconvert HTML export is ~300 KiB


def theme_files(root: Path, config: dict) -> set[str]:
    """The book's own templates and static files: what lies in the folders _config.yml names as
    Sphinx's ``templates_path`` and ``html_static_path`` (small text files; see ``_not_clean``)."""
    sphinx = (config.get("sphinx") or {}).get("config") or {}
    out = set()
    for key in ("templates_path", "html_static_path"):
        for folder in sphinx.get(key) or []:
            base = root / str(folder)
            if base.is_dir() and not base.is_symlink():
                out.update(f.relative_to(root).as_posix() for f in base.rglob("*")
                           if f.is_file() and f.suffix in THEME_SUFFIXES)
    return out


DATA_MANIFEST = "data/MANIFEST"
_ARCHIVE_MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"7z\xbc\xaf\x27\x1c",
                  b"\x28\xb5\x2f\xfd", b"Rar!", b"%PDF")


def data_manifest(root: Path = ROOT) -> dict[str, str]:
    """data/MANIFEST: ``<sha256>  <path under data/>`` a line (``sha256sum``'s format; ``#`` starts a
    comment).  Every file under data/ is listed there, so that publish writes no data file, binary
    or text, that nobody looked at (a zip of the solutions, say)."""
    path = root / DATA_MANIFEST
    out = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                digest, _, name = line.strip().partition(" ")
                out[name.strip().lstrip("*")] = digest.lower()
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def binary(data: bytes) -> str:
    """Why these bytes are not a text file publish can scan ("" when they are one)."""
    if data.startswith(_ARCHIVE_MAGIC) or (len(data) > 262 and data[257:262] == b"ustar"):
        return "an archive or a compressed file"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "a binary file (not UTF-8 text)"
    if "\x00" in text:
        return "a binary file (it holds NUL bytes)"
    return ""


def unlisted_data(root: Path = ROOT) -> list[str]:
    """One line for every file under data/ that data/MANIFEST does not list with its sha256."""
    listed = data_manifest(root)
    out, seen = [], set()
    base = root / "data"
    for path in sorted(base.rglob("*")) if base.is_dir() else []:
        rel = path.relative_to(base).as_posix()
        if _ignored(path.relative_to(root)) or rel == "MANIFEST" or (path.is_dir() and not path.is_symlink()):
            continue
        seen.add(rel)
        if path.is_symlink():
            out.append(f"data/{rel}: a link; publish copies only files it can read and prove clean")
        elif rel not in listed:
            kind = binary(path.read_bytes()) or "a data file"
            out.append(f"data/{rel}: {kind}, not listed in {DATA_MANIFEST}; list it there with its sha256 "
                       f"(`cd data && sha256sum {rel} >> MANIFEST`) once you know it holds no solution, or move "
                       f"it out of data/")
        elif _sha256(path) != listed[rel]:
            out.append(f"data/{rel}: its sha256 is {_sha256(path)}, {DATA_MANIFEST} lists {listed[rel]}; check the "
                       f"file, then update its line")
    out += [f"{DATA_MANIFEST}: lists {rel}, which is not in data/" for rel in sorted(set(listed) - seen)]
    return out


def unproven_written(tree: Path, root: Path = ROOT) -> list[str]:
    """One line for every file of the written student course that is not UTF-8 text publish can
    scan, except the data files data/MANIFEST lists with their sha256."""
    listed = data_manifest(root)
    out = []
    for path in sorted(p for p in Path(tree).rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(tree).as_posix()
        if path.is_symlink():
            out.append(f"{rel}: a link")
            continue
        data = path.read_bytes()
        if rel.startswith("data/") and listed.get(rel[len("data/"):]) == hashlib.sha256(data).hexdigest():
            continue  # listed data, checked byte for byte (and scanned below when it is text)
        if why := binary(data):
            out.append(f"{rel}: {why}; publish writes a binary or an archive only under data/, listed in "
                       f"{DATA_MANIFEST} with its sha256")
    return out


def unproven(root: Path = ROOT, course: Course | None = None) -> list[str]:
    """One line for every file under exercises/ and book/ that publish cannot prove clean."""
    course = course or load(root)
    allowed = publishable(root, course)
    out = []
    for top in PROVABLE_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if _ignored(rel) or (path.is_dir() and not path.is_symlink()):
                continue
            name = rel.as_posix()
            if path.is_symlink():
                out.append(f"{name}: a link; publish copies only files it can read and prove clean")
            elif name not in allowed:
                out.append(f"{name}: not a file publish can prove clean (it publishes the released notebooks of "
                           f"course.yml, the pages of _toc.yml, the bibliography and theme folders of _config.yml); move it "
                           f"out of {top}/")
            elif why := _not_clean(path):
                out.append(f"{name}: {why}")
    return out + unlisted_data(root)


def _not_clean(path: Path) -> str:
    """Why an allowed file is not provably clean ("" when it is)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        return f"cannot be read as text ({type(exc).__name__})"
    marker = next((m for m in _MARKERS if m in text), None)
    if marker:
        return f"holds the grading marker {marker!r}"
    if path.suffix in THEME_SUFFIXES:
        # a theme file is a few lines of markup or style, never a rendered notebook
        if len(text.encode()) > THEME_MAX_BYTES:
            return f"larger than a template or style sheet ({len(text.encode()) >> 10} KiB; at most " \
                   f"{THEME_MAX_BYTES >> 10} KiB)"
        if any(cls in text for cls in ("jp-Notebook", "jp-Cell", "jp-InputArea", "nbconvert")):
            return "looks like a rendered notebook (nbconvert's markup), not a template"
        return ""
    if path.suffix != ".ipynb":
        return ""
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - anything unreadable is unproven
        return f"is not a readable notebook ({type(exc).__name__})"
    for i, cell in enumerate(nb.cells, start=1):
        if cell.get("outputs"):
            return f"cell {i} has outputs (committed notebooks carry none; a rendered output can hide anything)"
        if cell.get("attachments"):
            return f"cell {i} has attachments"
    return ""


def student_readme(course: Course) -> str:
    repo = course.student_repo
    return textwrap.dedent(f"""\
        # {course.title}

        An open course on Transformers: a [Jupyter Book](https://jupyterbook.org) whose chapters are
        executable notebooks, and exercises that check themselves. Everything runs offline on a
        two-core CPU; on Google Colab, each notebook installs only what the runtime lacks.

        ## Two commands

        On a fresh Linux machine with Python 3.11 or newer and access to the Python package index:

        ```bash
        bash scripts/build.sh
        ```

        creates `.venv/`, installs `requirements.txt`, and builds the book with executed pages into
        `_build/html/` (open `_build/html/index.html`).

        ```bash
        bash scripts/test.sh
        ```

        runs the tests (it sets up `.venv/` first if needed): every book page executed with nbval,
        and checks of the exercises.

        ## Exercises

        <!-- assignments:start -->
        {{table}}
        <!-- assignments:end -->

        Open an exercise from its badge, work on a copy (*File → Save a copy in Drive*), run
        `check("q1")` in any cell to re-run the visible tests of a question, then *File → Download →
        Download .ipynb* and hand the file in where your course collects it. Hidden tests run when
        your instructor grades the notebook; each says in one line what it checks.

        ## Layout

        | path | what it is |
        |---|---|
        | `book/` | the book's pages |
        | `exercises/` | the exercises, one notebook each |
        | `coursekit/` | the small package the notebooks import (`pip install git+{repo.url}`) |
        | `data/` | the small datasets of the course, with attribution (see `data/README.md`) |
        """).replace("{table}", readme_table(course))


def student_pyproject(course: Course, root: Path = ROOT) -> str:
    deps = ", ".join(f'"{d}"' for d in STUDENT_DEPENDENCIES)
    # coursekit and every package inside it (coursekit.checks holds data only)
    found = sorted(".".join(p.parent.relative_to(root).parts) for p in (root / "coursekit").rglob("__init__.py")
                   if "__pycache__" not in p.parts)
    packages = ", ".join(f'"{name}"' for name in ["coursekit", "coursekit.checks", *[n for n in found if n != "coursekit"]])
    return textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "transformers-course"
        version = "0.1.0"
        description = "{course.title}: the package the book and the exercises import"
        requires-python = ">=3.10"
        # Ranges, not pins: on Colab the runtime's own versions are kept and nothing is installed
        # when they fit (tests/test_compat.py in the instructor repository checks the lower ends).
        dependencies = [{deps}]

        [project.entry-points."myst_nb.renderers"]
        # the book's figures: alt text and caption (coursekit/sphinx_book.py)
        course = "coursekit.sphinx_book:FigureRenderer"

        [tool.setuptools]
        packages = [{packages}]

        [tool.setuptools.package-data]
        "coursekit.checks" = ["*.json"]

        [tool.pytest.ini_options]
        testpaths = ["book", "tests"]
        addopts = "-p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=900"
        """)


def student_requirements(root: Path) -> str:
    out = ["# Pinned so that the book builds the same way everywhere (see README)."]
    for line in (root / "requirements.txt").read_text().splitlines():
        name = re.split(r"[\s\[=<>!~;#]", line.strip(), maxsplit=1)[0].lower()
        if line.strip().startswith("#") or not line.strip() or name in NOT_FOR_STUDENTS:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


STUDENT_TEST = '''\
"""The published course: links to this repository, exercises as released, nothing of the grader."""
from __future__ import annotations

import json
from pathlib import Path

from coursekit._course import REPO
from coursekit.selfcheck import load_spec

ROOT = Path(__file__).resolve().parents[1]  # tests/ -> the course


def test_every_notebook_installs_coursekit_from_this_repository():
    paths = sorted(ROOT.glob("book/*.ipynb")) + sorted(ROOT.glob("exercises/*/*.ipynb"))
    assert paths, ROOT
    for path in paths:
        setup = next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert f"git+https://github.com/{REPO}@" in "".join(setup["source"]), path


def test_exercises_are_released_and_clean():
    paths = sorted(ROOT.glob("exercises/*/*.ipynb"))
    assert paths, ROOT
    for path in paths:
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "Mark scheme (graders only)"):
            assert marker not in text, (path, marker)
        for cell in json.loads(text)["cells"]:
            assert not cell.get("outputs"), path


def test_self_checks_cover_every_exercise():
    for folder in sorted(p for p in (ROOT / "exercises").iterdir() if p.is_dir()):
        spec = load_spec(folder.name)
        assert spec["tests"] and all(t["hidden"] or t["source"] for t in spec["tests"])
'''

STUDENT_CONFTEST = '''\
"""Book pages run once: nbval's run of each page goes into the book's execution cache."""
from book_cache import register


def pytest_configure(config):
    register(config)
'''

STUDENT_TEST_SH = '''\
#!/usr/bin/env bash
# Set up what is needed, then run the tests (book pages with nbval, checks of the exercises).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m pytest -ra --durations=10 "$@"
'''

GITIGNORE = ".venv/\n__pycache__/\n*.pyc\n*.egg-info/\n_build/\n.ipynb_checkpoints/\n.jupyter_cache/\n"


MANIFEST = ".course-published"  # in the student repository: the files publish wrote there


def publish(dest: Path, root: Path = ROOT, course: Course | None = None) -> list[Path]:
    """Write the student course into ``dest``: a new or empty folder, a fresh clone of the
    student repository (its ``.git`` stays), or a student repository published before, which is
    brought up to date (files no longer published are removed; files publish never wrote are
    left alone).  Everything is written and checked for leaks in a folder of its own first.
    Returns the files of the course."""
    course = course or load(root)
    dest = Path(dest)
    present = sorted(p.name for p in dest.iterdir() if p.name != ".git") if dest.is_dir() else []
    if present and not (dest / MANIFEST).exists():
        raise PublishError(f"{dest} is not empty and holds files publish did not write ({', '.join(present[:5])}): "
                           "publish into an empty folder, a fresh clone of the student repository, or one it "
                           "published before")
    stale = check(root)
    if stale:
        raise PublishError("these files do not match course.yml; run `python -m autograder release` first: "
                           + ", ".join(str(p.relative_to(root)) for p in stale))
    refused = unproven(root, course)
    if refused:
        raise PublishError(f"cannot prove {len(refused)} file(s) clean:\n" + "\n".join(refused[:20]))
    with tempfile.TemporaryDirectory(prefix="publish-") as tmp:
        stage = Path(tmp) / "course"
        _write_course(stage, root, course)
        written = unproven_written(stage, root)
        if written:
            raise PublishError(f"cannot prove {len(written)} written file(s) clean:\n" + "\n".join(written[:20]))
        found = leaks(stage, secrets(root)) + solutions_found(stage)
        if found:
            raise PublishError("the student course would show solutions or hidden tests:\n" + "\n".join(found[:20]))
        found = answers_found(stage, exercise_answers(root))
        if found:
            raise PublishError("the student course would show the answer of a compute exercise (its self-check "
                               "holds only a salted hash):\n" + "\n".join(found[:20]))
        new = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        old = set((dest / MANIFEST).read_text().split("\n")) - {""} if (dest / MANIFEST).exists() else set()
        dest.mkdir(parents=True, exist_ok=True)
        for rel in sorted(old - set(new)):  # published before, not any more
            target = dest / rel
            if target.is_file() or target.is_symlink():
                target.unlink()
            for parent in target.parents:
                if parent == dest or not parent.is_dir() or any(parent.iterdir()):
                    break
                parent.rmdir()
        for rel in new:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(stage / rel, dest / rel)
    (dest / MANIFEST).write_text("\n".join(new) + "\n")
    return sorted(dest / rel for rel in new)


def _write_course(dest: Path, root: Path, course: Course) -> None:
    """The student course, written into the new folder ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = root / name
        if not src.exists():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=IGNORED)
        else:
            shutil.copy2(src, target)
    env_sh = dest / "scripts" / "env.sh"
    env_sh.write_text(_INSTRUCTOR_ONLY.sub("", env_sh.read_text()))
    (dest / "README.md").write_text(student_readme(course))
    (dest / "pyproject.toml").write_text(student_pyproject(course, root))
    (dest / "requirements.txt").write_text(student_requirements(root))
    (dest / ".gitignore").write_text(GITIGNORE)
    (dest / "scripts" / "test.sh").write_text(STUDENT_TEST_SH)
    (dest / "tests" / "test_course.py").write_text(STUDENT_TEST)
    (dest / "tests" / "conftest.py").write_text(STUDENT_CONFTEST)
    (dest / ".ci").mkdir(exist_ok=True)
    (dest / ".ci" / "run").write_text("#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")/..\"\n"
                                      "bash scripts/test.sh\n")
