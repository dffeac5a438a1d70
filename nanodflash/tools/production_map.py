"""Proof of docs/production.md's citations: every file and function it cites exists, in nanodflash and in
the released archives of the production code bases.

    python -m nanodflash.tools.production_map                       # nanodflash's names only (offline)
    python -m nanodflash.tools.production_map --archives /tmp/prod  # and every archive cited, downloaded
                                                                    # there first (pip download --no-deps)

The page cites in two forms, each between backticks:
    `nanodflash/verify.py:rejection_verify`                           a name in this package
    `vllm==0.34.0:vllm/v1/sample/rejection_sampler.py:RejectionSampler.forward`
                                                                      a path inside a released archive
A nanodflash name is imported and looked up attribute by attribute. An archive's name must be defined in
the cited file: `A.b` as a `def b` inside `class A`. An archive is a wheel
(paths from its root) or an sdist (paths below its top folder). One line per citation; the exit status is
1 when any is missing.
"""

import argparse
import ast
import glob
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "production.md")
OURS = re.compile(r"`(nanodflash/[\w/]+\.py):([A-Za-z_][\w.]*)`")
THEIRS = re.compile(r"`([A-Za-z0-9_.-]+)==([0-9][\w.+-]*):([\w/.-]+\.py):([A-Za-z_][\w.]*)`")


def citations(text):
    """(ours, theirs): [(path, name)] and [(package, version, path, name)], in page order, without repeats.

    >>> citations("`nanodflash/verify.py:greedy_verify` and `vllm==0.34.0:vllm/a.py:A.f`, `nanodflash/x.py`")
    ([('nanodflash/verify.py', 'greedy_verify')], [('vllm', '0.34.0', 'vllm/a.py', 'A.f')])
    """
    ours = list(dict.fromkeys(OURS.findall(text)))
    theirs = list(dict.fromkeys(THEIRS.findall(text)))
    return ours, theirs


def find_ours(path, name):
    """'' when nanodflash's `path` defines `name` (dotted: attribute by attribute), else why not."""
    module = path[: -len(".py")].replace("/", ".")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        return f"no module {module} ({e})"
    for part in name.split("."):
        if not hasattr(obj, part):
            return f"{module} has no {name}"
        obj = getattr(obj, part)
    return ""


def archive_files(archive):
    """{path inside the package: text} of an archive's .py files (a wheel, or an sdist's top folder)."""
    files = {}
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            for n in z.namelist():
                if n.endswith(".py"):
                    files[n] = z.read(n).decode("utf-8", "replace")
    else:
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(".py"):
                    inner = m.name.split("/", 1)[1] if "/" in m.name else m.name   # below name-version/
                    files[inner] = t.extractfile(m).read().decode("utf-8", "replace")
    return files


def defines(text, name):
    """Whether `text` defines `name`: a top-level or nested `def`/`class` for a plain name; for `A.b`, a
    `def b` (or `class b`) inside the body of `class A` (read with ast; by its lines where ast cannot parse).

    >>> src = "class A:\\n    def f(self):\\n        pass\\n\\ndef g():\\n    pass\\n"
    >>> defines(src, "A.f"), defines(src, "A.g"), defines(src, "g")
    (True, False, True)
    """
    try:
        nodes = list(ast.walk(ast.parse(text)))
    except SyntaxError:
        return all(re.search(rf"^\s*(async\s+def|def|class)\s+{re.escape(part)}\b", text, re.M)
                   for part in name.split("."))
    scopes = [n for n in nodes if isinstance(n, DEFINITIONS)]
    for part in name.split("."):
        found = [n for n in scopes if n.name == part]
        if not found:
            return False
        scopes = [c for n in found for c in ast.walk(n) if c is not n and isinstance(c, DEFINITIONS)]
    return True


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def find_theirs(files, path, name):
    """'' when the archive's `path` defines `name`, else why not."""
    if path not in files:
        return f"no file {path}"
    return "" if defines(files[path], name) else f"{path} does not define {name}"


def in_folder(package, version, folder):
    """The archives of package==version already in `folder` (a wheel's or an sdist's name)."""
    stem = f"{package}_{version}".replace("-", "_").lower()
    names = {f: os.path.basename(f).replace("-", "_").lower() for f in glob.glob(os.path.join(folder, "*"))}
    return sorted(f for f, n in names.items() if n.endswith((".whl", ".tar.gz"))
                  and (n.startswith(stem + "_") or n == stem + ".tar.gz"))           # not 0.5.2 for 0.5.23


def download(package, version, folder):
    """The archive of package==version in `folder`, downloaded there first unless it already is."""
    if not in_folder(package, version, folder):
        # this interpreter's pip, else the system's (make's .venv has none: uv installs into it)
        python = sys.executable if importlib.util.find_spec("pip") else shutil.which("python3")
        if python is None:
            raise FileNotFoundError(f"no pip to download {package}=={version}: put its archive in {folder}")
        subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", f"{package}=={version}",
                        "-d", folder], check=True)
    found = in_folder(package, version, folder)
    if not found:
        raise FileNotFoundError(f"pip downloaded no archive of {package}=={version} into {folder}")
    return found[-1]


def report(log, citation, why):
    log(("MISSING " if why else "found   ") + citation + (f"  ({why})" if why else ""))
    return bool(why)


def check(text, archives=None, log=print):
    """Check every citation of `text`; archives: a folder to download the cited archives into (None: ours
    only). Returns the number missing."""
    ours, theirs = citations(text)
    missing = sum(report(log, f"{path}:{name}", find_ours(path, name)) for path, name in ours)
    if archives is None:
        log(f"{len(theirs)} citations of released archives not checked (--archives DIR checks them)")
        return missing
    os.makedirs(archives, exist_ok=True)
    opened = {}
    for package, version, path, name in theirs:
        if (package, version) not in opened:
            opened[package, version] = archive_files(download(package, version, archives))
        missing += report(log, f"{package}=={version}:{path}:{name}",
                          find_theirs(opened[package, version], path, name))
    return missing


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--page", default=PAGE, help="the page whose citations to check (default: "
                   "docs/production.md)")
    p.add_argument("--archives", default=None, metavar="DIR", help="also check the released archives, "
                   "downloaded into DIR (pip download --no-deps; kept there for the next run)")
    args = p.parse_args(argv)
    with open(args.page, encoding="utf-8") as f:
        missing = check(f.read(), args.archives)
    print(f"{missing} missing" if missing else "every citation found")
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
