"""make course (nanodflash/tools/course.py): executed HTML handouts, and student copies without solutions."""

import nbformat

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


def test_a_notebook_executes_on_a_run_folder_into_readable_html(smoke_out, tmp_path):
    nb = execute(NOTEBOOKS / "01_target_and_kv_cache.ipynb", smoke_out)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs and not any(o.output_type == "error" for o in outputs), "no outputs, or an error"
    write_html(nb, tmp_path / "01.html")
    write_html(without_solutions(nb), tmp_path / "01.student.html")
    full, student = (tmp_path / "01.html").read_text(), (tmp_path / "01.student.html").read_text()
    solution = "Prefill in two chunks"                      # the first solution cell's comment
    assert solution in full and solution not in student, "the student copy must leave the solutions out"
    assert "Left out of this student copy" in student, "the student copy must say where the solutions went"
