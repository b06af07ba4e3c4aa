#!/usr/bin/env python3
"""ctest driver: comet's Jinja interpreter against Python's jinja2 on llama.cpp's templates.

Finds the llama-cpp-python source package (which vendors llama.cpp's models/templates/) in
$COMET_LLAMA_CPP_SDIST, ~/.cache/comet, ~/.cache/comet-llamacpp/sdist (bench/cpu_e2e.sh's copy)
or the build directory, else downloads
it with `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` into
~/.cache/comet (pinned: a newer llama.cpp brings new templates, checked when the pin moves);
extracts the templates into the build directory, renders goldens with jinja2 (golden.py)
and compares with comet (jinja_golden). Exits 77 (skipped) only when the templates cannot
be fetched or jinja2 is missing.

Usage: run_golden.py JINJA_GOLDEN_BINARY WORK_DIR
"""
import glob
import os
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Templates that jinja2 renders but comet does not reproduce, with the reason (also in
# docs/tokenizer.md).
EXCEPTIONS = {
}


# the llama-cpp-python release whose llama.cpp templates the golden set covers (70 templates)
PINNED = "0.3.36"


def find_sdist(work):
    dirs = [os.environ.get("COMET_LLAMA_CPP_SDIST", ""), os.path.expanduser("~/.cache/comet"),
            os.path.expanduser("~/.cache/comet-llamacpp/sdist"), work]
    for d in dirs:
        if d and os.path.isfile(d):
            return d
        hits = sorted(glob.glob(os.path.join(d, f"llama_cpp_python-{PINNED}.tar.gz"))) if d else []
        if hits:
            return hits[-1]
    cache = os.path.expanduser("~/.cache/comet")
    os.makedirs(cache, exist_ok=True)
    print("run_golden: downloading the llama-cpp-python source package into", cache, flush=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "--no-build-isolation", "llama-cpp-python==" + PINNED, "-d", cache],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hits = sorted(glob.glob(os.path.join(cache, f"llama_cpp_python-{PINNED}.tar.gz")))
    if not hits:
        print(r.stdout[-2000:])
        return None
    return hits[-1]


def main():
    binary, work = sys.argv[1], sys.argv[2]
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("SKIP: Python's jinja2 is not installed (apt-get install python3-jinja2)")
        return 77
    os.makedirs(work, exist_ok=True)
    sdist = find_sdist(work)
    if not sdist:
        print("SKIP: cannot fetch llama-cpp-python's source package (offline?)")
        return 77
    tdir = os.path.join(work, "templates")
    stamp = os.path.join(tdir, ".from")
    if not (os.path.exists(stamp) and open(stamp).read() == sdist):
        os.makedirs(tdir, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                if "/vendor/llama.cpp/models/templates/" in m.name and m.name.endswith(".jinja") \
                        and m.isfile():
                    data = tar.extractfile(m).read()
                    with open(os.path.join(tdir, os.path.basename(m.name)), "wb") as f:
                        f.write(data)
        with open(stamp, "w") as f:
            f.write(sdist)
    n = len(glob.glob(os.path.join(tdir, "*.jinja")))
    if n == 0:
        print(f"SKIP: no templates in {sdist}")
        return 77
    print(f"run_golden: {n} templates from {sdist}", flush=True)
    conv = os.path.join(HERE, "conversations.json")
    golden = os.path.join(work, "golden.json")
    subprocess.run([sys.executable, os.path.join(HERE, "golden.py"), tdir, conv, golden],
                   check=True)
    for name, why in EXCEPTIONS.items():
        print(f"exception {name}: {why}")
    return subprocess.run([binary, golden, conv, tdir, *EXCEPTIONS]).returncode


if __name__ == "__main__":
    sys.exit(main())
