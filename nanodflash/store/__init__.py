"""What nanodflash keeps on disk and reads back: the corpus (data.py), the tokenizer (tokenizer.py: a small
BPE in a tiktoken Encoding), checkpoints (checkpoint.py: `load` a run folder's models), the run folder's
layout and records (run_folder.py), and resuming an interrupted training run (resume.py). The core never
imports it; the scripts, the tools and the pipeline hand the core what it reads.
"""
