"""``student``: how test cells call a notebook's code, in the notebook and from the grader.

Every test cell of an assignment calls the notebook's functions and classes through
``student``::

    _out, _w = student.calculate_multihead_attention(_q.to(DEVICE), _k.to(DEVICE), _v.to(DEVICE))
    assert float((_out.cpu() - _ref).abs().max()) <= 1e-5

In the notebook (self-check, ``nbgrader validate``) ``student`` is a :class:`LocalStudent`
bound to the notebook's own namespace.  At grading time the very same test code runs in
the grader's process, outside the student's kernel, with ``student`` bound to that kernel
through a small request/reply protocol (``coursekit.remote.client.RemoteStudent``): the grader
chooses the inputs, the kernel runs the student's code on them, and only plain values come
back.  Comparisons with references, and so the grade, happen where student code cannot
reach.  Both versions follow the same rules, so a visible test behaves the same way in
the notebook and at grading time:

* ``student.NAME`` refers to the notebook's global ``NAME``; ``.attr`` and ``[key]`` on it
  refer further (nothing is evaluated until it is called or fetched).
* Calling a reference runs the code there.  Arguments are data (tensors, numbers, strings,
  ``None``, lists, tuples, dicts and sets of these, ``torch.dtype``/``torch.device``),
  ``torch.Generator`` objects (their state travels both ways), other references, and plain
  functions, which the student's code can call back.  Tensors keep their device and travel
  as copies: whatever the code does to an argument, the caller's tensor stays as it was
  (``student.changed_inputs()`` tells which tensor arguments the last call changed in place,
  for a test that checks it).  A ``torch.Generator`` is the one argument that comes back
  changed: a call that draws from it moves it on, as a local call would.
* A result that is data comes back as a copy: tensors detached (same dtype and device, no
  gradient),
  mappings as ``dict``, other sequences as ``list``/``tuple``.  Anything else (a model, a
  data loader, a dataset) stays where it is and comes back as a reference to it.
* ``student.fetch(ref)`` evaluates a reference without calling it
  (``student.fetch(student.model.training)``); ``student.send(obj)`` puts a copy of a
  local object next to the notebook's code and returns a reference to it;
  ``with student.replaced(name=value): ...`` swaps a global of the notebook for the block;
  ``student.source`` reads the notebook's code (``coursekit.sourcecheck``).

Kernel to grader, nothing but JSON and safetensors travels (never pickle), in messages of
bounded size: whatever the student's code does, the grader only ever decodes data.

The protocol lives here, in one place, each half in a module of its own:

* ``codec``: the wire format, kernel to grader (JSON and safetensors, bounded; ``encode``,
  ``decode``) and its limits;
* ``refs``: references to the notebook's objects (``Ref``) and what every ``student`` offers;
* ``core``: what a request does on the notebook's side (``Core``), and how arguments are
  walked and copied;
* ``local``: ``student`` in the notebook (``LocalStudent``);
* ``server``: the request handler inside the kernel at grading time (``KernelServer``);
* ``client``: ``student`` in the grader's process (``RemoteStudent``), over any session that
  can carry a request to the kernel (``autograder.judge.kernel.KernelSession``).
"""
from __future__ import annotations

from .codec import (CALLBACK_PREFIX, MAX_HEADER_BYTES, MAX_NODES, MAX_REPLY_BYTES, MAX_TENSOR_BYTES, REPLY_MSG,
                    ProtocolError, StudentError, decode, encode, read_tensors)
from .core import Core
from .local import LocalStudent, local_student
from .refs import RESERVED, Ref
from .server import KernelServer, install_server

__all__ = ["Ref", "LocalStudent", "StudentError", "ProtocolError", "RESERVED", "local_student", "encode", "decode",
           "read_tensors", "Core", "KernelServer", "install_server", "CALLBACK_PREFIX", "REPLY_MSG",
           "MAX_HEADER_BYTES", "MAX_TENSOR_BYTES", "MAX_REPLY_BYTES", "MAX_NODES"]
