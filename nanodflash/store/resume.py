"""Resumable training stages: the loop's whole state, saved every RESUME_EVERY_S seconds and at Ctrl-C.

A stage checkpoint (target.pt, drafter.pt) is written once, when its stage ends. While a stage trains,
`Resume` keeps a second file next to it, `<stage checkpoint>.resume`, with everything the loop needs to
go on exactly where it was:

    model and optimizer state, the number of steps done, the history so far,
    every random generator the loop draws from (its own data-order generator, torch's global one),
    the settings the stage started with (steps, batch, lr, a hash of the data, the model's config, ...)

Rerunning the same command restores all of it and continues at the next step. Since every source of
randomness comes back as it was, the run ends with the same weights, bit for bit, as a run that was
never interrupted (same machine, same thread count). A file written with other settings is refused
with a message naming what differs; a corrupt or truncated one is reported and the stage starts over.
Saving is atomic (checkpoint.atomic_save), and saving the stage checkpoint deletes the file.

Ctrl-C, SIGTERM (`kill PID`) and SIGHUP (a closed terminal) are deferred to the end of the current step:
the step finishes, the state is saved, and then KeyboardInterrupt is raised as for Ctrl-C. A second one
stops at once (the last periodic save stands). A process killed outright (kill -9, a closed lid) loses at
most RESUME_EVERY_S seconds of training.

    resume = Resume(path, "target", settings, model=model, optimizer=opt, data_order=g, history=history)
    train_target(..., resume=resume_file(path))    # what the training loops (train.py) take: a maker of one
    first = resume.restore(steps)                  # 0, or the step the file was saved after
    with resume.deferring_stop():
        for step in range(first, steps):
            ...                                    # one training step
            resume.step_done(step + 1)             # saves when due, and at Ctrl-C
"""

import contextlib
import functools
import hashlib
import os
import signal
import sys
import time

import torch

from ..gpt import GPT
from .checkpoint import atomic_save, fingerprint

RESUME_EVERY_S = 45.0   # seconds of training at most lost to a kill; each save costs well under a second
# the signals that save and stop a stage: Ctrl-C, `kill` and a closed terminal
# (SIGHUP does not exist on Windows)
STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])


def data_hash(*tensors):
    """A short hash of tensors' contents: a resume file records which data its stage trained on."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def hashed(settings):
    """settings with the data in them as short hashes: a tensor, or a tuple of tensors (hashed together), and
    a target (its fingerprint); lists item by item.

    >>> hashed({"data": (torch.zeros(2), torch.ones(2)), "long": [torch.zeros(2), 4], "lr": 0.1})["long"][1:]
    [4]
    """
    def one(v):
        if isinstance(v, GPT):
            return fingerprint(v)
        if isinstance(v, torch.Tensor):
            return data_hash(v)
        if isinstance(v, tuple) and all(isinstance(t, torch.Tensor) for t in v):
            return data_hash(*v)
        return [one(x) for x in v] if isinstance(v, list) else v
    return {k: one(v) for k, v in settings.items()}


def resume_file(path):
    """What a training loop takes as `resume`: a Resume of `path` (None: nothing saved) for the loop's stage,
    settings and state."""
    return functools.partial(Resume, path)


def differences(saved, now, prefix=""):
    """['steps (file: 40, now: 30)', 'config.n_layer (file: 2, now: 3)', ...] between two settings dicts."""
    out = []
    for k in sorted(set(saved) | set(now), key=str):
        a, b = saved.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k} (file: {a}, now: {b})")
    return out


class Resume:
    """The resume file of one training stage. `state`: named objects to save and restore: modules and
    optimizers (state_dict), torch.Generators (get_state) and dicts (the history, updated in place).
    With path=None it does nothing: library callers (tests, notebooks) train without a file."""

    def __init__(self, path, stage, settings, every_s=None, log=print, **state):
        self.path, self.stage, self.state, self.log = path, stage, state, log
        self.settings = hashed(settings)
        self.every_s = RESUME_EVERY_S if every_s is None else every_s
        self.last_save, self.ctrl_c = time.monotonic(), False

    def restore(self, total_steps):
        """Load the resume file, if there is one, into the state objects; return the number of steps done."""
        if self.path is None or not os.path.exists(self.path):
            return 0
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=False)
            settings, step, state, rng = saved["settings"], saved["step"], saved["state"], saved["torch_rng"]
        except Exception as e:                      # truncated, garbage, or not a resume file at all
            self.log(f"[{self.stage}] {self.path} is corrupt or truncated ({type(e).__name__}); "
                     f"starting the {self.stage} stage over")
            os.remove(self.path)
            return 0
        diff = differences(settings, self.settings)
        if diff:
            raise ValueError(f"{self.path} was saved by a {self.stage} stage with other settings: "
                             f"{'; '.join(diff)}. Rerun with the same flags to resume it, or with --fresh "
                             "to start over")
        stale = [name for name, obj in self.state.items()
                 if isinstance(obj, torch.nn.Module) and set(state[name]) != set(obj.state_dict())]
        if stale:                                   # e.g. saved before q, k, v became one stacked weight
            self.log(f"[{self.stage}] {self.path} holds weights under other names than the model's "
                     f"({', '.join(stale)}: an earlier layout); starting the {self.stage} stage over")
            os.remove(self.path)
            return 0
        for name, obj in self.state.items():
            if isinstance(obj, torch.Generator):
                obj.set_state(state[name])
            elif isinstance(obj, dict):
                obj.clear()
                obj.update(state[name])
            else:
                obj.load_state_dict(state[name])
        torch.set_rng_state(rng)
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        self.log(f"resuming {self.stage} at step {step} of {total_steps} from {self.path}")
        return step

    def save(self, step):
        state = {name: obj.get_state() if isinstance(obj, torch.Generator) else obj if isinstance(obj, dict)
                 else obj.state_dict() for name, obj in self.state.items()}
        atomic_save({"settings": self.settings, "step": step, "state": state,
                     "torch_rng": torch.get_rng_state(),
                     "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                    self.path)
        self.last_save = time.monotonic()

    def step_done(self, step):
        """Call after each step (`step` steps done): saves every `every_s` seconds, and at a pending Ctrl-C,
        after which it raises KeyboardInterrupt."""
        if self.path is None:
            return
        if self.ctrl_c or time.monotonic() - self.last_save >= self.every_s:
            self.save(step)
        if self.ctrl_c:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferring_stop(self):
        """Inside: the first Ctrl-C, SIGTERM or SIGHUP (a closed terminal) only asks `step_done` to save and
        stop; a second one stops at once."""
        def handler(signum, frame):
            if self.ctrl_c:
                raise KeyboardInterrupt
            self.ctrl_c = True
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            print(f"\n[{self.stage}] {name}: saving after this step (press Ctrl-C again to stop now)",
                  file=sys.stderr)
        installed = {}
        if self.path is not None:
            try:
                for sig in STOP_SIGNALS:
                    installed[sig] = signal.signal(sig, handler)
            except ValueError:      # not the main thread: no handler; periodic saves still happen
                pass
        try:
            yield self
        finally:
            for sig, previous in installed.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
