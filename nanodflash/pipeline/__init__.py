"""What train_tiny.py runs on besides the core: its recipe (recipe.py: every flag's default and the --full
and --smoke presets), its flags (flags.py), each stage's record and reuse rule (record.py), and the summary
it prints at the end (summary.py). Only train_tiny.py, the tests and the notebooks import this subpackage;
it imports the core and the tools, never the other way round.
"""
