"""Tooling around the algorithm: the benchmark and its parts, the training summary, baselines, prompt lookup,
Hugging Face interop and command-line checks. Tools import nanodflash's core; the core never imports a tool."""
