"""A corpus of hostile LMS downloads, each with what ``collect`` must make of it.

Every case builds its zip (or folder) in the test's temporary folder, byte by byte where a
zip library would refuse to write the lie, so no binary file is committed.  ``expect`` maps
an entry's name (as the report shows it) to the start of its status; ``collected`` lists
the files that must come out, and nothing else may be written anywhere.  ``limits`` are
passed to ``collect`` (small caps keep the cases fast; the defaults are 64 MiB a notebook and
2 GiB a zip).

Kinds: names that leave the folder, links and special files, empty and hidden folders,
declared and real sizes past the caps (and a header that lies about the size), names too
long for a file system, non-notebooks, duplicates and Canvas resubmissions, entries that
cannot be read (corrupt, encrypted, an unknown compression, a local header that disagrees
with the directory), and names with control characters.
"""
from __future__ import annotations

import io
import os
import stat
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from conftest import ROOT

NB = (ROOT / "exercises" / "attention" / "attention.ipynb").read_bytes()
CJK_NAME = "注意力机制与位置编码" * 15                 # 150 CJK characters: 450 bytes in UTF-8
MOODLE_CJK = f"{CJK_NAME}_7301_assignsubmission_file_"  # 456 bytes: legal in Moodle, too long for Linux
LONG = "x" * 300                                       # a plain file name past 255 bytes
KIB = 1 << 10


@dataclass
class Case:
    name: str
    build: Callable[[Path], Path]              # writes the input under the folder given; returns it
    expect: dict[str, str]                     # entry -> start of its status
    collected: set[str]                        # files written into the output folder
    roster: str | None = None
    limits: dict = field(default_factory=dict)
    check: Callable[[list], None] | None = None   # more to assert on the entries


def _zip(entries: list[tuple], patch: Callable[[bytes], bytes] | None = None) -> Callable[[Path], Path]:
    """A builder: entries are (name, bytes) or (ZipInfo, bytes); ``patch`` rewrites the finished
    zip's bytes (for lies no zip library writes)."""
    def build(tmp: Path) -> Path:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in entries:
                zf.writestr(name, data)
        data = buf.getvalue()
        path = tmp / "download.zip"
        path.write_bytes(patch(data) if patch else data)
        return path
    return build


def _info(name: str, mode: int = 0, method: int = zipfile.ZIP_DEFLATED) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # unix: the mode's type bits count
    info.external_attr = mode << 16
    info.compress_type = method
    return info


def _headers(data: bytes, name: str) -> tuple[int, int]:
    """Offsets of the local and the central header of entry ``name``."""
    raw = name.encode()
    central = data.index(b"PK\x01\x02")
    while data[central + 46:central + 46 + len(raw)] != raw:
        central = data.index(b"PK\x01\x02", central + 4)
    local = struct.unpack_from("<I", data, central + 42)[0]
    return local, central


def _set(name: str, **fields) -> Callable[[bytes], bytes]:
    """A patch that sets header fields of entry ``name`` in both its headers:
    flags, method, size (the uncompressed size), local_name."""
    where = {"flags": (6, 8, "<H"), "method": (8, 10, "<H"), "size": (22, 24, "<I")}

    def patch(data: bytes) -> bytes:
        out = bytearray(data)
        local, central = _headers(data, name)
        for key, value in fields.items():
            if key == "local_name":
                out[local + 30:local + 30 + len(value)] = value.encode()
                continue
            at_local, at_central, fmt = where[key]
            struct.pack_into(fmt, out, local + at_local, value)
            struct.pack_into(fmt, out, central + at_central, value)
        return bytes(out)
    return patch


def _flip_byte_of_stored(name: str, content: bytes) -> Callable[[bytes], bytes]:
    def patch(data: bytes) -> bytes:
        at = data.index(content) + len(content) // 2
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    return patch


def _folder(files: dict[str, bytes], links: dict[str, str] | None = None, fifo: str | None = None):
    def build(tmp: Path) -> Path:
        root = tmp / "download"
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        for rel, target in (links or {}).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, root / rel)
        if fifo:
            os.mkfifo(root / fifo)
        return root
    return build


def _secret_outside(tmp: Path) -> str:
    return str(tmp.parent / "instructor-secret.txt")


def _two_long_ids(entries) -> None:
    """The two 300-character names: two students, ids of 100 characters that end in a hash."""
    ids = sorted(e.student_id for e in entries if e.source.startswith("xxx"))
    assert len(set(ids)) == 2 and all(len(i) == 100 for i in ids), ids
    assert ids[0][:90] == ids[1][:90] and ids[0] != ids[1]


ROSTER = "student_id,lms_id,name\ns001,1001,Lee Ann\ns002,1002,Kim Bo\ns003,1003,Cy\n"
BIG = b"0" * (300 * KIB)  # deflates to a few hundred bytes

CASES = [
    Case("path traversal and absolute paths",
         _zip([("../evil.ipynb", NB), ("../../home/evil_attention.ipynb", NB), ("/tmp/abs_attention.ipynb", NB),
               ("..\\..\\win_attention.ipynb", NB), ("C:/Users/x/drive_attention.ipynb", NB),
               ("ok_attention.ipynb", NB)]),
         {"../evil.ipynb": "unsafe path, a path with '..'", "../../home/evil_attention.ipynb": "unsafe path",
          "/tmp/abs_attention.ipynb": "unsafe path, an absolute path", "..\\..\\win_attention.ipynb": "unsafe path",
          "C:/Users/x/drive_attention.ipynb": "unsafe path, an absolute path", "ok_attention.ipynb": "collected"},
         {"ok_attention.ipynb"}),
    Case("a link in the zip, to a file of the grader",
         _zip([(_info("s1_attention.ipynb", stat.S_IFLNK | 0o777), b"/etc/passwd"),
               (_info("s2_attention.ipynb", stat.S_IFIFO | 0o644), b""), ("s3_attention.ipynb", NB)]),
         {"s1_attention.ipynb": "a symbolic link: not extracted", "s2_attention.ipynb": "not a regular file",
          "s3_attention.ipynb": "collected"},
         {"s3_attention.ipynb"}),
    Case("a link and a pipe in a folder",
         _folder({"s3_attention.ipynb": NB}, links={"s1_attention.ipynb": "../instructor-secret.txt"},
                 fifo="s2_attention.ipynb"),
         {"s1_attention.ipynb": "a symbolic link", "s2_attention.ipynb": "not a regular file",
          "s3_attention.ipynb": "collected"},
         {"s3_attention.ipynb"}),
    Case("an empty Moodle folder, system files and a hidden folder",
         _zip([("Ada Lovelace_301_assignsubmission_file_/", b""),
               ("Alan Turing_302_assignsubmission_file_/", b""),
               ("Alan Turing_302_assignsubmission_file_/attention.ipynb", NB),
               ("Alan Turing_302_assignsubmission_file_/.ipynb_checkpoints/attention-checkpoint.ipynb", NB),
               ("__MACOSX/Alan Turing_302_assignsubmission_file_/._attention.ipynb", b"\0\5\26\7"),
               (".DS_Store", b"\0\0\0\1Bud1")]),
         {"Ada Lovelace_301_assignsubmission_file_/": "empty folder",
          "Alan Turing_302_assignsubmission_file_/attention.ipynb": "collected",
          "Alan Turing_302_assignsubmission_file_/.ipynb_checkpoints/attention-checkpoint.ipynb": "ignored:",
          "__MACOSX/Alan Turing_302_assignsubmission_file_/._attention.ipynb": "ignored: macOS metadata",
          ".DS_Store": "ignored:"},
         {"moodle302_attention.ipynb"}),
    Case("too big by its header, and a zip bomb whose header lies",
         _zip([("big_attention.ipynb", BIG), ("liar_attention.ipynb", BIG), ("ok_attention.ipynb", NB)],
              patch=_set("liar_attention.ipynb", size=1000)),
         {"big_attention.ipynb": "too big: 300 KiB, more than the 200 KiB",
          "liar_attention.ipynb": "could not be extracted: the zip is corrupt there (Bad CRC-32",  # inflates past what it declared
          "ok_attention.ipynb": "collected"},
         {"ok_attention.ipynb"}, limits={"max_file_bytes": 200 * KIB}),
    Case("the notebooks of one zip pass the cap for the zip",
         _zip([("a_attention.ipynb", NB), ("b_attention.ipynb", NB), ("c_attention.ipynb", NB)]),
         {"a_attention.ipynb": "collected", "b_attention.ipynb": "collected",
          "c_attention.ipynb": "not extracted: the notebooks of this zip pass"},
         {"a_attention.ipynb", "b_attention.ipynb"}, limits={"max_total_bytes": int(2.5 * len(NB))}),
    Case("names too long for Linux: a Moodle folder of 150 CJK characters, a 300-character file name",
         _zip([(f"{MOODLE_CJK}/attention.ipynb", NB), (f"{LONG}_attention.ipynb", NB),
               (f"{LONG}y_attention.ipynb", NB), ("n" * 2000 + "_attention.ipynb", NB)]),
         {f"{MOODLE_CJK}/attention.ipynb": "collected", f"{LONG}_attention.ipynb": "collected",
          f"{LONG}y_attention.ipynb": "collected",  # not a duplicate of the one above: ids end in a hash
          "n" * 200 + "...": "name too long (2016 characters, at most 1024)"},
         {"moodle7301_attention.ipynb", "*"}, check=lambda entries: _two_long_ids(entries)),
    Case("not notebooks",
         _zip([("lee_1001_5001_attention.pdf", b"%PDF-1.4"), ("lee_1001_5002_attention.html", b"<script>"),
               ("kim_1002_5003_attention.ipynb.zip", b"PK\5\6" + b"\0" * 18), ("kim_1002_5004_attention", NB)]),
         {"lee_1001_5001_attention.pdf": "not a notebook (.pdf)", "lee_1001_5002_attention.html": "not a notebook",
          "kim_1002_5003_attention.ipynb.zip": "not a notebook (.zip)",
          "kim_1002_5004_attention": "not a notebook (no extension)"},
         set(), roster=ROSTER),
    Case("Canvas resubmissions: the newest file is graded, by submission id, then -N",
         _zip([("lee_1001_5001_attention.ipynb", b'{"old": 1}'), ("lee_1001_5011_attention-1.ipynb", NB),
               # the student's own file name ends in -1, but Canvas' id says it is the older file
               ("kim_1002_5002_attention-1.ipynb", b'{"old": 1}'), ("kim_1002_5012_attention.ipynb", NB),
               ("cy_LATE_1003_5003_attention.ipynb", b'{"old": 1}'), ("cy_LATE_1003_5003_attention-2.ipynb", NB)]),
         {"lee_1001_5001_attention.ipynb": "duplicate: an older file of student s001; the newest, "
                                           "lee_1001_5011_attention-1.ipynb, is graded",
          "lee_1001_5011_attention-1.ipynb": "collected",
          "kim_1002_5002_attention-1.ipynb": "duplicate: an older file of student s002",
          "kim_1002_5012_attention.ipynb": "collected",
          "cy_LATE_1003_5003_attention.ipynb": "duplicate: an older file of student s003",
          "cy_LATE_1003_5003_attention-2.ipynb": "collected, LATE"},
         {"s001_attention.ipynb", "s002_attention.ipynb", "s003_attention.ipynb"}, roster=ROSTER),
    Case("two notebooks in one Moodle folder, and a stranger",
         _zip([("Ada_301_assignsubmission_file_/attention.ipynb", NB),
               ("Ada_301_assignsubmission_file_/attention (copy).ipynb", NB),
               ("Eve_999_assignsubmission_file_/attention.ipynb", NB)]),
         {"Ada_301_assignsubmission_file_/attention (copy).ipynb": "collected",
          "Ada_301_assignsubmission_file_/attention.ipynb": "duplicate: student s301 already has",
          "Eve_999_assignsubmission_file_/attention.ipynb": "unmatched: moodle id 999"},
         {"s301_attention.ipynb"}, roster="student_id,lms_id\ns301,301\n"),
    Case("entries that cannot be read: corrupt, encrypted, unknown compression, lying local header",
         _zip([(_info("crc_attention.ipynb", method=zipfile.ZIP_STORED), NB),
               ("locked_attention.ipynb", NB), ("method_attention.ipynb", NB), ("s9_attention.ipynb", NB),
               ("ok_attention.ipynb", NB)],
              patch=lambda d: _set("s9_attention.ipynb", local_name="s8_attention.ipynb")(
                  _set("method_attention.ipynb", method=99)(_set("locked_attention.ipynb", flags=1)(
                      _flip_byte_of_stored("crc_attention.ipynb", NB)(d))))),
         {"crc_attention.ipynb": "could not be extracted: the zip is corrupt there (Bad CRC-32",
          "locked_attention.ipynb": "could not be extracted: it is encrypted", "method_attention.ipynb":
          "could not be extracted: its compression method is not supported",
          "s9_attention.ipynb": "could not be extracted: the zip is corrupt there (File name in directory",
          "ok_attention.ipynb": "collected"},
         {"ok_attention.ipynb"}),
    Case("names with a newline, a bidi override and a formula",
         _zip([("evil\nname_attention.ipynb", NB), ("gnp.\u202eattention_x.ipynb", NB),
               ("=HYPERLINK(\"evil.example\")_1004_5005_attention.ipynb", NB)]),
         {"evil\\u000aname_attention.ipynb": "collected", "gnp.\\u202eattention_x.ipynb": "collected",
          "=HYPERLINK(\"evil.example\")_1004_5005_attention.ipynb": "collected"},
         {"evil_name_attention.ipynb", "gnp._attention_x_attention.ipynb", "canvas1004_attention.ipynb"}),
    Case("a file name in a folder that is not UTF-8",
         _folder({os.fsdecode(b"s7\xff\xfe_attention.ipynb"): NB, os.fsdecode(b"notes\xff.txt"): b"hi"}),
         {"s7\\udcff\\udcfe_attention.ipynb": "collected", "notes\\udcff.txt": "not a notebook (.txt)"},
         {"s7_attention.ipynb"}),
]
