"""python -m nanodflash.exercises [start NAME [FILE] | check NAME FILE | hint NAME LEVEL]: see __init__.py."""

import argparse
import os
import sys

import torch

from .catalog import BY_NAME, EXERCISES, skeleton
from .check import run_checks
from .hints import hint, which_hint
from .swap import StudentFileError, load_function


def list_exercises(out=sys.stdout):
    print(f"{'exercise':<22} {'min':>3}  what you write\n{'':<22} {'':>3}  taught in", file=out)
    for e in EXERCISES:
        print(f"{e.name:<22} {e.minutes:>3}  {e.what}\n{'':<22} {'':>3}  {e.notebook}", file=out)
    print("\nstart one: python -m nanodflash.exercises start NAME   (writes NAME.py here)\n"
          "check it:  python -m nanodflash.exercises check NAME NAME.py", file=out)


def start(name, path):
    if os.path.exists(path):
        sys.exit(f"{path} exists already: edit it, or give another file name "
                 f"(python -m nanodflash.exercises start {name} OTHER.py)")
    with open(path, "w") as f:
        f.write(skeleton(BY_NAME[name]))
    print(f"wrote {path}: fill in {name}, then run\n"
          f"    python -m nanodflash.exercises check {name} {path}")


def check(name, path, first=False):
    exercise = BY_NAME[name]
    try:
        fn = load_function(path, name, exercise.original())
    except StudentFileError as e:
        sys.exit(f"cannot check {name}: {e}")
    print(f"checking {name} from {path}: {len(exercise.claims)} claims\n")
    results = run_checks(exercise, fn, path, out=sys.stdout, until=(lambda message: True) if first else None)
    if all(m is None for _, m in results):
        return 0
    level, why = which_hint(*next((claim, m) for claim, m in results if m is not None))
    command = f": python -m nanodflash.exercises hint {name} {level}" if level else ""
    print(f"The first failure: {why}{command}.\nHints, one level at a time: python -m nanodflash.exercises "
          f"hint {name} 1 (the idea), 2 (the steps), 3 (the code)")
    return 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m nanodflash.exercises",
                                description="Write the library's pieces yourself; its guarantees check them.")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("start", help="write a skeleton NAME.py to fill in")
    s.add_argument("name", choices=list(BY_NAME), metavar="NAME")
    s.add_argument("file", nargs="?", help="where to write it (default: NAME.py)")
    c = sub.add_parser("check", help="check your NAME in FILE against the library's claims")
    c.add_argument("name", choices=list(BY_NAME), metavar="NAME")
    c.add_argument("file")
    c.add_argument("--first", action="store_true", help="stop at the first claim that fails (quicker "
                   "feedback while you work; without it every claim runs)")
    h = sub.add_parser("hint", help="a hint for NAME: LEVEL 1 the idea, 2 the steps, 3 the code")
    h.add_argument("name", choices=list(BY_NAME), metavar="NAME")
    h.add_argument("level", type=int, choices=(1, 2, 3), metavar="LEVEL")
    args = p.parse_args(argv)
    torch.set_num_threads(1)                       # tiny models: threads only add overhead
    if args.command is None:
        list_exercises()
        return 0
    if args.command == "hint":
        text = hint(BY_NAME[args.name], args.level)
        if args.level == 3:                   # the code on lines of its own, to paste as it stands
            text = f"the code, to put in place of `raise NotImplementedError` in your file:\n\n{text}"
        print(f"{args.name}, hint {args.level} of 3: {text}", end="" if text.endswith("\n") else "\n")
        return 0
    if args.command == "start":
        start(args.name, args.file or f"{args.name}.py")
        return 0
    return check(args.name, args.file, args.first)


if __name__ == "__main__":
    sys.exit(main())
