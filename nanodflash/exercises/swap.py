"""Loading a student's function from a file, and putting it in place of the library's for a check.

    fn = load_function("my_verify.py", "greedy_verify", original)   # StudentFileError: one clear line
    with swapped(original, fn):
        ...                       # every nanodflash module that held the original now holds fn

The swap replaces the function wherever the library holds it: in the module that defines it and in every
module that imported it by name (`from .verify import greedy_verify` binds a second name to the same
object), so the decoders call the student's piece. The checks' references use the originals, captured
before the swap.
"""

import contextlib
import importlib
import importlib.util
import inspect
import os
import pkgutil

import nanodflash

# modules a check never swaps into: the tools and the exercises themselves (they hold the references)
NOT_SWAPPED = ("nanodflash.tools", "nanodflash.exercises")


class StudentFileError(Exception):
    """A student's file that cannot be checked: missing, not Python, no such function, wrong signature."""


def load_function(path, name, original):
    """The function `name` defined in the Python file `path`, checked against the library's signature."""
    if not os.path.isfile(path):
        raise StudentFileError(f"no file {path!r} (run `python -m nanodflash.exercises start {name}` "
                               "to write a skeleton)")
    spec = importlib.util.spec_from_file_location(f"student_{name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise StudentFileError(f"{path}, line {e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:                        # an import or top-level statement that fails
        raise StudentFileError(f"{path} fails when it is loaded: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise StudentFileError(f"{path} defines no function named {name!r}")
    want, got = parameter_names(original), parameter_names(fn)
    if got != want:
        raise StudentFileError(f"{path}: {name}{signature_text(fn)} should take ({', '.join(want)}), "
                               "the library's parameters")
    changed = changed_defaults(fn, original)
    if changed:
        param, (mine, library) = next(iter(changed.items()))
        raise StudentFileError(f"{path}: {name}'s {param} defaults to {mine}, the library's to {library}; a "
                               "caller that leaves it out would get other behaviour than the library's, so "
                               "keep the library's default")
    return fn


def parameter_names(fn):
    return [p for p in inspect.signature(fn).parameters]


def changed_defaults(fn, original):
    """{parameter: (fn's default, original's default)} where both have one and the two differ (a missing
    default is no harm: a call that leaves the argument out then raises, and says which)."""
    mine, library = default_values(fn), default_values(original)
    empty = inspect.Parameter.empty
    given = [n for n in library if mine[n] is not empty and library[n] is not empty]
    return {n: (repr(mine[n]), repr(library[n])) for n in given if not same_default(mine[n], library[n])}


def default_values(fn):
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()}


def same_default(a, b):
    """The same default: one object, or equal numbers (temperature=1 for 1.0) or strings."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return a is b or ((numbers or all(isinstance(v, str) for v in (a, b))) and a == b)


def signature_text(fn):
    return str(inspect.signature(fn))


def core_modules():
    """Every module of the library the decoders run (imported here, so a swap reaches them all)."""
    names = [m.name for m in pkgutil.walk_packages(nanodflash.__path__, "nanodflash.")
             if not m.name.startswith(NOT_SWAPPED)]
    return tuple(importlib.import_module(n) for n in names)


@contextlib.contextmanager
def swapped(original, replacement):
    """Within the block, every core module attribute that is `original` is `replacement`."""
    places = [(m, attr) for m in core_modules() for attr, value in vars(m).items() if value is original]
    if not places:
        raise RuntimeError(f"{original.__qualname__} is held by no nanodflash module: nothing to swap")
    try:
        for module, attr in places:
            setattr(module, attr, replacement)
        yield places
    finally:
        for module, attr in places:
            setattr(module, attr, original)
