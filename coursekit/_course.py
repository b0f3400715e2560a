"""Written by `python -m autograder release` from course.yml: where students get the course."""
REPO = 'transformers-course/transformers-course'
BRANCH = 'main'
