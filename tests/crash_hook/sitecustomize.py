"""Fault injection for tests/test_crash.py only: on the PYTHONPATH of the sidecars that test
starts, never installed with the package.

Why a `sitecustomize` and not a hook in the sidecar: production code carries no test switch.
Python imports this module at start-up in every process of that sidecar; it patches
`sidecar.workspace.watch.CurrentWatcher.get` (called by the supervisor's once-a-second tick) as
soon as that module is imported, so that the next call after the file named by
`SIDECAR_TEST_FAULT_FILE` appears raises once (the file is removed first): an uncaught
exception in the supervisor's event loop, as a bug would raise it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TRIGGER = os.environ.get("SIDECAR_TEST_FAULT_FILE")
TARGET = "sidecar.workspace.watch"


def _patch(module: ModuleType) -> None:
    assert TRIGGER is not None
    trigger = Path(TRIGGER)
    original = module.CurrentWatcher.get

    def get(self: Any) -> Any:
        try:
            trigger.unlink()
        except FileNotFoundError:
            return original(self)
        msg = "fault injected by tests/crash_hook/sitecustomize.py"
        raise RuntimeError(msg)

    module.CurrentWatcher.get = get


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if TRIGGER:
    sys.meta_path.insert(0, _Finder())
