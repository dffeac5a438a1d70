"""make course (nanodflash/tools/course.py): executed HTML handouts, and student copies without solutions."""

import importlib
import re
import shlex
from pathlib import Path

import nbformat
import pytest

from nanodflash.tools.course import NOTEBOOKS, execute, without_solutions, write_html


def test_student_copies_leave_out_exactly_the_solution_cells():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## Exercises\n\n1. **One.**"),
        nbformat.v4.new_markdown_cell("## Solutions\n\n(run by the tests)"),
        nbformat.v4.new_code_cell("answer = 42"),
        nbformat.v4.new_markdown_cell("### a sub-heading inside the solutions"),
        nbformat.v4.new_code_cell("print(answer)"),
        nbformat.v4.new_markdown_cell("## Build it yourself"),
        nbformat.v4.new_code_cell("pass")])
    student = without_solutions(nb)
    kept = [c.source.splitlines()[0] for c in student.cells]
    assert kept == ["## Exercises", "## Solutions", "## Build it yourself", "pass"], \
        f"student copy kept {kept}"
    assert "Left out" in student.cells[1].source and student.cells[1].cell_type == "markdown", \
        "the solutions' place must say they were left out, and hold no code"
    assert len(nb.cells) == 7, "the original notebook must not change"


def test_a_notebook_executes_in_notebooks_on_the_run_folder_into_readable_html(smoke_out, tmp_path):
    # a notebook of its own (test_notebooks.py runs the course's, in-process): a real kernel that must see
    # the run folder and run in notebooks/, and a solution to leave out
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os\nprint(os.environ['NANODFLASH_OUT'])\nprint(os.getcwd())"),
        nbformat.v4.new_markdown_cell("## Solutions"),
        nbformat.v4.new_code_cell("# Prefill in two chunks\nprint('solved')")])
    nbformat.write(nb, tmp_path / "mine.ipynb")
    nb = execute(tmp_path / "mine.ipynb", smoke_out)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs and not any(o.output_type == "error" for o in outputs), f"an error, or none: {outputs}"
    assert nb.cells[0].outputs[0].text.split() == [str(smoke_out.resolve()), str(NOTEBOOKS)], \
        "the kernel must run in notebooks/ with NANODFLASH_OUT set to the run folder"
    write_html(nb, tmp_path / "mine.html")
    write_html(without_solutions(nb), tmp_path / "mine.student.html")
    full, student = (tmp_path / "mine.html").read_text(), (tmp_path / "mine.student.html").read_text()
    assert "Prefill in two chunks" in full and "solved" in full, "the handout must show code and outputs"
    assert "Prefill in two chunks" not in student, "the student copy must leave the solutions out"
    assert "Left out of this student copy" in student, "the student copy must say where the solutions went"


# Every command docs/course.md gives a lecturer or a student, as written: `make TARGET`, `.venv/bin/python
# SCRIPT|-m MODULE ...` and `python3 -m pip ...` in backticks.
COURSE = Path(__file__).resolve().parents[1] / "docs" / "course.md"
COMMAND = re.compile(r"`((?:NANODFLASH_OUT=\S+ )?(?:make|\.venv/bin/python|python3) [^`]*)`")


def course_commands():
    return sorted(c for c in set(COMMAND.findall(COURSE.read_text())) if not c.endswith(" ..."))  # a pattern


def test_every_make_command_of_the_course_is_a_target_of_the_makefile():
    targets = set(re.findall(r"^([a-z]+):", (COURSE.parents[1] / "Makefile").read_text(), re.M))
    made = [c.split("make ", 1)[1].split()[0] for c in course_commands() if " make " in f" {c}"]
    assert made, "the course gives no make command"
    missing = [t for t in made if t not in targets]
    assert not missing, f"docs/course.md runs make targets the Makefile lacks: {missing}"


def flags_accepted(argv, capsys):
    """The flags `argv` (a script or -m module and its arguments) uses that its --help does not list."""
    if argv[0] == "-m":
        module = importlib.import_module(argv[1])
        if hasattr(module, "__path__"):                            # `-m package` runs its __main__
            module = importlib.import_module(argv[1] + ".__main__")
        main, args = module.main, argv[2:]
        if args and not args[0].startswith("-"):
            main, args = (lambda a, sub=args[0], f=main: f([sub, *a])), args[1:]    # a subcommand's flags
    else:
        main, args = importlib.import_module(argv[0].removesuffix(".py")).main, argv[1:]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0, f"{argv}: --help failed"
    shown = capsys.readouterr().out
    listed = set(re.findall(r"(?<![\w-])--[\w-]+", shown))
    return [a for a in args if a.startswith("--") and a not in listed]


def test_every_python_command_of_the_course_uses_flags_its_program_has(capsys):
    commands = [c for c in course_commands() if c.startswith(".venv/bin/python ")]
    assert len(commands) >= 5, f"the course gives fewer commands than it did: {commands}"
    for command in commands:
        unknown = flags_accepted(shlex.split(command)[1:], capsys)
        assert not unknown, f"docs/course.md: `{command}` uses flags its program does not have: {unknown}"


def test_the_labs_start_and_check_commands_run_as_written(tmp_path, monkeypatch, capsys):
    from nanodflash.exercises.__main__ import main
    runs = [shlex.split(c)[3:] for c in course_commands() if c.startswith(".venv/bin/python -m "
                                                                          "nanodflash.exercises ")]
    assert {r[0] for r in runs} >= {"start", "check"}, f"the labs' commands are gone: {runs}"
    monkeypatch.chdir(tmp_path)
    for args in sorted(runs, key=lambda r: r[0] != "start"):        # every start before its check
        code = main(args)
        said = capsys.readouterr().out
        if args[0] == "start":
            assert (tmp_path / f"{args[1]}.py").exists(), f"`{' '.join(args)}` wrote no skeleton: {said}"
        else:                                         # the untouched skeleton fails, naming what is missing
            assert code == 1 and "raised NotImplementedError" in said, f"`{' '.join(args)}` -> {code}: {said}"
