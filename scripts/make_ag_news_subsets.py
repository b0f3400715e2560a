#!/usr/bin/env python
"""Draw the course's small, balanced AG News train/test subsets from the shared pool.

    python scripts/make_ag_news_subsets.py                      # writes data/small_ag_news/
    python scripts/make_ag_news_subsets.py --out /tmp/x --pool path/to/ag_news_pool.csv

The pool is 5,600 rows (1,400 per class) of AG News' published test split: no header,
columns class,title,description, class 1..4.  Per class we sample 700 distinct rows with
``random.Random(seed)``: the first 500 go to train, the other 200 to test, so the splits
are disjoint.  Each split is then shuffled with the same generator.  Text is
"title. description" cleaned by ``coursekit.data.clean_ag_news_text``.  The output depends
only on the pool and the arguments: two runs give byte-identical files.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from coursekit.data import AG_NEWS_CLASSES, ag_news_example_text  # noqa: E402

# the shared pool sits beside the checkout (../shared), as on the course machines and in CI
DEFAULT_POOL = Path(os.environ.get("COURSE_AG_NEWS_POOL", REPO.parent / "shared" / "data" / "ag_news" / "ag_news_pool.csv"))

README = """\
# Small AG News (course subset)

`train.csv` ({n_train:,} rows, {train_per_class} per class) and `test.csv` ({n_test:,} rows,
{test_per_class} per class): short news articles labelled with one of four topics.
Columns: `text` (the article's title and description, "title. description") and
`label`: 0 World, 1 Sports, 2 Business, 3 Sci/Tech (the Hugging Face `ag_news` numbering).

## Source and licence

AG's News Topic Classification Dataset, from: Xiang Zhang, Junbo Zhao, Yann LeCun.
*Character-level Convolutional Networks for Text Classification.* Advances in Neural
Information Processing Systems 28 (NIPS 2015). It was built by Xiang Zhang from
A. Gulli's AG corpus of news articles
(http://groups.di.unipi.it/~gulli/AG_corpus_of_news_articles.html).
The AG corpus is provided by the academic community for research purposes in data
mining, information retrieval and other non-commercial activity. This subset is shipped
for teaching under those terms: keep this attribution with it and do not use it
commercially.

## How it was made

`python scripts/make_ag_news_subsets.py --seed {seed}` from `{pool_name}` ({pool_rows:,} rows,
{pool_per_class:,} per class, taken in order from the published 7,600-row test split;
sha256 `{pool_sha}`).

- Per class, {draw} distinct rows are drawn with Python's `random.Random({seed})`: the
  first {train_per_class} go to train, the other {test_per_class} to test, so no article is
  in both splits. Each split is then shuffled with the same generator.
- Text: title and description joined as "title. description", then cleaned
  (`coursekit.data.clean_ag_news_text`): numeric entities that lost their `&` in the
  published file (` #39;s`, `#36;`, `#151;`) are decoded, a bare backslash (the file's
  line-break mark) becomes a space and `\\$` a dollar sign, HTML tags hidden behind
  `&lt;...&gt;` are removed, curly quotes are straightened and runs of spaces collapsed.
- Labels: the file's class 1..4 minus one.

Running the script again gives byte-identical files.
"""


def read_pool(path: Path) -> list[tuple[int, str]]:
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for klass, title, description in csv.reader(f):
            rows.append((int(klass) - 1, ag_news_example_text(title, description)))
    return rows


def draw(rows, seed: int, train_per_class: int, test_per_class: int):
    rng = random.Random(seed)
    seen, usable = set(), []
    for i, (label, text) in enumerate(rows):
        if text and text not in seen:  # identical cleaned texts would blur the split
            seen.add(text)
            usable.append(i)
    train, test = [], []
    for c in range(len(AG_NEWS_CLASSES)):
        members = [i for i in usable if rows[i][0] == c]
        picked = rng.sample(members, train_per_class + test_per_class)
        train += picked[:train_per_class]
        test += picked[train_per_class:]
    rng.shuffle(train)
    rng.shuffle(test)
    return [rows[i] for i in train], [rows[i] for i in test]


def write_csv(path: Path, rows) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["text", "label"])
        for label, text in rows:
            writer.writerow([text, label])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=Path, default=DEFAULT_POOL,
                        help="ag_news_pool.csv (default: $COURSE_AG_NEWS_POOL or %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "data" / "small_ag_news")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-per-class", type=int, default=500)
    parser.add_argument("--test-per-class", type=int, default=200)
    args = parser.parse_args(argv)

    if not args.pool.is_file():
        parser.error(f"pool not found: {args.pool} (pass --pool)")
    rows = read_pool(args.pool)
    train, test = draw(rows, args.seed, args.train_per_class, args.test_per_class)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "train.csv", train)
    write_csv(args.out / "test.csv", test)
    per_class = len(rows) // len(AG_NEWS_CLASSES)
    (args.out / "README.md").write_text(README.format(
        n_train=len(train), n_test=len(test), train_per_class=args.train_per_class,
        test_per_class=args.test_per_class, draw=args.train_per_class + args.test_per_class,
        seed=args.seed, pool_name=args.pool.name, pool_rows=len(rows), pool_per_class=per_class,
        pool_sha=hashlib.sha256(args.pool.read_bytes()).hexdigest()), encoding="utf-8")
    print(f"wrote {len(train)} train and {len(test)} test rows to {args.out}")


if __name__ == "__main__":
    main()
