collect_ignore_glob = ["*.ipynb"]  # the instructor notebook is executed by tests/test_instructor_notebook.py
