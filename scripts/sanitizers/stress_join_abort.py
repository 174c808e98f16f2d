#!/usr/bin/env python3
"""Join/abort stress: many short gRPC jobs (2 or 3 ranks, a tiny config), in each one rank
fails (SIGKILL or SIGTERM) at a random moment of its connect, rendezvous and stream setup (or
early training). Every job must end promptly and cleanly:

  * the failing rank ends (SIGKILL; SIGTERM: the preemption exit 75, the signal itself before
    dtrain installs its handler, or 0/1 when it finished or failed first);
  * every other rank ends within --bound seconds of the failure with exit 0 (it had finished)
    or exit 1 and a one-line "error: ..." as its last line;
  * no process ends by another signal (SIGABRT, SIGSEGV: a crash), none hangs, and no process
    leaves a sanitizer report (the *SAN_OPTIONS log_path points into each job's folder).

Prints one line per job and a summary (phases hit, detection times); exits 1 when any job
failed. scripts/stress_join_abort.sh builds the binary and sets the sanitizer environment.
"""

import argparse
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

PREEMPTED = 75  # a rank stopped by train.preempt_signal: kExitPreempted (util/interrupt.h)

CONFIG = """seed: {seed}
model: {{type: mlp, hidden: [16], activation: relu}}
data:
  format: synthetic
  synthetic: {{samples: 256, features: 8, classes: 2, noise: 0.5}}
  batch_size: 16
optimizer: {{type: sgd, lr: 0.1}}
train: {{epochs: 1, log_every: 100, checkpoint: {{every_steps: 0, keep_last: 1}}}}
distributed:
  backend: grpc
  world_size: {world}
  strategy: ddp
  shm: {shm}
  heartbeat_s: {heartbeat}
  timeout_s: 10
  rendezvous_timeout_s: {rendezvous}
runtime: {{threads: 1}}
"""

# Where a rank was when it was signalled, from the last marker in its --log-level debug log.
PHASES = [  # (phase entered, marker that enters it), in order
    ("rendezvous", re.compile(r"listening on")),
    ("streams", re.compile(r"peer table")),
    ("training", re.compile(r"shared memory from|memory: params|\bstep \d")),
]


# What makes a log_path file a report: LeakSanitizer also writes notes there that are none (such
# as "Unable to get registers from thread N" when a thread exits during its scan at exit).
REPORT = re.compile(r"(ERROR|WARNING): \w+Sanitizer|runtime error:|SUMMARY: \w+Sanitizer")

PHASE_NAMES = ["startup"] + [name for name, _ in PHASES]


def phase_of(log_text):
    phase = "startup"
    for name, marker in PHASES:
        if marker.search(log_text):
            phase = name
    return phase


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def start_ranks(a, folder, n, world, shm, starts, token):
    """Writes the job's config into `folder` and starts its ranks, rank r `starts[r]` seconds
    after the first (in order of start); returns (processes, log paths, start time)."""
    subprocess.run(["rm", "-rf", folder])  # a kept folder of an earlier run
    os.makedirs(folder)
    cfg = os.path.join(folder, "tiny.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(seed=max(n, 0), world=world, shm=shm, heartbeat=a.heartbeat,
                              rendezvous=a.rendezvous))
    env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), DTRAIN_JOB_TOKEN=token)
    for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"):
        if k in env:  # this job's reports into its folder
            env[k] = re.sub(r"log_path=[^:]*", f"log_path={folder}/report", env[k])
    procs, logs, t0 = [None] * world, [None] * world, time.monotonic()
    for r in sorted(range(world), key=lambda r: starts[r]):
        time.sleep(max(0.0, t0 + starts[r] - time.monotonic()))
        logs[r] = os.path.join(folder, f"rank-{r}.log")
        with open(logs[r], "w") as out:
            procs[r] = subprocess.Popen(
                [a.bin, "--log-level", "debug", "run", cfg, "--out", os.path.join(folder, "out"),
                 "--no-progress"],
                env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=out,
                stderr=subprocess.STDOUT, cwd=folder)
    return procs, logs, t0


class Job:
    def __init__(self, n, args, rng):
        self.n = n
        self.args = args
        self.world = rng.choice([2, 3])
        self.victim = rng.randrange(self.world)
        self.sig = signal.SIGKILL if rng.random() < 0.7 else signal.SIGTERM
        # The failure: `delay` seconds after the victim enters `target` (its log's marker; its
        # start for startup), delay uniform within that phase's length in the calibration job.
        self.target = rng.choice(list(args.phase_s))
        self.delay = rng.uniform(0, args.phase_s[self.target])
        self.shm = rng.choice(["true", "false"])
        self.starts = [rng.uniform(0, 0.3) for _ in range(self.world)]  # staggered start
        self.dir = os.path.join(args.work, f"job-{n:04d}")
        self.problems = []
        self.detect = []  # seconds from the signal to each other rank's end
        self.phase = "?"
        self.codes = []  # every rank's return code (-N: signal N)

    def run(self):
        a = self.args
        procs, logs, t0 = start_ranks(a, self.dir, self.n, self.world, self.shm, self.starts,
                                      f"stress-{self.n}-{random.random()}")
        v = self.victim
        entered = None  # when the victim was first seen in the target phase
        target = PHASE_NAMES.index(self.target)
        while procs[v].poll() is None:
            now = time.monotonic()
            if entered is None and (self.target == "startup" or
                                    PHASE_NAMES.index(phase_of(read(logs[v]))) >= target):
                entered = now
            if entered is not None and now >= entered + self.delay:
                self.phase = phase_of(read(logs[v]))
                procs[v].send_signal(self.sig)
                break
            time.sleep(0.002)
        else:
            self.phase = "ended"
        t_sig = time.monotonic()
        ends = [None] * self.world
        deadline = t_sig + a.bound
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            for r, p in enumerate(procs):
                if ends[r] is None and p.poll() is not None:
                    ends[r] = time.monotonic()
            time.sleep(0.02)
        for r, p in enumerate(procs):
            if p.poll() is None:
                self.problems.append(f"rank {r} hangs: still running {a.bound:.0f} s after the "
                                     f"failure; last line: {last_line(read(logs[r]))!r}")
                p.kill()
                p.wait()
            elif ends[r] is None:
                ends[r] = time.monotonic()
        self.codes = [p.returncode for p in procs]
        for r, p in enumerate(procs):
            self.check_rank(r, p.returncode, read(logs[r]))
            if r != v and ends[r] is not None and self.phase != "ended":
                self.detect.append(max(0.0, ends[r] - t_sig))
        for f in sorted(os.listdir(self.dir)):
            if f.startswith("report.") and REPORT.search(read(os.path.join(self.dir, f))):
                self.problems.append(f"sanitizer report {os.path.join(self.dir, f)}")
        if not self.problems and not a.keep:
            subprocess.run(["rm", "-rf", self.dir])

    def check_rank(self, r, rc, text):
        if r == self.victim:
            ok = {0, 1, -signal.SIGKILL} if self.sig == signal.SIGKILL else \
                {0, 1, PREEMPTED, -signal.SIGTERM}
        else:
            # SIGTERM (train.preempt_signal's default) asks the whole job to stop at a step all
            # ranks agree on: 75 (kExitPreempted, util/interrupt.h) everywhere.
            ok = {0, 1} if self.sig == signal.SIGKILL else {0, 1, PREEMPTED}
        if rc not in ok:
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
            self.problems.append(f"rank {r} ended by {how}; last line: {last_line(text)!r}")
        elif rc == 1 and not last_line(text).startswith("error: "):
            self.problems.append(f"rank {r} exit 1 without a one-line error; last line: "
                                 f"{last_line(text)!r}")

    def describe(self):
        d = " ".join(f"{t:.1f}" for t in self.detect)
        return (f"job {self.n:4d}: {self.world} ranks, rank {self.victim} "
                f"{signal.Signals(self.sig).name} {self.delay * 1000:3.0f} ms into {self.target}"
                f" (in {self.phase}, shm {self.shm}): exit codes {self.codes}, the others "
                f"ended after [{d}] s")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jobs", type=int)
    p.add_argument("--bin", required=True, help="the dtrain binary")
    p.add_argument("--work", required=True, help="a folder for the jobs' files")
    p.add_argument("--parallel", type=int, default=2, help="jobs at a time")
    p.add_argument("--bound", type=float, default=45.0,
                   help="seconds within which every rank must end after the failure")
    p.add_argument("--heartbeat", type=float, default=2.0, help="distributed.heartbeat_s")
    p.add_argument("--rendezvous", type=float, default=5.0,
                   help="distributed.rendezvous_timeout_s")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the folders of clean jobs")
    a = p.parse_args()
    a.bin, a.work = os.path.abspath(a.bin), os.path.abspath(a.work)
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    os.makedirs(a.work, exist_ok=True)
    a.phase_s = calibrate(a)
    print(f"stress: {a.jobs} jobs, seed {seed}, "
          f"bound {a.bound:.0f} s, heartbeat_s {a.heartbeat:g}, {a.parallel} at a time",
          flush=True)
    jobs = [Job(n, a, rng) for n in range(a.jobs)]
    lock, nxt = threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= len(jobs):
                    return
                job = jobs[nxt[0]]
                nxt[0] += 1
            try:
                job.run()
            except Exception as e:  # the harness failing is a failed job, not a pass
                job.problems.append(f"harness: {e!r}")
            with lock:
                print(job.describe() + ("" if not job.problems else "  FAILED"), flush=True)
                for pr in job.problems:
                    print(f"    {pr}", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, a.parallel))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summarize(jobs, a, time.monotonic() - t0)
    return 1 if any(j.problems for j in jobs) else 0


def calibrate(a):
    """Runs one 2-rank job without a failure (it must succeed) and returns how long each phase
    took in it, in seconds, by phase name."""
    folder = os.path.join(a.work, "calibration")
    procs, logs, t0 = start_ranks(a, folder, -1, 2, "true", [0.0, 0.0], "calibration")
    seen = [{}, {}]  # rank -> phase -> first seen, seconds after start
    while any(p.poll() is None for p in procs) and time.monotonic() - t0 < 120:
        for r in range(2):
            seen[r].setdefault(phase_of(read(logs[r])), time.monotonic() - t0)
        time.sleep(0.002)
    for r, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
        if p.wait() != 0:
            sys.exit(f"stress: the calibration job failed (rank {r}: {p.returncode}); see "
                     f"{logs[r]}")
    total = time.monotonic() - t0
    # A phase's length: from its marker to the next one (training: to the end), the longer of
    # the two ranks; at least 20 ms.
    phase_s = {}
    for i, name in enumerate(PHASE_NAMES):
        lengths = []
        for r in range(2):
            begin = 0.0 if name == "startup" else seen[r].get(name)
            later = [seen[r][n] for n in PHASE_NAMES[i + 1:] if n in seen[r]]
            if begin is not None:
                lengths.append((min(later) if later else total) - begin)
        phase_s[name] = max([0.02] + lengths)
    print("stress: calibration job: " + ", ".join(f"{k} {v * 1000:.0f} ms"
                                                  for k, v in phase_s.items()) +
          f", whole job {total * 1000:.0f} ms", flush=True)
    subprocess.run(["rm", "-rf", folder])
    return phase_s


def summarize(jobs, a, wall):
    failed = [j for j in jobs if j.problems]
    phases = {}
    for j in jobs:
        phases[j.phase] = phases.get(j.phase, 0) + 1
    det = sorted(t for j in jobs for t in j.detect)
    # After the rendezvous a lost peer is to be noticed within heartbeat_s (+ 1 s); before it,
    # only the rendezvous timeout can tell a dead rank from a slow one.
    late = sorted(t for j in jobs if j.phase in ("streams", "training") for t in j.detect)
    slow = sum(1 for t in late if t > a.heartbeat + 1)
    print(f"stress: {len(jobs)} jobs in {wall:.0f} s, {len(failed)} failed "
          f"(crash signals {sum(1 for j in failed if any('signal' in p for p in j.problems))}, "
          f"hangs {sum(1 for j in failed if any('hangs' in p for p in j.problems))}, "
          f"sanitizer reports {sum(1 for j in failed if any('sanitizer' in p for p in j.problems))})")
    print("stress: failure points: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
    if det:
        print(f"stress: the other ranks ended {statistics.median(det):.1f} s (median), "
              f"{det[-1]:.1f} s (max) after the failure; after failures past the rendezvous "
              f"(streams, training) {slow} of {len(late)} later than heartbeat_s + 1 s = "
              f"{a.heartbeat + 1:g} s")


if __name__ == "__main__":
    sys.exit(main())
