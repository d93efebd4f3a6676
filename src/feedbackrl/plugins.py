"""User code a recipe names: ``"package.module:name"`` or ``"path/to/file.py:name"``, and the entry points of
installed packages (the groups ``feedbackrl.tasks`` and ``feedbackrl.rewards``).

A module reference is imported as Python imports it (``sys.path``, so the current directory when run as
``python -m``, and installed packages). A file path (it ends in ``.py`` before the colon) is relative to the
current directory; the file is loaded once per process under a module name derived from its absolute path,
so validating a recipe and building its run do not run it twice. Either way the code runs in this process,
with this process's rights: it is the user's own code, as trusted as the recipe that names it.

An installed package adds tasks and reward sources by declaring entry points, e.g. in its pyproject.toml::

    [project.entry-points."feedbackrl.tasks"]
    my_task = "my_package.tasks:MyTask"
    [project.entry-points."feedbackrl.rewards"]
    my_reward = "my_package.rewards:score"

Names are found without importing anything (the packages' metadata); an entry point is loaded when a recipe
names it, or when `feedbackrl tasks` lists it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from feedbackrl.config import ConfigError

TASK_GROUP = "feedbackrl.tasks"
REWARD_GROUP = "feedbackrl.rewards"


def is_reference(name: str) -> bool:
    """Whether `name` points at user code (``module:attr`` or ``file.py:attr``) rather than a registry name."""
    return ":" in name


def load_object(ref: str, field: str) -> Any:
    """The object ``ref`` (``package.module:name`` or ``path/to/file.py:name``, dotted attributes allowed
    after the colon) names; a ConfigError naming `field` and the fix when it cannot be found."""
    module_part, _, attr = ref.rpartition(":")
    if not module_part or not attr:
        raise ConfigError(f"{field} = {ref!r}: expected 'package.module:name' or 'path/to/file.py:name'")
    module = _load_file(module_part, ref, field) if module_part.endswith(".py") else _import(module_part, ref, field)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise ConfigError(f"{field} = {ref!r}: {module_part!r} has no attribute {attr!r}; its public names: "
                              f"{names[:30]}")
        obj = getattr(obj, part)
    return obj


def _import(module_name: str, ref: str, field: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # the module itself (or a package above it) is missing, not one it imports
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigError(f"{field} = {ref!r}: no module named {module_name!r} on sys.path; install its package, "
                              "run from the directory that holds it, or name its file ('path/to/file.py:name')") \
                from None
        raise _import_error(ref, field, e) from e
    except Exception as e:  # the user's module failed while it was imported
        raise _import_error(ref, field, e) from e


def _load_file(path_text: str, ref: str, field: str) -> Any:
    path = Path(path_text).resolve()
    if not path.is_file():
        raise ConfigError(f"{field} = {ref!r}: no file {str(path)!r} (a file path is relative to the current "
                          f"directory, {str(Path.cwd())!r})")
    name = f"feedbackrl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{field} = {ref!r}: {str(path)!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as import does (dataclasses and pickling look it up)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise _import_error(ref, field, e) from e
    return module


def _import_error(ref: str, field: str, e: BaseException) -> ConfigError:
    import traceback

    trace = "".join(traceback.format_exception(e)).rstrip()
    return ConfigError(f"{field} = {ref!r}: importing it raised {type(e).__name__}: {e}\n{trace}")


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The installed entry points of `group` by name (the first one wins when two packages use a name)."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=group):
        found.setdefault(ep.name, ep)
    return found


def load_entry_point(group: str, name: str, field: str) -> Any:
    """The object entry point `name` of `group` refers to; a ConfigError with its traceback if loading fails."""
    ep = entry_points(group)[name]
    try:
        return ep.load()
    except Exception as e:
        dist = f" (package {ep.dist.name})" if ep.dist is not None else ""
        raise _import_error(f"{ep.value}{dist}", f"{field} {name!r}, entry point of group {group!r}", e) from e
