"""The `finetune` assignment: structure, tests that catch wrong answers, and end-to-end grading.

The quick tests run the graded functions and their test cells in this process, on the tiny
models and hand-made batches the notebook's tests use (a few seconds). The slow test
autogrades the solution and the untouched exercise once: the solution notebook fine-tunes
two models, so it costs a few minutes of CPU.

What nbgrader gives the two manually graded answers (Q3, Q4): in the solution they hold the
mark scheme, i.e. text that differs from the release, so they wait for a person (auto and
manual score None, needs_manual_grade True) and the submission's score is the autograded points out of the full
maximum; left as released they score 0 at once.
"""
from __future__ import annotations

import os

import nbformat
import pytest

from conftest import HIDDEN_RE, ROOT, assert_hand_in_reports, filled_exercise, read_nb, set_solution

SOURCE = ROOT / "solutions" / "finetune" / "finetune.ipynb"
EXERCISE = ROOT / "exercises" / "finetune" / "finetune.ipynb"

MAX, AUTO = 45, 32
MANUAL = {"q3_answer": 5, "q4_answer": 8}
ANSWERS = ["preprocess", "make_dataloaders", "build_model", "evaluate", "train_one_epoch",
           "predict", "count_parameters"]


def _cells(nb):
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if "nbgrader" in c.metadata}


def test_points_and_structure():
    nb = read_nb(SOURCE)
    metas = [c.metadata["nbgrader"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert sum(m["points"] for m in metas) == MAX
    assert {m["grade_id"]: m["points"] for m in metas if m["solution"]} == MANUAL
    assert sum(m["points"] for m in metas if not m["solution"]) == AUTO
    cells = _cells(nb)
    assert nb.cells[1].metadata["nbgrader"]["grade_id"] == "setup"
    assert 'assignment="finetune"' in nb.cells[1].source
    assert nb.cells[-1].metadata["nbgrader"]["grade_id"] == "handin_check"
    for name in ANSWERS:
        meta = cells[name].metadata["nbgrader"]
        assert meta["solution"] and not meta["grade"], name
    for gid in MANUAL:
        assert cells[gid].source.startswith("**Mark scheme (graders only).**")
    # one switch sizes every experiment, and the cpu profile is the one graded
    assert 'PROFILE = os.environ.get("COURSE_PROFILE", "full" if torch.cuda.is_available() else "cpu")' \
        in cells["imports"].source
    for cell in nb.cells:  # committed without outputs
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


# ------------------------------------------------------------------- tests catch wrong answers

def _namespace(nb):
    """The notebook's imports, tiny test helpers and graded functions, executed here on the CPU;
    test cells reach the functions through ``student``, as in the notebook."""
    import torch

    from coursekit.remote import LocalStudent
    from coursekit.selfcheck import warn_only

    cells = _cells(nb)
    ns = {"DEVICE": torch.device("cpu"), "display": print, "warn_only": warn_only}
    ns["student"] = LocalStudent(ns)
    os.environ.setdefault("COURSE_MODEL_SOURCE", "offline")
    exec(cells["imports"].source, ns)
    exec(cells["tiny_helpers"].source, ns)
    for name in ANSWERS:
        exec(cells[name].source, ns)
    return ns


def _run_test(nb, ns, grade_id):
    src = _cells(nb)[grade_id].source
    exec(HIDDEN_RE.sub(lambda m: m.group(1), src), ns)  # hidden tests too


QUICK_TESTS = ["test_evaluate_extremes", "test_evaluate_values", "test_train_one_epoch_lowers_loss",
               "test_train_one_epoch_values", "test_count_parameters"]

# (function, wrong body, the test cell that must catch it)
WRONG = [
    ("evaluate", '''
model.eval()
accs = []
with torch.no_grad():
    for batch in loader:
        logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).logits
        accs.append(float((logits.argmax(-1).cpu() == batch["labels"]).float().mean()))
return sum(accs) / len(accs)  # mean of batch accuracies: small batches weigh too much
''', "test_evaluate_values"),
    ("evaluate", '''
correct = total = 0
with torch.no_grad():  # forgets model.eval(): dropout stays on
    for batch in loader:
        logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).logits
        correct += int((logits.argmax(-1).cpu() == batch["labels"]).sum())
        total += len(batch["labels"])
return correct / total
''', "test_evaluate_values"),
    ("evaluate", "return 1", "test_evaluate_extremes"),
    ("train_one_epoch", '''
model.train()
losses = []
for batch in loader:
    batch = {k: v.to(device) for k, v in batch.items()}
    loss = model(**batch).loss
    loss.backward()  # gradients never cleared: they pile up from step to step
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    losses.append(loss.item())
return sum(losses) / len(losses)
''', "test_train_one_epoch_values"),
    ("train_one_epoch", '''
model.train()
for batch in loader:
    batch = {k: v.to(device) for k, v in batch.items()}
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
return loss  # a tensor, and only the last batch
''', "test_train_one_epoch_lowers_loss"),
    ("count_parameters", "return float(sum(p.numel() for p in model.parameters()))", "test_count_parameters"),
]


def test_quick_tests_pass_on_the_solution(capsys):
    nb = read_nb(SOURCE)
    ns = _namespace(nb)
    for gid in QUICK_TESTS:
        _run_test(nb, ns, gid)
    assert "Warning:" not in capsys.readouterr().out  # no warn_only block of a visible test fired


@pytest.mark.parametrize("name,body,test_id", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_wrong_answer_fails_its_test(name, body, test_id):
    nb = set_solution(read_nb(SOURCE), name, body)
    ns = _namespace(nb)
    with pytest.raises(AssertionError):
        _run_test(nb, ns, test_id)


def test_predict_ignoring_the_attention_mask_is_caught():
    """Batched predictions must equal text-by-text ones; without the mask, padding changes them."""
    nb = read_nb(SOURCE)
    ns = _namespace(nb)
    ns["tokenizer"] = ns["load_tokenizer"]("distilbert")
    exec("_m = tiny_classifier(seed=11, vocab_size=tokenizer.vocab_size, init_range=1.0)\n"
         "_texts = ['Rates', 'Shares of the carmaker fell sharply on Monday after a profit warning.', "
         "'Rover lands on Mars.', 'Striker injured before the derby, coach says he may miss a month.', "
         "'Election results delayed in the capital', 'New phone chip doubles battery life, maker claims.', 'Oil']", ns)
    exec("_good = predict(_m, tokenizer, _texts, DEVICE, batch_size=7)", ns)
    wrong = set_solution(read_nb(SOURCE), "predict", '''
model.eval()
with torch.no_grad():
    enc = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
    return [int(i) for i in model(input_ids=enc["input_ids"].to(device)).logits.argmax(-1)]
''')
    exec(_cells(wrong)["predict"].source, ns)
    exec("_bad = predict(_m, tokenizer, _texts, DEVICE, batch_size=7)", ns)
    exec(_cells(nb)["predict"].source, ns)
    # the reference the hidden test uses: one text at a time, no padding
    exec("_m.eval()\n_ref = [int(_m(**{k: v for k, v in tokenizer(t, return_tensors='pt').items() "
         "if k != 'token_type_ids'}).logits.argmax(-1)) for t in _texts]", ns)
    assert ns["_good"] == ns["_ref"]
    assert ns["_bad"] != ns["_ref"], "the tiny model should be sensitive to padding"


# ------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from autograder.pipeline.run import grade

    subs = tmp_path_factory.mktemp("finetune_subs")
    nbformat.write(filled_exercise("finetune"), subs / "full.ipynb")  # what a student hands in
    (subs / "untouched.ipynb").write_bytes(EXERCISE.read_bytes())
    out = tmp_path_factory.mktemp("finetune_out")
    # cell_timeout: the fine-tuning cell needs about 1-2 min on an idle core, far more on a
    # loaded CI machine; the default limit of 300 s is for the real grading server.
    # workers=1: the untouched notebook takes seconds, so one worker whose kernel trains on
    # every core finishes sooner than two workers of one core each
    report = grade("finetune", subs, out_dir=out, grading_dir=out / "grading", workers=1, cell_timeout=1200)
    return {r.student_id: r for r in report.results}, out / "grading"


def _manual_grades(grading_dir, student):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{grading_dir / 'gradebook.db'}") as gb:
        sub = gb.find_submission("finetune", student)
        return {g.name: (g.auto_score, g.manual_score, g.needs_manual_grade) for nb in sub.notebooks
                for g in nb.grades if g.name in MANUAL}


@pytest.mark.slow
def test_solution_gets_every_autograded_point(graded):
    res, grading = graded
    full = res["full"]
    assert full.status == "graded", full.message
    assert full.max_score == MAX
    assert full.score == AUTO, full.tests  # the 13 written points wait for a person
    manual = _manual_grades(grading, "full")
    assert set(manual) == set(MANUAL)
    assert all(auto is None and by_hand is None and needs for auto, by_hand, needs in manual.values())


@pytest.mark.slow
def test_hand_in_cell_reports_the_visible_checks(graded):
    _, grading = graded
    assert_hand_in_reports(grading, "finetune")


@pytest.mark.slow
def test_untouched_exercise_scores_zero_without_crashing(graded):
    res, grading = graded
    assert res["untouched"].status == "graded", res["untouched"].message
    assert res["untouched"].score == 0
    manual = _manual_grades(grading, "untouched")
    assert all(auto == 0 and not needs for auto, _, needs in manual.values())
