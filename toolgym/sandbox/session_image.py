"""A Python session's namespace as bytes, and back: how a `PythonSession` is snapshotted.

This runs inside the session process, next to the model's code (standard library only; the
session loads it by file path and imports nothing from toolgym). `make_image(namespace,
folder)` pickles every name the session's code defined, all together, so that shared
references stay shared, and the files in the session's working folder; `load_image(namespace,
data, folder)` puts them into another session's namespace and folder.

What an image carries:
- functions, lambdas and classes the session's code defined, by value: their code objects
  (`marshal`), defaults, closures, attributes and, for classes, bases and members; they are
  rebuilt around the loading session's namespace;
- modules, by name (imported again where the image is loaded);
- a closed file as a closed placeholder (`with open(...) as f` leaves `f` behind);
- everything else as `pickle` carries it (instances of the session's classes included);
- the regular files under the session's working folder (where relative paths point), with
  their permission bits; not symbolic links, nor files elsewhere (`/tmp/x`).

What it cannot carry is named in `ImageError`: a generator, an open file, a socket, a thread,
a lock, a module the code built rather than imported, a class with a metaclass of its own.
Threads the code started are not part of an image.

An image is written by the model's code (it may have replaced anything here) and is only ever
loaded by another session, where the model's code runs anyway: the host keeps it as opaque
bytes and never unpickles it.
"""

from __future__ import annotations

import builtins
import importlib
import io
import marshal
import os
import pickle
import stat
import sys
import types
from typing import Any

_loading: dict[str, Any] | None = None
"""The namespace an image is being loaded into: the globals of the functions it rebuilds."""

_UNSET = "__toolgym_unset_cell__"
"""Stands for a closure cell with no value yet (a name assigned later in its scope)."""


class ImageError(Exception):
    """The namespace holds something an image cannot carry; the message names it."""


def make_image(namespace: dict[str, Any], folder: str, limit: int) -> bytes:
    """The namespace's names (all but `__builtins__`) and the files under `folder` as bytes,
    for `load_image`. An image over `limit` bytes is refused (`ImageError`) as soon as it
    passes it: making one holds at most the files read and `limit` bytes of pickle (then one
    copy of them) besides the state itself."""
    names = {name: value for name, value in namespace.items() if name != "__builtins__"}
    files = _files_under(folder, limit)
    try:
        return _dumps({"names": names, "files": files}, namespace, limit)
    except _OverLimit:
        over = f"the session's state is over the {limit:,} bytes an image may be here"
        raise ImageError(over) from None
    except Exception as error:
        culprits = []
        for name, value in names.items():
            try:
                _dumps(value, namespace, limit)
            except _OverLimit:
                continue
            except Exception as failure:
                culprits.append(f"{name} ({type(value).__name__}: {_short(failure)})")
        named = ", ".join(culprits) or _short(error)
        raise ImageError(f"the session's state cannot be copied: {named}") from None


def load_image(namespace: dict[str, Any], data: bytes, folder: str) -> None:
    """Put an image's names into `namespace` (functions and classes bound to it) and its
    files under `folder`."""
    global _loading
    _loading = namespace
    try:
        image = pickle.loads(data)
    finally:
        _loading = None
    if not (isinstance(image, dict) and {"names", "files"} <= image.keys()):
        raise ImageError("not a session image")
    for relative, (mode, content) in image["files"].items():
        parts = relative.split("/")
        if relative.startswith("/") or ".." in parts or "" in parts:
            raise ImageError(f"a file outside the working folder: {relative!r}")
        path = os.path.join(folder, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(content)
        os.chmod(path, mode)
    namespace.update(image["names"])


def _files_under(folder: str, limit: int) -> dict[str, tuple[int, bytes]]:
    """{path relative to `folder`: (permission bits, content)} of its regular files."""
    files: dict[str, tuple[int, bytes]] = {}
    total = 0
    for root, _, names in os.walk(folder):  # symbolic links to folders are not followed
        for name in names:
            path = os.path.join(root, name)
            status = os.lstat(path)
            if not stat.S_ISREG(status.st_mode):
                continue
            total += status.st_size
            if total > limit:
                raise ImageError(f"the files in the working folder are over {limit:,} bytes")
            with open(path, "rb") as file:
                content = file.read(status.st_size + 1)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            files[relative] = (stat.S_IMODE(status.st_mode), content)
    return files


class _OverLimit(Exception):
    pass


class _Bounded(io.BytesIO):
    """A buffer that refuses to grow past `limit` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: Any) -> int:
        if self.tell() + memoryview(data).nbytes > self.limit:
            raise _OverLimit
        return super().write(data)


def _dumps(value: Any, namespace: dict[str, Any], limit: int) -> bytes:
    buffer = _Bounded(limit)
    _Pickler(buffer, namespace).dump(value)
    return buffer.getvalue()


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 200 else text[:200] + "..."


class _Pickler(pickle.Pickler):
    """`pickle` with the session's own functions and classes carried by value."""

    def __init__(self, file: io.BytesIO, namespace: dict[str, Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.namespace = namespace

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is not obj:
                raise pickle.PicklingError(f"module {obj.__name__!r} was built, not imported")
            return importlib.import_module, (obj.__name__,)
        if isinstance(obj, types.FunctionType):
            if obj.__globals__ is self.namespace:
                return _function_reduction(obj, None)
            if not _importable(obj):  # a closure of a module's, a dataclass's __init__
                return _function_reduction(obj, _globals_of(obj))
        if isinstance(obj, type) and obj.__flags__ & _HEAP_TYPE and not _importable(obj):
            return _class_reduction(obj)
        if isinstance(obj, property):
            return property, (obj.fget, obj.fset, obj.fdel, obj.__doc__)
        if isinstance(obj, (classmethod, staticmethod)):
            return type(obj), (obj.__func__,)
        if isinstance(obj, io.IOBase) and obj.closed:  # `with open(...) as f` leaves f
            return _closed_file, ()
        if isinstance(obj, types.MappingProxyType):  # a dataclass field's metadata
            return _mapping_proxy, (dict(obj),)
        return NotImplemented


_HEAP_TYPE = 1 << 9
"""Py_TPFLAGS_HEAPTYPE: a class made at run time by a class statement (not a builtin type)."""


def _closed_file() -> io.IOBase:
    """A closed file stands for a closed file (what it was is of no use to anyone)."""
    placeholder = io.BytesIO()
    placeholder.close()
    return placeholder


def _mapping_proxy(mapping: dict[str, Any]) -> types.MappingProxyType[str, Any]:
    return types.MappingProxyType(mapping)


def _importable(thing: type | types.FunctionType) -> bool:
    """Whether `thing` is found again by its module and qualified name (pickled by reference)."""
    found: Any = sys.modules.get(thing.__module__)
    for part in thing.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is thing


def _globals_of(function: types.FunctionType) -> str | dict[str, Any]:
    """How a function's globals travel: a module's by the module's name, others (a
    dataclass's generated methods) copied without `__builtins__`."""
    name = function.__globals__.get("__name__")
    if isinstance(name, str) and vars(sys.modules.get(name, builtins)) is function.__globals__:
        return name
    return {k: v for k, v in function.__globals__.items() if k != "__builtins__"}


def _function_reduction(
    function: types.FunctionType, own_globals: str | dict[str, Any] | None
) -> tuple[Any, ...]:
    """`own_globals` None: the function's globals are the session's namespace, and it is
    rebuilt around the loading session's; else see `_globals_of`."""
    cells = function.__closure__ or ()
    state = {
        "defaults": function.__defaults__,
        "kwdefaults": function.__kwdefaults__,
        "cells": [_cell_value(cell) for cell in cells],
        "dict": dict(function.__dict__),
        "qualname": function.__qualname__,
        "module": function.__module__,
        "doc": function.__doc__,
        "annotations": dict(getattr(function, "__annotations__", None) or {}),
    }
    code = marshal.dumps(function.__code__)
    arguments = (code, function.__name__, len(cells), own_globals)
    return _new_function, arguments, state, None, None, _fill_function


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # empty
        return _UNSET


def _new_function(
    code: bytes, name: str, cells: int, own_globals: str | dict[str, Any] | None
) -> types.FunctionType:
    if own_globals is None:
        namespace = _loading
    elif isinstance(own_globals, str):
        namespace = vars(importlib.import_module(own_globals))
    else:
        namespace = {**own_globals, "__builtins__": builtins}
    if namespace is None:
        raise ImageError("a session function is rebuilt only by load_image")
    closure = tuple(types.CellType() for _ in range(cells)) or None
    return types.FunctionType(marshal.loads(code), namespace, name, None, closure)


def _fill_function(function: types.FunctionType, state: dict[str, Any]) -> None:
    function.__defaults__ = state["defaults"]
    function.__kwdefaults__ = state["kwdefaults"]
    for cell, value in zip(function.__closure__ or (), state["cells"], strict=True):
        if not (isinstance(value, str) and value == _UNSET):
            cell.cell_contents = value
    function.__dict__.update(state["dict"])
    function.__qualname__ = state["qualname"]
    function.__module__ = state["module"]
    function.__doc__ = state["doc"]
    function.__annotations__ = state["annotations"]


_CLASS_SLOTS = ("__dict__", "__weakref__")


def _class_reduction(cls: type) -> tuple[Any, ...]:
    if type(cls) is not type:
        raise pickle.PicklingError(
            f"class {cls.__qualname__} has a metaclass of its own ({type(cls).__name__})"
        )
    slots = cls.__dict__.get("__slots__")
    slot_names = {slots} if isinstance(slots, str) else set(slots or ())
    members = {
        name: value
        for name, value in cls.__dict__.items()
        if name not in _CLASS_SLOTS and name not in slot_names and name != "__slots__"
    }
    skeleton = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if slots is not None:
        skeleton["__slots__"] = slots
    return _new_class, (cls.__name__, cls.__bases__, skeleton), members, None, None, _fill_class


def _new_class(name: str, bases: tuple[type, ...], skeleton: dict[str, Any]) -> type:
    return type(name, bases, dict(skeleton))


def _fill_class(cls: type, members: dict[str, Any]) -> None:
    for name, value in members.items():
        if name in ("__module__", "__qualname__"):
            continue
        setattr(cls, name, value)
