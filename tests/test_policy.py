"""A kernel's sandbox policy (``autograder.isolation.policy``) and its resource limits, set in one
place (``autograder.isolation.confine.limit_resources``) for both kinds of sandbox: a kernel
started through bubblewrap and one forked from the zygote.  No kernel runs here: the limits are
applied to a plain Python process, which reports them."""
from __future__ import annotations

import ast
import dataclasses
import json
import resource
import subprocess
import sys

import pytest

from autograder.isolation.policy import Policy, kernel_policy
from conftest import ROOT

REPORT = """
import json, resource, sys
from autograder.isolation.confine import limit_resources
limit_resources(json.loads(sys.argv[1]))
print(json.dumps({name: resource.getrlimit(getattr(resource, "RLIMIT_" + name))[0]
                  for name in ("AS", "DATA", "FSIZE", "CORE")}))
"""


@pytest.mark.parametrize("gpu", [False, True])
def test_a_process_gets_the_limits_its_policy_names(tmp_path, gpu):
    policy = kernel_policy(tmp_path / "work", tmp_path / "conn", memory_mb=3072, tmp_mb=8, work_mb=8, file_mb=7,
                           gpu=gpu)
    # the zygote reads the policy from JSON, bubblewrap's launcher from the dataclass: the same data
    assert Policy.from_json(policy.to_json()) == policy
    out = subprocess.run([sys.executable, "-c", REPORT, policy.to_json()], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    limited, free = ("DATA", "AS") if gpu else ("AS", "DATA")  # CUDA reserves address space it never uses
    assert got[limited] == 3072 << 20 and got[free] == resource.getrlimit(getattr(resource, "RLIMIT_" + free))[0]
    assert (got["FSIZE"], got["CORE"]) == (7 << 20, 0), got


def test_a_policy_has_no_limit_of_its_own():
    """The limits come from the run's settings (course.yml's schema has the defaults), never from
    a value written a second time in the policy."""
    fields = {f.name: f for f in dataclasses.fields(Policy)}
    for name in ("memory_mb", "file_mb"):
        assert fields[name].default is dataclasses.MISSING, name


def test_only_confine_sets_a_kernels_limits():
    """``resource.setrlimit`` appears in confine.py (the kernel's limits) and in the judge's test
    budget (the grading process's own data segment while a test runs), nowhere else."""
    calls = {}
    for path in sorted((ROOT / "autograder").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "setrlimit":
                limits = {n.attr for n in ast.walk(ast.parse(ast.unparse(_call_of(tree, node))))
                          if isinstance(n, ast.Attribute) and n.attr.startswith("RLIMIT_")}
                calls.setdefault(str(path.relative_to(ROOT)), set()).update(limits)
    assert calls == {"autograder/isolation/confine.py": {"RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_CORE"},
                     "autograder/judge/budget.py": {"RLIMIT_DATA"}}, calls


def _call_of(tree: ast.AST, attribute: ast.Attribute) -> ast.AST:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func is attribute)
