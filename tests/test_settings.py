"""One settings schema (``autograder.course.schema``): every grading setting declared once, from
which course.yml is checked, ``GradingSettings`` is made and written into a worker's job file,
and the kernel's launcher takes its limits.  No kernel: the job file and the kernelspec are
written and read back, nothing is run."""
from __future__ import annotations

import json
from dataclasses import fields

import pytest
import yaml

from autograder.course import schema
from autograder.course.model import CourseFileError, Grading, load, parse
from autograder.course.settings import GradingSettings
from conftest import ROOT

BASE = {"title": "t", "repositories": {"student": {"name": "a/b"}, "instructor": {"name": "a/c"}},
        "assignments": {"x": {"title": "X", "judge_context": ["imports"], "models": ["distilbert"]}}}


def _other_value(s: schema.Setting):
    """A value of ``s`` that is not its default (so that a setting lost on the way shows)."""
    if s.type is dict:
        return {"COURSE_PROFILE": "cpu"}
    return s.default + 7 if s.default else 3


def test_course_file_to_settings_to_job_file_and_back(tmp_path):
    """Every setting course.yml may give reaches GradingSettings, its job file and the kernel's
    launcher, and comes back from the job file as it went in."""
    from autograder.judge.worker import Job

    given = {s.name: _other_value(s) for s in schema.IN_COURSE_FILE}
    text = yaml.safe_dump({**BASE, "assignments": {"x": {**BASE["assignments"]["x"], "grading": given}}})
    course = parse(yaml.safe_load(text), ROOT)
    settings = GradingSettings.for_assignment(course.assignment("x"), workers=2, sandbox="off", max_restarts=1)
    for s in schema.IN_COURSE_FILE:
        assert getattr(settings, s.name) == given[s.name], s.name
    assert (settings.judge_context, settings.models) == (("imports",), ("distilbert",))
    gradebook = tmp_path / "gradebook.db"
    gradebook.write_bytes(b"")
    Job.prepare(tmp_path / "job", "x", "x.ipynb", {}, gradebook, settings)
    back = Job.load(tmp_path / "job" / "job.json").settings
    assert back == settings and isinstance(back.judge_context, tuple)
    argv = json.loads((tmp_path / "job" / "jupyter" / "kernels" / "course-sandbox" / "kernel.json").read_text())["argv"]
    for s in schema.KERNEL:  # the kernel's limits are the run's
        assert f"{s.flag}={given[s.name]}" in argv, s.name


def test_the_schema_declares_every_field_of_the_settings_once():
    names = [s.name for s in schema.SETTINGS]
    assert len(names) == len(set(names))
    assert [f.name for f in fields(GradingSettings)] == [s.name for s in schema.TRAVELLING]
    assert [f.name for f in fields(Grading)] == [s.name for s in schema.IN_COURSE_FILE]
    assert GradingSettings() == GradingSettings(**{s.name: s.default for s in schema.TRAVELLING})
    for s in schema.SETTINGS:
        assert len(s.help) > 10, f"{s.name}: its help"
    # the course file's own values are within the schema's rules
    course = load(ROOT)
    for a in course.assignments:
        GradingSettings.for_assignment(a)


@pytest.mark.parametrize("where, key, near", [
    ("grading", "test_timout", "test_timeout"),
    ("grading", "memory", "memory_mb"),
    ("assignments.x.grading", "cell_timeot", "cell_timeout"),
    ("assignments.x.grading", "workers", None),   # a run's setting, not the course file's
])
def test_an_unknown_key_is_refused_naming_it_and_the_nearest_one(where, key, near):
    data = json.loads(json.dumps(BASE))
    if where == "grading":
        data["grading"] = {key: 5}
    else:
        data["assignments"]["x"]["grading"] = {key: 5}
    with pytest.raises(CourseFileError) as err:
        parse(data, ROOT)
    line = str(err.value)
    assert "\n" not in line and f"unknown key {key!r} in {where}" in line, line
    if near:
        assert f"did you mean {near!r}?" in line, line
    else:
        assert "cell_timeout" in line and "'workers'" not in line.split("(", 1)[1], line


def test_a_misspelt_key_elsewhere_names_the_nearest_one():
    with pytest.raises(CourseFileError, match=r"unknown key 'judge_contxt' in assignments\.x "
                                              r"\(did you mean 'judge_context'\?\)"):
        parse({**BASE, "assignments": {"x": {"title": "X", "judge_contxt": []}}}, ROOT)


@pytest.mark.parametrize("key, value, expected", [
    ("memory_mb", "8G", "grading.memory_mb must be a whole number (int), not str '8G'"),
    ("cell_timeout", True, "grading.cell_timeout must be a whole number (int), not bool"),
    ("cell_timeout", 0, "grading.cell_timeout must be positive"),
    ("test_memory_mb", -1, "grading.test_memory_mb must be 0 or more"),
    ("env", ["COURSE_PROFILE=cpu"], "grading.env must be a mapping (KEY: value) (dict), not list"),
    ("env", {"COURSE PROFILE": "cpu"}, "is not the name of an environment variable"),
])
def test_a_value_of_the_wrong_kind_names_the_key_and_the_type(key, value, expected):
    with pytest.raises(CourseFileError) as err:
        parse({**BASE, "grading": {key: value}}, ROOT)
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_assignment_merges_its_environment_over_the_course_one():
    course = parse({**BASE, "grading": {"env": {"A": "1", "B": "2"}, "test_memory_mb": 0},
                    "assignments": {"x": {"title": "X", "grading": {"env": {"B": 3}, "tmp_mb": 64}}}}, ROOT)
    g = course.assignment("x").grading
    assert (g.env, g.test_memory_mb, g.tmp_mb) == ({"A": "1", "B": "3"}, 0, 64)


def test_a_job_file_with_a_setting_the_schema_does_not_know_is_refused():
    data = json.loads(GradingSettings().to_json())
    with pytest.raises(schema.SettingError, match="unknown key 'cell_timout' .*did you mean 'cell_timeout'"):
        GradingSettings.from_json(json.dumps({**data, "cell_timout": 3}))
    with pytest.raises(schema.SettingError, match="the job's setting memory_mb must be a whole number"):
        GradingSettings.from_json(json.dumps({**data, "memory_mb": "lots"}))


# the command line: the flags of grade and export are made from the schema ----------------------
def _options(command: str) -> dict:
    """option string -> argparse action of a command of ``python -m autograder``."""
    import argparse

    from autograder.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices[command]._actions for o in a.option_strings}


def _commands() -> set:
    import argparse

    from autograder.cli import build_parser

    return set(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_every_setting_a_person_gives_has_a_flag_with_its_help():
    for s in schema.SETTINGS:
        if not s.is_set_by_a_person:
            assert s.flag is None, f"{s.name} is worked out by the run: no flag sets it"
            continue
        assert s.flag or s.no_flag, f"{s.name}: a flag, or why it has none"
        for command in s.commands if s.flag else ():
            action = _options(command).get(s.flag)
            assert action is not None, f"{command} has no {s.flag}"
            assert action.dest == s.name and s.help in action.help and "(default: " in action.help, s.name
            assert action.choices == (list(s.choices) or None), s.name


def test_the_documented_flags_are_still_there():
    """The README and docs/GRADING.md name these flags: generated, they keep their names."""
    grade, export = _options("grade"), _options("export")
    assert {"--roster", "--missing", "--add-students", "--out", "--grading-dir", "--workers", "--sandbox",
            "--memory-mb", "--cluster", "--db-url", "--cell-timeout", "--notebook-timeout", "--wait"} <= set(grade)
    assert {"--grading-dir", "--out", "--no-feedback", "--missing", "--wait"} <= set(export)


def test_the_commands_of_the_readme_and_the_docs_parse():
    import re
    import shlex

    from autograder.cli import build_parser

    seen = 0
    for doc in ("README.md", "docs/GRADING.md"):
        for line in (ROOT / doc).read_text().splitlines():
            for m in re.finditer(r"python -m autograder ([^`#|)\"]+)", line):
                words = shlex.split(m.group(1).strip().replace("[RUN]", "3"))
                if not words or "..." in words or any(w.endswith("...") for w in words):
                    continue
                if len(words) == 1:  # a command named in prose: it exists
                    assert words[0] in _commands(), f"{doc}: python -m autograder {words[0]}"
                    continue
                try:
                    build_parser().parse_args(words)
                except SystemExit as stop:  # --help exits 0, a wrong flag 2
                    assert stop.code == 0, f"{doc}: python -m autograder {' '.join(words)}"
                seen += 1
    assert seen >= 10


def test_the_flags_of_grade_reach_the_runs_settings():
    from autograder.cli import _run_settings, build_parser

    args = build_parser().parse_args(["grade", "finetune", "subs", "--cell-timeout", "7", "--test-mb", "9",
                                      "--file-mb", "33", "--sandbox", "off", "--workers", "2",
                                      "--max-restarts", "0", "--test-memory-mb", "0", "--missing", "blank"])
    s = _run_settings(args)
    course = load(ROOT).assignment("finetune").grading
    assert (s.cell_timeout, s.test_mb, s.file_mb, s.sandbox, s.workers, s.max_restarts, s.test_memory_mb) == \
        (7, 9, 33, "off", 2, 0, 0)
    assert (s.notebook_timeout, s.memory_mb, s.env) == (course.notebook_timeout, course.memory_mb, course.env)
    assert s.models == ("distilbert",)


# the environment: every COURSE_* variable listed once (coursekit/envvars.py) -----------------------
# a name used as an environment variable: quoted, set as a keyword or in a shell, or read in a shell
_ENV_USE = r"""(?:["']|\$\{?|\b)(COURSE_[A-Z0-9_]*[A-Z0-9])(?:["'=:}]|\s*\))"""
# files that still read their variables straight from os.environ, and why
_PENDING: dict = {}  # a file that still reads a variable directly, and why (none today)


def _code_files():
    for folder in ("autograder", "coursekit", "tests", "scripts", "benchmarks", "solutions"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".sh", ".ipynb") and path.is_file() and "__pycache__" not in path.parts:
                yield path


def test_every_course_variable_in_the_code_is_listed():
    import re

    from coursekit import envvars

    used = {}
    for path in _code_files():
        for name in re.findall(_ENV_USE, path.read_text(encoding="utf-8", errors="replace")):
            used.setdefault(name, path.relative_to(ROOT).as_posix())
    used.pop("COURSE_FILE", None)  # autograder.course.model's constant: the file's name, not a variable
    unlisted = {name: where for name, where in used.items() if name not in envvars.BY_NAME}
    assert not unlisted, f"list these in coursekit/envvars.py: {unlisted}"
    for v in envvars.VARIABLES:  # and the list names real readers
        assert v.why and v.side in (envvars.NOTEBOOK, envvars.GRADER, envvars.TOOLS), v.name
        for reader in v.readers:
            assert v.name in (ROOT / reader).read_text(encoding="utf-8"), f"{reader} does not read {v.name}"


def test_the_package_code_reads_the_variables_through_the_list():
    import re

    direct = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*["']COURSE_""")
    found = []
    for folder in ("autograder", "coursekit"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in _PENDING or rel == "coursekit/envvars.py":
                continue
            found += [f"{rel}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1) if direct.search(line)]
    assert not found, f"read these through coursekit.envvars.get: {found}"


def test_get_refuses_a_variable_that_is_not_listed(monkeypatch):
    from coursekit import envvars

    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert envvars.get("COURSE_DEVICE") == "cpu"
    misspelt = "COURSE_" + "DEVIC"  # built, so that the check of the code above does not take it for a variable
    with pytest.raises(KeyError, match=f"{misspelt} is not a listed variable"):
        envvars.get(misspelt)


def test_the_table_in_grading_md_is_the_list():
    from coursekit.envvars import table

    text = (ROOT / "docs" / "GRADING.md").read_text()
    block = text.split("<!-- env-variables:start -->\n", 1)[1].split("\n<!-- env-variables:end -->", 1)[0]
    assert block == table(), "docs/GRADING.md: paste the output of python -m coursekit.envvars"


# plain nbgrader: nbgrader_config.py takes course.yml's limits ---------------------------------------
def test_nbgrader_validate_takes_the_cell_limit_of_course_yml(tmp_path, capsys):
    from traitlets.config import Config

    from autograder.judge.nbconfig import configure

    (tmp_path / "course.yml").write_text(yaml.safe_dump(
        {**BASE, "grading": {"cell_timeout": 77},
         "assignments": {"x": {"title": "X", "grading": {"cell_timeout": 99}}, "y": {"title": "Y"}}}))
    for argv, expected in ([["nbgrader", "validate", "exercises/y/y.ipynb"], 77],
                           [["nbgrader", "validate", "somewhere/x.ipynb"], 99],
                           [["nbgrader", "formgrader"], 77]):
        c = Config()
        configure(c, root=tmp_path, grading_dir=tmp_path / "grading", argv=argv)
        assert c.Execute.timeout == expected, argv
    (tmp_path / "course.yml").write_text("grading: {cell_timout: 5}\n")  # broken: one line, the built-in limit
    c = Config()
    configure(c, root=tmp_path, grading_dir=tmp_path / "grading", argv=["nbgrader", "validate"])
    assert c.Execute.timeout == schema.BY_NAME["cell_timeout"].default
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "course.yml" in err and "built-in limits" in err, err


def test_plain_nbgrader_autograde_takes_the_assignments_settings_from_course_yml(monkeypatch):
    """JudgedExecute without a job file (a plain ``nbgrader autograde``) takes the assignment's
    settings from course.yml: its limits, environment and judge context."""
    import autograder.isolation.sandbox as sandbox
    from autograder.judge.execute import JudgedExecute

    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)
    ex = JudgedExecute()
    ex._configure("finetune")
    spec = load(ROOT).assignment("finetune")
    assert (ex.timeout, ex.notebook_timeout, ex.interrupt_grace, ex.kernel_env) == \
        (spec.grading.cell_timeout, spec.grading.notebook_timeout, spec.grading.interrupt_grace, spec.grading.env)
    assert ex.limits.memory_mb == spec.grading.test_memory_mb and ex.context == list(spec.judge_context)
