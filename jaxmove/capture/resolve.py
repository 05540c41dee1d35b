"""TARGET resolution: a zoo preset, an HLO file, ``module:function``, or a jax object -> ``Program``."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

from ..errors import JaxmoveInputError
from .errors import TargetError, UserCodeError, did_you_mean  # noqa: F401  (re-exported)

HLO_SUFFIXES = (".hlo", ".txt", ".hlo.txt")


# No longer raised (every walk is iterative); kept importable for code that catches it.
NestingTooDeepError = JaxmoveInputError


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

#: Preset names an error message lists before "... and N more; see `jaxmove models`".
SHOWN_PRESETS = 8


def preset_choices(limit: int = SHOWN_PRESETS) -> str:
    """The zoo's preset names for an error message, at most ``limit`` of them:
    ``mlp, mlp-tiny, ... and 18 more; see `jaxmove models```."""
    from jaxmove import zoo

    names = list(zoo.PRESETS)
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} ... and {len(names) - limit} more; see `jaxmove models`"


def check_plan_target(spec: str) -> None:
    """``--mesh``/``--plan`` (and ``jaxmove plans``) partition a Workload: ``spec`` must be a
    zoo preset or ``module:function``, not an HLO file (already compiled) nor an unknown name.

    Raises:
      TargetError: one line naming ``spec`` and what is expected.
    """
    from jaxmove import zoo

    s = os.fspath(spec)
    if s in zoo.PRESETS or (":" in s and not Path(s).exists()):
        return
    p = Path(s)
    if p.exists() or s.endswith(HLO_SUFFIXES) or os.sep in s:
        raise TargetError("--mesh/--plan need a zoo preset or a module:function returning a Workload "
                          f"with logical axes, not an HLO file ({s})")
    raise TargetError(f"unknown preset {s!r}{did_you_mean(s)}; presets: {preset_choices()} (or package.module:function "
                      "returning a Workload with logical axes)")


@contextlib.contextmanager
def _cwd_on_path():
    """Put the current directory first on ``sys.path`` (as ``python -m`` does) for the
    duration of the block, so ``jaxmove analyze mymod:fn`` finds ``./mymod.py``."""
    cwd = os.getcwd()
    added = not sys.path or sys.path[0] not in ("", cwd)
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            try:
                sys.path.remove(cwd)
            except ValueError:
                pass


@contextlib.contextmanager
def _user_code(spec: str):
    """Run user code (importing or calling a ``module:function`` TARGET): the current
    directory first on ``sys.path``, its prints sent to stderr (stdout carries jaxmove's
    report or JSON), and ``sys.exit`` turned into ``UserCodeError``."""
    with _cwd_on_path(), contextlib.redirect_stdout(sys.stderr):
        try:
            yield
        except SystemExit as e:
            raise UserCodeError(f"{spec} called sys.exit({e.code!r})") from None


def _user_code_error(spec: str, e: BaseException, user_file: str | None = None) -> UserCodeError:
    """One line for an exception raised by user code: ``SyntaxError`` as file:line:col, any
    other exception with the ``file:line`` of the innermost frame of ``user_file`` (the
    file of the target's function) in its traceback."""
    if isinstance(e, UserCodeError):  # already one line (e.g. ``sys.exit`` in user code)
        return e
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{e.filename}:{e.lineno or '?'}:{e.offset or '?'}"
        return UserCodeError(f"{where}: {type(e).__name__}: {e.msg} (importing target '{spec}')")
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, ImportError):   # an import inside the user's module (or function) failed
        where = _raising_line(e)
        missing = f" (module '{e.name}' is not installed for {sys.executable})" \
            if isinstance(e, ModuleNotFoundError) and e.name else ""
        return UserCodeError(f"{spec}: an import failed{' at ' + where if where else ''}: "
                             f"{type(e).__name__}: {msg}{missing}")
    where = _raising_line(e, user_file) if user_file else ""
    return UserCodeError(f"{spec} raised {type(e).__name__}" + (f": {msg}" if msg else "")
                         + (f" (at {where})" if where else ""))


def _code_file(obj) -> str | None:
    """The source file of a function (or of a callable's ``__call__``), None when unknown."""
    code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__call__", None), "__code__", None)
    return getattr(code, "co_filename", None)


def _raising_line(e: BaseException, user_file: str | None = None) -> str:
    """``file:line`` of the innermost frame of ``e``'s traceback in ``user_file`` (when
    given) or else outside Python's import machinery (the user's ``import`` statement), the
    file relative to the current directory when below it; "" when there is none."""
    tb, last = e.__traceback__, None
    want = os.path.realpath(user_file) if user_file else None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if want is not None:
            if os.path.realpath(name) == want:
                last = (name, tb.tb_lineno)
        elif not name.startswith("<frozen") and "importlib" not in name.replace(os.sep, "/").split("/")[-2:-1]:
            last = (name, tb.tb_lineno)
        tb = tb.tb_next
    if last is None:
        return ""
    name, line = last
    if os.path.isabs(name) and name.startswith(os.getcwd() + os.sep):
        name = os.path.relpath(name)
    return f"{name}:{line}"


def _load_function(spec: str):
    """``package.module:function`` or ``path/file.py:function`` -> the function object.

    The module is imported with the current directory first on ``sys.path``.

    Raises:
      TargetError: malformed spec, module not found, no such attribute.
      UserCodeError: importing the module raised (SyntaxError included).
      FileNotFoundError: ``file.py`` does not exist.
    """
    mod_name, _, fn_name = spec.rpartition(":")
    is_path = mod_name.endswith(".py") or os.sep in mod_name
    if not fn_name.isidentifier() or not mod_name or (not is_path and not _DOTTED.fullmatch(mod_name)):
        raise TargetError(f"target '{spec}': expected package.module:function or "
                          "path/file.py:function (one ':' followed by a Python name)")
    if is_path:
        path = Path(mod_name)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (from target '{spec}')")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules.setdefault(path.stem, module)
        try:
            with _user_code(spec):
                module_spec.loader.exec_module(module)
        except Exception as e:
            raise _user_code_error(spec, e) from e
    else:
        try:
            with _user_code(spec):
                module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
                raise TargetError(f"target '{spec}': no module named '{e.name}' (looked in the "
                                  f"current directory {os.getcwd()} and sys.path)") from None
            raise _user_code_error(spec, e) from e
        except Exception as e:
            raise _user_code_error(spec, e) from e
    try:
        return getattr(module, fn_name)
    except AttributeError:
        raise TargetError(f"{mod_name} has no function '{fn_name}' (from target '{spec}')") from None


_TARGET_TYPES = "a jaxmove.workload.Workload, a jax.stages.Lowered or a jax.stages.Compiled"


def _describe(obj) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    if callable(obj):
        return f"a function ({getattr(obj, '__qualname__', type(obj).__name__)})"
    if obj is None:
        return "None"
    tname = type(obj).__name__
    return f"{'an' if tname[:1].lower() in 'aeiou' else 'a'} {tname}"


def load_target(spec: str):
    """Import and call a ``module:function`` TARGET; return what it made.

    The function is called with no arguments and must return a Workload, a
    ``jax.stages.Lowered`` or a ``jax.stages.Compiled``. A jitted function
    (``jax.jit(f)``, has ``.lower``) taking no arguments is returned as is.

    Raises:
      TargetError: bad spec, missing module or attribute, a function that needs
        arguments, a value of the wrong type.
      UserCodeError: the module or the function raised (message ``<spec> raised
        <Type>: <message>``).
      FileNotFoundError: a ``file.py`` that does not exist.
    """
    import jax

    from .program import Program
    from .workload import Workload

    obj = _load_function(spec)
    ok = (Workload, jax.stages.Lowered, jax.stages.Compiled, Program)
    if isinstance(obj, ok):
        return obj
    if not callable(obj) or isinstance(obj, type):
        raise TargetError(f"target '{spec}' is {_describe(obj)}, not a function returning {_TARGET_TYPES}")
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        needed = [p.name for p in sig.parameters.values() if p.default is p.empty
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if needed:
            raise TargetError(f"target '{spec}' needs arguments ({', '.join(needed)}); a "
                              f"module:function target is called with none and must return {_TARGET_TYPES}")
    if hasattr(obj, "lower"):  # jax.jit(f) of no arguments: captured as it is
        return obj
    try:
        with _user_code(spec):
            made = obj()
    except Exception as e:
        raise _user_code_error(spec, e, _code_file(obj)) from e
    if not isinstance(made, ok):
        raise TargetError(f"target '{spec}' returned {_describe(made)}; expected {_TARGET_TYPES}")
    return made


def resolve_program(obj, /, *args, overrides: dict[str, str] | None = None, **capture_kwargs):
    """Turn any TARGET into a captured ``Program``.

    TARGET is a zoo preset name, a path to an HLO text file or to an XLA dump directory
    (``--xla_dump_to``; ``module=NAME`` picks one of several modules, capture/dumps.py),
    ``module:function`` or
    ``file.py:function`` (the function is called with no arguments and must return a
    Workload, a ``jax.stages.Lowered``/``Compiled``), a Workload, a Program, or anything
    ``jaxmove.capture.capture`` accepts (a callable with ``args``, a Flax NNX module...).
    ``capture_kwargs`` go to ``capture``; ``target=NAME`` (capture/targets.py) compiles for
    that device (an HLO file or a Program is already compiled: a ``target`` other than
    ``cpu`` is refused for an HLO file).

    Raises:
      FileNotFoundError: a path that does not exist.
      TargetError: a string that is neither a preset, a file nor ``module:function``.
      TargetNameError, MissingExtraError, DoesNotFitError: see ``capture``.
    """
    from . import program as cap

    dump_module = capture_kwargs.pop("module", None)   # --module: one module of a dump directory
    _check_capture_options(capture_kwargs, cap.capture)
    target = obj
    device_target = capture_kwargs.get("target")
    if dump_module is not None and not isinstance(target, (str, os.PathLike)):
        raise TargetError("module= names a module of an XLA dump directory; the target is not a path")
    if isinstance(target, (cap.Program, str, os.PathLike)) and args:
        raise TargetError(f"{len(args)} positional argument(s) after "
                          f"{'a Program' if isinstance(target, cap.Program) else repr(os.fspath(target))}: "
                          "arguments go with a callable (analyze(f, *args)); a preset, HLO file, "
                          "module:function or Program takes none")
    if isinstance(target, cap.Program):
        return target
    if isinstance(target, (str, os.PathLike)):
        s = os.fspath(target)
        if dump_module is not None and not Path(s).exists():
            raise TargetError(f"--module names a module of an XLA dump directory; '{s}' is no such path")
        # an HLO file by its suffix (no preset name has one): the zoo, and Flax with it, is not
        # imported to look the name up (0.4 s of `jaxmove analyze file.hlo`)
        hlo_file = s.endswith(HLO_SUFFIXES) and Path(s).is_file()
        if not hlo_file:
            from jaxmove import zoo as models

            if s in models.PRESETS:
                return cap.capture(models.build(s, overrides or {}), **capture_kwargs)
        if overrides:
            raise TargetError(f"--set applies to zoo presets only, not to '{s}'")
        if ":" in s and not Path(s).exists():
            made = load_target(s)
            if isinstance(made, cap.Program):
                return made
            try:
                with _user_code(s):  # tracing runs the user's function again
                    return cap.capture(made, **capture_kwargs)
            except (ValueError, TargetError):
                raise
            except Exception as e:  # tracing / lowering the user's function failed
                fn = getattr(made, "fn", made)
                where = _raising_line(e, _code_file(fn)) if _code_file(fn) else ""
                raise UserCodeError(f"{s}: compiling what it returned raised {type(e).__name__}: "
                                    f"{(str(e).strip().splitlines() or [''])[0]}"
                                    f"{' (at ' + where + ')' if where else ''}") from e
        p = Path(s)
        if s.endswith(".py") and p.is_file():   # (not HLO: Python that returns a program)
            raise TargetError(f"'{s}' is a Python file: name the function that returns the program, "
                              f"'{s}:FUNCTION' (README: module:function targets)")
        if p.exists() or s.endswith(HLO_SUFFIXES) or os.sep in s:
            from .dumps import program_from_dump, with_name_backend
            if p.is_dir() or dump_module is not None:   # an --xla_dump_to directory
                return program_from_dump(p, dump_module)
            program = cap.program_from_hlo_file(p)
            if device_target is not None and str(device_target).lower() != "cpu":
                from .targets import TargetNameError
                raise TargetNameError(f"--target {device_target}: {s} is an HLO file, already compiled "
                                      f"(for {program.backend}); --target applies to zoo presets and "
                                      "module:function targets")
            return with_name_backend(program, p)
        raise TargetError(f"'{s}' is not a zoo preset{did_you_mean(s)} ({preset_choices()}), an HLO file, or "
                          "module:function")
    if overrides:
        raise TargetError(f"overrides ({', '.join(sorted(overrides))}) apply to zoo presets only, not to "
                          f"{type(target).__name__} {getattr(target, '__name__', '')!s}".rstrip()
                          + ": pass the sizes in the arguments you give it")
    return cap.capture(target, *args, **capture_kwargs)


def _check_capture_options(options: dict, capture_fn) -> None:
    """Refuse a keyword that ``capture`` does not take, naming the ones it does (TypeError:
    otherwise Python's message names an internal function, not the one the user called)."""
    import inspect

    allowed = [n for n, p in inspect.signature(capture_fn).parameters.items()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(repr(k) for k in unknown)}; the capture options are "
                        f"{', '.join(allowed + ['module'])} (and overrides, hardware, role_globs for analyze)")
