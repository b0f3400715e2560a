"""The judge: a student's notebook run in its sandboxed kernel, its tests judged here.

* ``kernel``: one kernel and the messages to and from it (``KernelSession``);
* ``runner``: a notebook run cell by cell, test cells judged in the grader's process;
* ``execute``: nbgrader's side of it (``JudgedExecute``, in place of nbgrader's ``Execute``);
* ``worker``: one grading process (nbgrader's autograde and feedback, with completion records);
* ``feedback``: the feedback page (labels, hidden tests hidden, the sanitised exporter);
* ``nbconfig``: the nbgrader configuration of the course.
"""
