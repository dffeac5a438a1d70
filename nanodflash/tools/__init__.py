"""Tooling around the algorithm, by purpose. Tools import nanodflash's core; the core never imports a tool.

    benchmarks   bench.py (python -m nanodflash.tools.bench), bench_batch.py, bench_tree.py; their core, the
                 methods run interleaved into rows (bench_run.py), the rows (bench_methods.py), the
                 printed table (bench_table.py), step costs timed in isolation
                 (draft_costs.py), where τ is lost (lost_tau.py), measuring helpers (measure.py) and
                 progress lines on stderr for long runs (progress.py); repetition.py: how much of a
                 text repeats itself, printed beside every τ; bench_peers.py: transformers' generate and
                 the official dflash_generate on the exported pair, rows beside ours
    step costs   calibrate.py (python -m nanodflash.tools.calibrate): chooses the threads and times a step
                 once per machine into the run folder's costs.json, the table block_size="auto" decides by
                 and the bench predicts from (ext/step_costs.py); step_timing.py: how a step is timed
                 (warm interleaved calls, a few block sizes); batch_timing.py: the batched decoder's steps
                 and starts, timed inside generations as the bench runs them;
                 cost_model.py (python -m nanodflash.tools.cost_model): a forward's seconds from its shape,
                 fitted here and checked on held-out points, priced on GPUs from datasheets
    evaluation   evaluate.py: how well a trained drafter drafts (per-slot accuracy, expected and measured τ)
    baselines    baselines.py (python -m nanodflash.tools.baselines): AR and no-feature drafters, trained;
                 baseline_report.py: what it prints, every drafter side by side; prompt_lookup.py:
                 drafting by copying, untrained
    Hugging Face hf.py (python -m nanodflash.tools.hf export): Qwen3 + official DFlash folders;
                 hf_tokenizer.py: tiktoken <-> tokenizer.json
    traces       watch.py: the path decoder's loop with each step timed and handed to a callback (the
                 benchmark, the race and the trace record with it); origins.py: which tokens the drafter
                 wrote, shown in the text (sample.py); trace.py: a run recorded step by step (sample.py
                 --html); trace_page.py: its HTML page;
                 race.py: plain and speculative lanes timed on one prompt (sample.py --race); race_page.py:
                 their page, which replays them side by side; whatif_panel.py: its what-if panel
    course       course.py (make course): the notebooks executed on a run's checkpoints, as HTML handouts;
                 production_map.py: checks docs/production.md's citations of production code
    scripts      sample_cli.py: sample.py's defaults and flags, the prompt it picks, the models and decoder
                 its flags choose
    flag checks  cli.py: argparse types shared by every script
"""
