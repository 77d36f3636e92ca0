"""Scale benchmark of `prepare` (a command, not a test): does a corpus of any size fit in flat memory
and a fixed number of open files?

    python -m ipu_packing.bench.prepare_scale --mb 100 [--nofile 1024] [--dupe-factor 1] [--workers 0]

Builds a corpus of about N MB in BERT format from text on the machine (the embedded default corpus,
its documents shuffled anew for each copy), then runs `python -m ipu_packing.data prepare` on it in a
child process under a descriptor limit of --nofile, and prints: wall and CPU seconds (the child and its
workers), instances/s and tokens/s, the peak RSS of the largest process (getrusage of the waited-for
descendants) and, sampled from /proc, of the prepare process and of its largest worker, the most
descriptors open at once (sampled from /proc every 20 ms: in one process and in all of them together),
and the output's size on disk. Building the corpus is not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Optional

import numpy as np

from .. import jsonin, jsonout
from ..data.write.datasets import PackingOptions
from ..errors import ArgumentParser, run_command


def build_corpus(path: str, megabytes: float, seed: int = 0) -> Dict[str, int]:
    """Write about `megabytes` MB of BERT-format text: copies of the default corpus, each copy's
    documents in a new random order. Returns {bytes, copies, documents}."""
    from ..data.text.corpus import default_documents

    blocks = ["\n".join(document) + "\n\n" for document in default_documents()]
    encoded = [block.encode("utf-8") for block in blocks]
    target = int(megabytes * 2 ** 20)
    rng = np.random.default_rng(seed)
    written = copies = documents = 0
    with open(path, "wb") as f:
        while written < target:
            for i in rng.permutation(len(encoded)).tolist():
                f.write(encoded[i])
                written += len(encoded[i])
                documents += 1
                if written >= target:
                    break
            copies += 1
    return {"bytes": written, "copies": copies, "documents": documents}


def _tree(root: int) -> List[int]:
    """root and every descendant (from /proc/<pid>/task/<tid>/children)."""
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        try:
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                    stack.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident set so far (VmHWM), MiB; 0 when it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class DescriptorSampler(threading.Thread):
    """Samples the open descriptors of a process tree every `interval` seconds, and the peak RSS
    of its root (the prepare process) and of its largest other process (a worker)."""

    def __init__(self, root: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.max_one = self.max_all = self.max_processes = 0
        self.parent_rss = self.worker_rss = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            total = 0
            pids = _tree(self.root)
            for pid in pids:
                try:
                    n = len(os.listdir("/proc/%d/fd" % pid))
                except OSError:
                    continue
                total += n
                self.max_one = max(self.max_one, n)
                if pid == self.root:
                    self.parent_rss = max(self.parent_rss, _peak_rss_mib(pid))
                else:
                    self.worker_rss = max(self.worker_rss, _peak_rss_mib(pid))
            self.max_all = max(self.max_all, total)
            self.max_processes = max(self.max_processes, len(pids))
            self.done.wait(self.interval)


def run_measured(command: List[str], nofile: Optional[int] = None, what: str = "command") -> Dict[str, object]:
    """Run `command` in a child process (under a descriptor limit of `nofile`, if given) and measure
    it: wall and CPU seconds (the child and its workers), peak RSS of the largest process, of the
    child and of its largest worker, and the most descriptors open at once."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(command, preexec_fn=limit if nofile else None, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sampler = DescriptorSampler(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit("%s failed (exit %d):\n%s" % (what, proc.returncode, err[-4000:]))
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_rss_mib": after.ru_maxrss / 1024.0, "parent_peak_rss_mib": sampler.parent_rss,
            "worker_peak_rss_mib": sampler.worker_rss, "max_fds_one_process": sampler.max_one,
            "max_fds_all_processes": sampler.max_all, "processes": sampler.max_processes, "stdout": out.strip()}


def run_prepare(corpus: str, output: str, nofile: int, extra: List[str]) -> Dict[str, object]:
    return run_measured([sys.executable, "-m", "ipu_packing.data", "prepare", "--input", corpus, "--output", output,
                         "--vocab", "default", "--quiet"] + extra, nofile, "prepare")


def du(path: str) -> int:
    """Bytes of the files under `path`."""
    total = 0
    for root, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
    return total


def check_workdir(path: Optional[str]) -> None:
    """--workdir by the rule of every output (fsutil.check_output), before any work: an existing directory, or a path
    to make one at; a symlink, a file, a FIFO or a device is refused. The work goes into a new directory of its own
    inside it (mkdtemp), so the directory may hold other files."""
    from ..fsutil import check_output

    if path is not None:
        check_output(path, "--workdir", directory=True, ours=lambda directory: True)


@contextlib.contextmanager
def scratch(workdir: Optional[str], prefix: str, keep: bool) -> Iterator[str]:
    """A new work directory (mkdtemp) inside --workdir, checked first (``check_workdir``), or in the system's temp
    directory; removed afterwards unless ``keep``."""
    check_workdir(workdir)
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=prefix, dir=workdir)
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def data_bench_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The options both data benches take (this one and pack_existing.py): the work directory, the command's
    S, workers and --no-padded, and --json."""
    parser = ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None, help="where the input and output go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the input and output")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--no-padded", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


def _main(argv: Optional[List[str]] = None) -> int:
    parser = data_bench_parser("python -m ipu_packing.bench.prepare_scale", __doc__)
    parser.add_argument("--mb", type=float, required=True, help="corpus size in MB (2**20 bytes)")
    parser.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of prepare")
    parser.add_argument("--dupe-factor", type=int, default=1)
    parser.add_argument("--shard-chars", type=int, default=None, help="prepare's --shard-chars")
    args = parser.parse_args(argv)
    if args.mb <= 0:
        parser.error("--mb must be > 0")
    with scratch(args.workdir, "scale-bench-", args.keep) as work:
        corpus = os.path.join(work, "corpus.txt")
        built = build_corpus(corpus, args.mb)
        output = os.path.join(work, "out")
        extra = ["--max-seq-length", str(args.max_seq_length), "--dupe-factor", str(args.dupe_factor),
                 "--workers", str(args.workers)] + (["--no-padded"] if args.no_padded else []) \
            + (["--shard-chars", str(args.shard_chars)] if args.shard_chars else [])
        result = run_prepare(corpus, output, args.nofile, extra)
        manifest = jsonin.load_path(os.path.join(output, "packed", "manifest.json"))
        result.update(corpus_mb=built["bytes"] / 2.0 ** 20, documents=built["documents"],
                      instances=manifest["num_sequences"], tokens=manifest["num_tokens"],
                      input_shards=manifest["corpus"]["shards"], packs=manifest["num_packs"],
                      output_mib=du(output) / 2.0 ** 20, nofile=args.nofile, dupe_factor=args.dupe_factor,
                      max_seq_length=args.max_seq_length, workers=PackingOptions(workers=args.workers).num_workers)
        result["instances_per_s"] = result["instances"] / result["wall_s"]
        result["tokens_per_s"] = result["tokens"] / result["wall_s"]
        if args.json:
            print(jsonout.dumps(result, sort_keys=True))
        else:
            print("corpus %.0f MB (%d documents) -> %d instances, %d tokens, %d input shards, output %.0f MiB"
                  % (result["corpus_mb"], result["documents"], result["instances"], result["tokens"],
                     result["input_shards"], result["output_mib"]))
            print("S=%d dupe %d workers %d, ulimit -n %d: wall %.1f s, CPU %.1f s, %.0f instances/s, %.0f tokens/s"
                  % (args.max_seq_length, args.dupe_factor, result["workers"], args.nofile, result["wall_s"],
                     result["cpu_s"], result["instances_per_s"], result["tokens_per_s"]))
            print("peak RSS of the largest process %.0f MiB (sampled: parent %.0f, largest worker %.0f); most "
                  "descriptors open at once: %d in one process, %d in all %d processes"
                  % (result["peak_rss_mib"], result["parent_peak_rss_mib"], result["worker_peak_rss_mib"],
                     result["max_fds_one_process"], result["max_fds_all_processes"], result["processes"]))
            print(result["stdout"].splitlines()[-1] if result["stdout"] else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
