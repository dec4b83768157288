"""Whether a job's entrypoint can start, checked at submission without running any of the user's code.

A job whose script is misspelled (``python trian.py``) would otherwise be queued, placed and started,
and fail at run time with ``can't open file``. What can be known beforehand is checked here:

- a script (``python train.py``, ``train.py``, ``./run.sh``) exists relative to the working directory
  the attempt runs in (the spec's ``workdir``, which ``load_spec`` resolves against the spec's folder);
- the top package of a ``module:function`` or ``python -m pkg.mod`` entrypoint can be found
  (``PathFinder.find_spec`` on its folders, then the installed finders: nothing of the user's is
  imported, so no package's ``__init__`` runs); a ``module:function`` without a ``workdir`` runs in
  the scheduler's folder, so only the Python path counts for it, and a module found in the submitting
  shell's folder alone is a warning;
- a program named without a folder is on ``PATH`` (the spec's ``env`` one, where it sets one).

The files are where the attempt runs: this machine for the local backend, a cluster's nodes for
Slurm and Ray, where a problem found here is only a warning (:func:`entrypoint_problem` is the
same check; the caller decides).
"""

from __future__ import annotations

import difflib
import importlib.machinery
import os
import shutil
import sys
from pathlib import Path

from gpufleet.jobs.protocol import PYTHON_RE
from gpufleet.spec import JobSpec

VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})
"""Interpreter options that take the next argument as their value (``python -W ignore train.py``)."""


def entrypoint_problem(spec: JobSpec) -> str | None:
    """Why the entrypoint of ``spec`` cannot start, in one line naming the fix; ``None`` when it can.

    Without a ``workdir`` (a ``module:function``) the current folder counts as the attempt's: it is the
    scheduler's when this shell starts it (:func:`entrypoint_warning` says when only that folder has it).
    """
    folder = Path(spec.workdir) if spec.workdir else Path.cwd()
    paths = _python_path(spec, folder)
    target = spec.callable_entrypoint
    if target is not None:
        return _module_problem(target.split(":")[0], paths, folder)
    argv = spec.command or []
    if PYTHON_RE.match(argv[0]):
        return _python_problem(argv[1:], folder, paths)
    if argv[0].endswith(".py") or os.sep in argv[0]:
        return _script_problem(argv[0], folder) or _exec_problem(argv[0], folder)
    path = spec.env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(argv[0], path=path) is None:
        return f"entrypoint: program {argv[0]!r} is not on PATH: install it, or give its path"
    return None


def entrypoint_warning(spec: JobSpec) -> str | None:
    """A ``module:function`` whose module is in the current folder alone, and the spec sets no ``workdir``.

    The attempt imports it where the scheduler runs, which is this folder only when this shell started
    the scheduler: it may start today and fail with ``No module named`` tomorrow.
    """
    target = spec.callable_entrypoint
    if target is None or spec.workdir is not None:
        return None
    top = target.split(":")[0].split(".")[0]
    folder = Path.cwd()
    if _found(top, [str(folder)]) and not _found(top, _python_path(spec, None)):
        return (
            f"entrypoint: module {top!r} is in {folder} but not on the Python path, and the spec sets no workdir: "
            "set workdir to its folder (workdir: . for the spec's), or install it"
        )
    return None


def _python_path(spec: JobSpec, folder: Path | None) -> list[str]:
    """Where the attempt's interpreter looks for a module: its folder, the spec's PYTHONPATH, gpufleet's own.

    gpufleet's own leaves out the folder this command was started in (``python -m`` puts it first):
    the attempt's folder is ``folder``. Without one (where the scheduler runs), a relative PYTHONPATH
    entry cannot be placed and is left out.
    """
    extra = [p for p in spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")).split(os.pathsep) if p]
    here = Path.cwd().resolve()
    own = [p for p in sys.path if p and Path(p).resolve() != here]
    if folder is None:
        return [p for p in extra if os.path.isabs(p)] + own
    return [str(folder), *(str(folder / p) for p in extra), *own]


def _python_problem(args: list[str], folder: Path, paths: list[str]) -> str | None:
    """``python [options] SCRIPT`` or ``python -m MODULE``: the script or the module's top package."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-c" or arg == "-":
            return None  # code given inline or on stdin: nothing on disk to check
        if arg == "-m":
            return _module_problem(args[i + 1], paths, folder) if i + 1 < len(args) else None
        if arg in VALUE_OPTIONS:
            i += 2
            continue
        if not arg.startswith("-"):
            return _script_problem(arg, folder)
        i += 1
    return None


def _script_problem(script: str, folder: Path) -> str | None:
    path = folder / script
    if path.is_file():
        return None
    near = _near(Path(script).name, path.parent)
    guess = f" (did you mean {str(Path(script).with_name(near))!r}?)" if near else ""
    return f"entrypoint: script {script!r} not found in {path.parent}{guess}"


def _exec_problem(script: str, folder: Path) -> str | None:
    """A script that exists but cannot be executed as the command: a bare name is looked up on PATH."""
    if os.sep not in script:
        return f"entrypoint: {script!r} is run as a program, looked up on PATH: write 'python {script}'"
    if not os.access(folder / script, os.X_OK):
        return f"entrypoint: {script!r} is not executable: write 'python {script}', or chmod +x it"
    return None


def _near(name: str, folder: Path) -> str | None:
    """The file of ``folder`` whose name is closest to ``name`` (difflib), if one is close."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
    except OSError:
        return None
    close = difflib.get_close_matches(name, names, n=1)
    return close[0] if close else None


def _module_problem(module: str, paths: list[str], folder: Path) -> str | None:
    """The top package of ``module`` can be found without importing anything of the user's."""
    top = module.split(".")[0]
    if _found(top, paths):
        return None
    names = {p.name.removesuffix(".py") for p in _entries(folder)}
    close = difflib.get_close_matches(top, sorted(names), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"entrypoint: module {top!r} not found in {folder} nor on the Python path{guess}: "
        "set workdir to the folder that holds it, or install it"
    )


def _found(top: str, paths: list[str]) -> bool:
    """Whether the top-level module ``top`` is built in, loaded, on ``paths``, or found by an installed finder.

    ``PathFinder`` looks in folders only; a package installed in editable mode by setuptools is found by
    a finder of its own on ``sys.meta_path``, asked too. Neither imports the module: a top-level name has
    no parent package whose ``__init__`` would run.
    """
    if top in sys.builtin_module_names or top in sys.modules or importlib.machinery.PathFinder.find_spec(top, paths):
        return True
    for finder in sys.meta_path:
        if isinstance(finder, type) and issubclass(finder, importlib.machinery.PathFinder):
            continue  # its folders are gpufleet's sys.path, searched above with the attempt's own
        find = getattr(finder, "find_spec", None)
        try:
            if find is not None and find(top, None) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _entries(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()]
    except OSError:
        return []


__all__ = ["entrypoint_problem", "entrypoint_warning"]
