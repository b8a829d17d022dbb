"""Faults caused one at a time on a ChaosRun, and what each one cost,
measured from the run's own records afterwards.

Used by bench/resilience.py (docs/RESILIENCE.md) and tests/chaos/soak.py.

    driver = faults.Driver(run, rng, net=net)
    injections = [driver.inject("kill9") for _ in range(10)]
    final = run.finish()
    result = faults.analyze(run, injections, final)

A fault's time is taken here, just before the signal is sent (the file made,
the link cut). What it cost is read after the job ended, when every worker
has flushed its metrics (ddp-worker --metrics_file writes one line per
completed step, with the unix time it completed):

- recovery: from the fault to the first step of the next generation that
  trained, completed on every member of it (the latest member's first
  metrics line of that generation);
- steps lost: generation_changes' steps_lost (committed steps the new
  generation did not start from) plus the steps in flight: steps some rank
  had started (its index log line is written before the step runs) past the
  new generation's resume step, which were discarded;
- where the time went, from the coordinator's and the workers' logs:
  detection (the coordinator's "job J, generation G: ..." fault line),
  abort (survivors' "left generation G"), re-form (survivors' "joined
  generation G'"), rendezvous ("... ring of N proven"), state broadcast
  ("training ... from step S") and the first step;
- for a coordinator restart or stop, which forms no new generation: the
  steps completed during the outage, and the longest gap between
  consecutive completed steps around it against the median step time.

Every wait is bounded; a recovery that does not come is recorded as the
injection's `error` (with the run's folder, to read its logs) and the driver
puts the world back (restarts, SIGCONT, link up, hang file removed) before
the next fault.
"""
import collections
import dataclasses
import json
import os
import re
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))

import chaos  # noqa: E402
import coverage  # noqa: E402

KINDS = ("kill9", "sigstop", "hang", "partition", "coordinator", "coordinator_stop", "join_kill",
         "whole")
DESCRIPTION = {
    "kill9": "kill -9 of a worker",
    "sigstop": "SIGSTOP of a worker (then SIGCONT)",
    "hang": "hung training thread (--debug_hang_file)",
    "partition": "network partition (netns link down, then up)",
    "coordinator": "coordinator kill -9 + restart, same flags",
    "coordinator_stop": "coordinator SIGSTOP for twice the heartbeat timeout (then SIGCONT)",
    "join_kill": "kill -9 of a member right after a restarted worker was admitted",
    "whole": "whole job kill -9, resumed from checkpoint",
}


@dataclasses.dataclass
class Injection:
    kind: str
    victim: str            # a worker's name, "coordinator" or "all"
    t_fault: float         # unix time the fault was caused
    generation: int        # the generation training at the fault
    step: int              # the coordinator's global step at the fault
    t_seen: float = 0.0    # when GetStatus first showed training going on
    t_heal: float = 0.0    # SIGCONT / link up / hang file removed / restart
    t_back: float = 0.0    # the world full again (victim admitted or adopted)
    error: str = ""        # a recovery that never came, in words
    notes: list = dataclasses.field(default_factory=list)


class JobEnded(Exception):
    """The job ended before the fault's recovery could be seen: a fault
    caused in the job's last steps, not counted."""


class Driver:
    """Causes faults on `run` (a chaos.ChaosRun with `workers` workers) one
    at a time; each inject() returns once the world is full and training
    again, or with Injection.error set."""

    def __init__(self, run, rng, net=None, workers=3, timeout=60.0, outage=1.5,
                 partition_hold=None, gap_steps=(20, 80), log=print):
        self.run = run
        self.rng = rng
        self.net = net
        self.workers = workers
        self.timeout = timeout
        self.outage = outage
        self.hb_timeout = _seconds(next(a for a in run.coordinator_args
                                        if a.startswith("--heartbeat_timeout=")).split("=", 1)[1])
        # Down for longer than the heartbeat timeout (the partition).
        self.partition_hold = partition_hold or self.hb_timeout + 1.5
        self.gap_steps = gap_steps
        self.log = log

    # ---- waiting ---------------------------------------------------------

    def _status(self):
        try:
            return self.run.status()
        except Exception:  # noqa: BLE001 - a restarting coordinator
            return {}

    def _wait(self, predicate, what, timeout=None):
        deadline = time.time() + (timeout or self.timeout)
        while time.time() < deadline:
            s = self._status()
            if s and predicate(s):
                return s
            time.sleep(0.05)
        raise TimeoutError("no %s within %.0fs" % (what, timeout or self.timeout))

    @staticmethod
    def _trained(s):
        # Running, and the last change has trained (an adopted generation
        # never stopped).
        last = (s.get("generation_changes") or [{}])[-1]
        return s.get("state") == "JOB_STATE_RUNNING" and (
            last.get("pause_seconds", 0) > 0 or last.get("cause") == "CHANGE_CAUSE_ADOPTED")

    def _full(self, s):
        return self._trained(s) and len(s.get("members", [])) == self.workers

    def _ended(self, s):
        return s.get("state") in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")

    def ready(self):
        """Waits until the world is full and has trained for a second since
        its last change (so the rate limit and the last recovery are out of
        the way), then a random number of steps more. False if the job
        ended."""
        def settled(s):
            if self._ended(s):
                return True
            if not self._full(s):
                return False
            last = s["generation_changes"][-1]
            return time.time() - last["at_unix_seconds"] - last["pause_seconds"] > 1.0
        s = self._wait(settled, "full world", timeout=self.timeout * 2)
        if self._ended(s):
            return False
        target = int(s.get("global_step", 0)) + self.rng.randrange(*self.gap_steps)
        s = self._wait(lambda s: self._ended(s) or int(s.get("global_step", 0)) > target,
                       "step %d" % target)
        return not self._ended(s) and self._full(s)

    # ---- faults ----------------------------------------------------------

    def inject(self, kind):
        """One fault of `kind`, then back to a full world. Returns the
        Injection, or None when the job ended before it could be caused."""
        if kind == "partition" and self.net is None:
            raise ValueError("a partition needs the run in network namespaces")
        try:
            if not self.ready():
                return None
        except TimeoutError as e:
            self.log("not ready for %s: %s" % (kind, e))
            return None
        s = self._status()
        members = list(s.get("members", []))
        inj = Injection(kind, "", 0.0, int(s.get("generation", 0)), int(s.get("global_step", 0)))
        try:
            getattr(self, "_" + kind)(inj, members)
        except JobEnded:
            self.log("  %s of %s: the job ended before training went on without it; not counted"
                     % (kind, inj.victim))
            self.repair()
            return None
        except TimeoutError as e:
            inj.error = "%s (run folder %s)" % (e, self.run.dir)
            self.log("  %s: RECOVERY NEVER CAME: %s" % (kind, inj.error))
            self.repair()
        return inj

    def _pick(self, members):
        return chaos.pick(self.rng, sorted(members))

    def _new_generation(self, inj, absent=None, what="a new generation to train"):
        s = self._wait(lambda s: (self._ended(s) or (
            int(s.get("generation", 0)) > inj.generation and self._trained(s) and
            (absent is None or absent not in s.get("members", [])))), what)
        if self._ended(s) and int(s.get("generation", 0)) <= inj.generation:
            raise JobEnded()
        inj.t_seen = time.time()
        return s

    def _back(self, inj, what="the world to be full again"):
        self._wait(lambda s: self._ended(s) or self._full(s), what)
        inj.t_back = time.time()

    def _kill9(self, inj, members):
        inj.victim = self._pick(members)
        inj.t_fault = time.time()
        self.run.kill(inj.victim)
        self._new_generation(inj, inj.victim)
        inj.t_heal = time.time()
        self.run.start_worker(int(inj.victim[1:]))
        self._back(inj, "%s to rejoin after its restart" % inj.victim)

    def _sigstop(self, inj, members):
        inj.victim = self._pick(members)
        inj.t_fault = time.time()
        self.run.signal(inj.victim, signal.SIGSTOP)
        self._new_generation(inj, inj.victim)
        inj.t_heal = time.time()
        self.run.signal(inj.victim, signal.SIGCONT)
        self._back(inj, "%s to rejoin after SIGCONT" % inj.victim)

    def _hang(self, inj, members):
        inj.victim = self._pick(members)
        path = self.run.hang_file(int(inj.victim[1:]))
        inj.t_fault = time.time()
        open(path, "w").close()
        try:
            self._new_generation(inj, inj.victim, "training to go on without the hung " + inj.victim)
        finally:
            inj.t_heal = time.time()
            os.remove(path)
        self._back(inj, "%s to rejoin once its hang ended" % inj.victim)

    def _partition(self, inj, members):
        inj.victim = self._pick(members)
        host = int(inj.victim[1:]) + 1
        inj.t_fault = time.time()
        self.run.events.append((inj.t_fault, "link down " + inj.victim))
        self.net.link_down(host)
        try:
            self._new_generation(inj, inj.victim)
            time.sleep(max(0.0, inj.t_fault + self.partition_hold - time.time()))
        finally:
            self.net.link_up(host)
            inj.t_heal = time.time()
            self.run.events.append((inj.t_heal, "link up " + inj.victim))
        self._back(inj, "%s to rejoin after its link came back" % inj.victim)

    def _coordinator(self, inj, members):
        inj.victim = "coordinator"
        inj.t_fault = time.time()
        self.run.kill("coordinator")
        time.sleep(max(0.0, inj.t_fault + self.outage - time.time()))
        inj.t_heal = time.time()
        self.run.start_coordinator()  # the same flags; returns once it listens
        inj.notes.append("listening %.3fs after the restart" % (time.time() - inj.t_heal))
        s = self._wait(lambda s: self._ended(s) or s.get("state") == "JOB_STATE_RUNNING",
                       "the restarted coordinator to run the job")
        if self._ended(s):
            raise JobEnded()
        inj.t_seen = time.time()
        s = self._wait(lambda s: self._ended(s) or self._full(s),
                       "every member back with the restarted coordinator")
        if self._ended(s):
            raise JobEnded()
        inj.t_back = time.time()

    def _coordinator_stop(self, inj, members):
        inj.victim = "coordinator"
        inj.t_fault = time.time()
        self.run.signal("coordinator", signal.SIGSTOP)
        time.sleep(max(0.0, inj.t_fault + 2 * self.hb_timeout - time.time()))
        self.run.signal("coordinator", signal.SIGCONT)
        inj.t_heal = time.time()
        # A sweep or two after the thaw: nobody may be counted lost for it.
        time.sleep(self.hb_timeout)
        s = self._wait(lambda s: self._ended(s) or self._full(s), "the world full after the thaw")
        if self._ended(s):
            raise JobEnded()
        inj.t_seen = inj.t_back = time.time()
        if int(s.get("generation", 0)) != inj.generation:
            inj.notes.append("re-formed: generation %d -> %s" % (inj.generation, s.get("generation")))

    def _join_kill(self, inj, members):
        # A member killed and restarted; the moment the restarted process is
        # admitted (its join generation formed), another member is killed.
        joiner = self._pick(members)
        self.run.kill(joiner)
        self._wait(lambda s: self._ended(s) or (int(s.get("generation", 0)) > inj.generation and
                                                 joiner not in s.get("members", [])),
                   "a generation without %s" % joiner)
        before = int(self._status().get("generation", 0))
        self.run.start_worker(int(joiner[1:]))
        s = self._wait(lambda s: self._ended(s) or (int(s.get("generation", 0)) > before and
                                                     joiner in s.get("members", [])),
                       "%s to be admitted" % joiner)
        if self._ended(s):
            raise JobEnded()
        inj.generation = int(s.get("generation", 0))
        inj.step = int(s.get("global_step", 0))
        inj.victim = self._pick([m for m in s.get("members", []) if m != joiner])
        inj.t_fault = time.time()
        self.run.kill(inj.victim)
        inj.notes.append("joiner %s admitted in generation %d" % (joiner, inj.generation))
        self._new_generation(inj, inj.victim)
        inj.t_heal = time.time()
        self.run.start_worker(int(inj.victim[1:]))
        self._back(inj, "%s to rejoin after its restart" % inj.victim)

    def _whole(self, inj, members):
        inj.victim = "all"
        names = ["coordinator"] + ["w%d" % i for i in range(self.workers)]
        inj.t_fault = time.time()
        for name in names:  # the coordinator first: nobody gets to react
            self.run.signal(name, signal.SIGKILL)
        for name in names:
            self.run.procs[name].wait(timeout=10)
        inj.t_heal = time.time()
        self.run.start_coordinator()
        for i in range(self.workers):
            self.run.start_worker(i)
        self._new_generation(inj, None, "the job to resume from its checkpoint")
        self._back(inj)

    def repair(self):
        """After a recovery that did not come (or a fault at the job's end):
        every worker running and neither stopped nor hung, links up, the
        coordinator up."""
        for i in range(self.workers):
            name = "w%d" % i
            try:
                os.remove(self.run.hang_file(i))
            except FileNotFoundError:
                pass
            if self.net is not None:
                self.net.link_up(i + 1)
            p = self.run.procs.get(name)
            if p is not None and p.poll() is None:
                self.run.signal(name, signal.SIGCONT)
            elif p is not None:
                self.run.start_worker(i)
        if self.run.procs["coordinator"].poll() is not None:
            self.run.start_coordinator()
        try:
            s = self._wait(lambda s: self._ended(s) or self._full(s), "the world to be full again")
        except TimeoutError as e:
            self.log("  repair: %s" % e)
            return
        if self._ended(s):
            return


def _seconds(text):
    m = re.fullmatch(r"([\d.]+)(ms|s|m)?", text)
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "ms" else value * 60 if m.group(2) == "m" else value


# ---- reading a finished run -------------------------------------------------

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3}) (\w) ([^\]]*)\] (.*)$")


def read_log(path):
    """[(unix time, level, who, message)] of a daemon's log (local time, ms)."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            m = LOG_LINE.match(line.rstrip("\n"))
            if m:
                t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
                out.append((t, m.group(3), m.group(4), m.group(5)))
    return out


class Records:
    """Everything a finished run left: metrics, index lines, logs."""

    def __init__(self, run, workers=3):
        self.names = ["w%d" % i for i in range(workers)]
        self.metrics = {n: run.metrics(n) for n in self.names}
        self.lines = []  # every index line, tagged with its worker's name
        for n in self.names:
            for line in coverage.read_lines(os.path.join(run.dir, n + ".idx.jsonl")):
                line["_worker"] = n
                self.lines.append(line)
        self.coordinator_log = read_log(os.path.join(run.dir, "coordinator.log"))
        self.worker_logs = {n: read_log(os.path.join(run.dir, n + ".log")) for n in self.names}
        self.by_generation = collections.defaultdict(list)  # gen -> [(name, line)]
        for n, lines in self.metrics.items():
            for m in lines:
                self.by_generation[m["generation"]].append((n, m))

    def step_times(self):
        """{name: [(time, step, epoch, generation)]} of completed steps, in time order."""
        return {n: sorted((m["time"], m["step"], m["epoch"], m["generation"]) for m in lines)
                for n, lines in self.metrics.items()}

    def last_step_before(self, t, generation=None):
        """The last step completed before t: from the metrics lines, or, as
        a killed worker's unflushed metrics are lost, one less than the last
        step started in `generation` (index lines carry no time) if more."""
        done = [m["step"] for lines in self.metrics.values() for m in lines if m["time"] < t]
        last = max(done) if done else 0
        if generation is not None:
            started = [l["step"] for l in self.lines if l["generation"] == generation]
            if started:
                last = max(last, max(started) - 1)
        return last


def _first_after(entries, t, pattern, after=None):
    rx = re.compile(pattern)
    for e in entries:
        if e[0] >= t - 0.002 and (after is None or e[0] >= after - 0.002) and rx.search(e[3]):
            return e
    return None


def analyze_injection(rec, inj, changes):
    """What one fault (other than a coordinator restart) cost."""
    out = {"kind": inj.kind, "victim": inj.victim, "t_fault": inj.t_fault,
           "generation_before": inj.generation,
           "at_step": rec.last_step_before(inj.t_fault, inj.generation if inj.victim == "all" else None),
           "error": inj.error, "notes": list(inj.notes)}
    later = sorted(g for g, rows in rec.by_generation.items()
                   if g > inj.generation and any(m["time"] > inj.t_fault for _, m in rows))
    if not later:
        out["error"] = out["error"] or "no generation after %d ever completed a step" % inj.generation
        return out
    g_new = later[0]
    rows = rec.by_generation[g_new]
    first = {}
    for name, m in rows:
        if m["time"] > inj.t_fault and (name not in first or m["time"] < first[name]["time"]):
            first[name] = m
    t_first = max(m["time"] for m in first.values())
    mine = [c for c in changes if inj.generation < int(c.get("to_generation", 0)) <= g_new]
    to_new = [c for c in mine if int(c.get("to_generation", 0)) == g_new]
    resume = int(to_new[0].get("resume_step", 0)) if to_new else min(m["step"] for _, m in rows) - 1
    reported = sum(int(c.get("steps_lost", 0)) for c in mine)
    # The victim's own records after the fault are not the job's: a stopped
    # worker continued after it was fenced may finish (and log) the step it
    # was stopped in, in the generation its peers had already left. Count
    # the steps in flight and the committed work from everyone else (from
    # every worker when all of them were killed).
    others = (lambda n: True) if inj.victim == "all" else (lambda n: n != inj.victim)
    started = {l["step"] for l in rec.lines
               if inj.generation <= l["generation"] < g_new and l["step"] > resume and
               others(l["_worker"])}
    completed = [m["step"] for g in range(inj.generation, g_new)
                 for n, m in rec.by_generation.get(g, []) if others(n)]
    victim_after = sorted({m["step"] for g in range(inj.generation, g_new)
                           for n, m in rec.by_generation.get(g, [])
                           if n == inj.victim and m["time"] > inj.t_fault and m["step"] > resume})
    left = [n for c in mine for n in c.get("left", [])]
    out.update({
        "generation_new": g_new,
        "generations_between": g_new - inj.generation - 1,
        "causes": [c.get("cause", "").replace("CHANGE_CAUSE_", "") for c in mine],
        "reasons": [c.get("reason", "") for c in mine],
        "left": left,
        "wrongly_evicted": [n for n in left if inj.victim not in ("all",) and n != inj.victim],
        "state_source": (to_new[0].get("state_source", "") if to_new else "").replace("STATE_SOURCE_", ""),
        "resume_step": resume,
        "world_size_new": first and next(iter(first.values()))["world_size"],
        "t_first_step": t_first,
        "recovery_seconds": t_first - inj.t_fault,
        "steps_lost_reported": reported,
        # Steps started past the resume step: the step in flight (and, from a
        # checkpoint, every step since it).
        "steps_discarded": len(started),
        "in_flight": max(0, len(started) - reported),
        "steps_lost_total": reported + max(0, len(started) - reported),
        # Committed work redone: completed somewhere, yet past the resume step.
        "completed_past_resume": max(0, (max(completed) if completed else resume) - resume),
        # Steps past the resume step that the fenced victim completed in its
        # old generation after the fault (trained outside any live generation).
        "victim_steps_after_fault": victim_after,
        "victim_steps_detail": [
            {k: m.get(k) for k in ("step", "step_seconds", "allreduce_ms", "wait_ms")} |
            {"after_fault_seconds": round(m["time"] - inj.t_fault, 4)}
            for g in range(inj.generation, g_new) for n, m in rec.by_generation.get(g, [])
            if n == inj.victim and m["step"] in victim_after],
        "pause_seconds_reported": [round(float(c.get("pause_seconds", 0)), 4) for c in mine],
    })
    out["phases"] = phases(rec, inj, g_new, t_first, out)
    return out


def phases(rec, inj, g_new, t_first, info):
    """Where the time from the fault to the first new step went, from the
    daemons' logs (millisecond timestamps): each value is seconds since the
    previous milestone."""
    t0 = inj.t_fault
    clog = rec.coordinator_log
    detect_any = _first_after(clog, t0, r"^job \S+, generation \d+: ")
    victim_rx = re.escape(inj.victim)
    detect_victim = (_first_after(clog, t0, r"^job \S+, generation \d+: .*\b%s\b" % victim_rx)
                     if inj.kind not in ("whole",) else None)
    formed = _first_after(clog, t0, r"^job \S+: generation %d formed" % g_new)
    members = sorted({n for n, m in rec.by_generation[g_new]})
    left, joined, ring, train = [], [], [], []
    for n in members:
        wl = rec.worker_logs[n]
        j = _first_after(wl, t0, r"joined generation %d of" % g_new)
        if j is None:
            continue
        joined.append(j[0])
        lf = [e for e in wl if t0 - 0.002 <= e[0] <= j[0] and "left generation" in e[3]]
        if lf:
            left.append(lf[-1][0])
        r = _first_after(wl, j[0], r"ring of \d+ proven")
        if r:
            ring.append(r[0])
        tr = _first_after(wl, j[0], r"training .* from step")
        if tr:
            train.append(tr[0])
    out = {}
    marks = [("detection", (detect_victim or detect_any or [None])[0] if inj.kind != "whole" else None)]
    if inj.kind == "whole":
        marks = [("restart (script)", inj.t_heal),
                 ("coordinator up", (_first_after(clog, inj.t_heal, r"^serving ") or [None])[0]),
                 ("generation formed", formed[0] if formed else None)]
    else:
        marks.append(("abort (left old generation)", max(left) if left else None))
    marks += [("re-form (joined new generation)", max(joined) if joined else None),
              ("rendezvous (ring proven)", max(ring) if ring else None),
              ("state broadcast (training from step)", max(train) if train else None),
              ("first step", t_first)]
    prev = t0
    for name, t in marks:
        if t is None:
            out[name] = None
            continue
        out[name] = round(max(0.0, t - prev), 4)
        prev = max(prev, t)
    if detect_any and detect_victim and detect_any[0] < detect_victim[0] - 0.001:
        out["first detection (another rank)"] = round(detect_any[0] - t0, 4)
        out["first detection line"] = detect_any[3][:300]
    if formed:
        out["coordinator formed the generation at"] = round(formed[0] - t0, 4)
    return out


def analyze_coordinator(rec, inj, changes, median_step):
    """A coordinator kill -9 and restart: training should not stop at all."""
    out = {"kind": inj.kind, "victim": inj.victim, "t_fault": inj.t_fault,
           "generation_before": inj.generation, "at_step": rec.last_step_before(inj.t_fault),
           "error": inj.error, "notes": list(inj.notes), "outage_seconds": inj.t_heal - inj.t_fault}
    clog = rec.coordinator_log
    serving = _first_after(clog, inj.t_heal, r"^serving ")
    adopted = _first_after(clog, inj.t_heal, r"^adopted generation (\d+)")
    gave_up = _first_after(clog, inj.t_fault, r"^job \S+, generation \d+: ")
    t_serving = serving[0] if serving else inj.t_heal
    out["t_serving"] = t_serving
    if inj.kind == "coordinator_stop":
        # Never gone: it goes on with the generation it had, or re-forms
        # (a fault line after the stop).
        t_end = inj.t_back or inj.t_heal + 4.0
        out["adopted"] = gave_up is None or gave_up[0] > t_end
        out["adopted_after_seconds"] = inj.t_heal - inj.t_fault if out["adopted"] else None
    else:
        out["adopted"] = bool(adopted) and (gave_up is None or gave_up[0] > adopted[0])
        out["adopted_after_seconds"] = (adopted[0] - inj.t_fault) if adopted else None
        # The restart's outcome: adopted, or given up (a new generation), by
        # then; later changes belong to later faults.
        t_end = adopted[0] if adopted else (gave_up[0] if gave_up else t_serving + 12.0)
    mine = [c for c in changes if inj.t_fault - 0.01 <= float(c.get("at_unix_seconds", 0)) <= t_end + 0.5
            and int(c.get("from_generation", 0)) >= inj.generation]
    out["causes"] = [c.get("cause", "").replace("CHANGE_CAUSE_", "") for c in mine]
    out["steps_lost_reported"] = sum(int(c.get("steps_lost", 0)) for c in mine)
    # Steps completed while no coordinator was serving.
    times = rec.step_times()
    during = {s for lines in times.values() for t, s, _, _ in lines if inj.t_fault < t < t_serving}
    out["steps_during_outage"] = len(during)
    # The longest gap between consecutive completed steps of a rank, from
    # just before the fault until the members were adopted (or 2 s after the
    # restart), skipping gaps that span an epoch's end (its evaluation).
    end = max(t_end, t_serving) + 1.0
    longest, longest_any, where = 0.0, 0.0, None
    for name, lines in times.items():
        for (t1, s1, e1, g1), (t2, s2, e2, g2) in zip(lines, lines[1:]):
            if t2 < inj.t_fault - 0.2 or t1 > end:
                continue
            gap = t2 - t1
            longest_any = max(longest_any, gap)
            if e1 == e2 and g1 == g2 and gap > longest:
                longest, where = gap, (name, s2, g2, t1)
    out["longest_gap_seconds"] = longest
    if where is not None:
        # Where that gap's time went: every rank's timers for the step that
        # ended it.
        name, step, gen, t1 = where
        out["longest_gap_detail"] = {
            "worker": name, "step": step, "began_after_fault_seconds": round(t1 - inj.t_fault, 4),
            "coordinator_serving": t1 >= t_serving,
            "ranks": {n: {k: m.get(k) for k in ("data_ms", "forward_ms", "backward_ms",
                                                 "allreduce_ms", "wait_ms", "optimizer_ms")}
                      for n, lines in rec.metrics.items() for m in lines
                      if m["step"] == step and m["generation"] == gen}}
    out["longest_gap_with_epoch_ends"] = longest_any
    out["median_step_seconds"] = median_step
    # The generation training once the restarted coordinator had its members
    # back (not a later fault's).
    out["generation_after"] = max((m["generation"] for lines in rec.metrics.values() for m in lines
                                   if inj.t_fault < m["time"] <= end), default=inj.generation)
    out["steps_lost_total"] = out["steps_lost_reported"]
    if out["generation_after"] != inj.generation:
        # Not adopted: a new generation was formed; count what it discarded.
        started = {l["step"] for l in rec.lines if l["generation"] == inj.generation and
                   l["step"] > min((int(c.get("resume_step", 0)) for c in mine), default=10**12)}
        out["steps_lost_total"] += len(started)
    return out


def rejoin_phases(rec, change):
    """A JOINED change: how long its joiners took from "joined generation G"
    to their ring proven (their own set-up, which the members wait for at the
    rendezvous), against the members' wait for the same."""
    g = int(change.get("to_generation", 0))
    joiners = set(change.get("joined", []))
    own, wait = [], []
    for n, entries in rec.worker_logs.items():
        j = next((e for e in entries if re.search(r"joined generation %d of" % g, e[3])), None)
        if j is None:
            continue
        r = _first_after(entries, j[0], r"ring of \d+ proven")
        if r is None:
            continue
        (own if n in joiners else wait).append(r[0] - j[0])
    return {"generation": g, "joined": sorted(joiners),
            "pause_seconds": float(change.get("pause_seconds", 0)),
            "joiner_join_to_ring": max(own) if own else None,
            "members_join_to_ring": max(wait) if wait else None}


def median_step_seconds(rec):
    gaps = []
    for lines in rec.step_times().values():
        for (t1, s1, e1, g1), (t2, s2, e2, g2) in zip(lines, lines[1:]):
            if g1 == g2 and e1 == e2 and s2 == s1 + 1:
                gaps.append(t2 - t1)
    return statistics.median(gaps) if gaps else 0.0


def longest_undisturbed_gap(rec):
    """Longest gap between consecutive steps of one rank within a generation
    and epoch: what the machine's own hiccups look like."""
    longest = 0.0
    for lines in rec.step_times().values():
        for (t1, s1, e1, g1), (t2, s2, e2, g2) in zip(lines, lines[1:]):
            if g1 == g2 and e1 == e2 and s2 == s1 + 1:
                longest = max(longest, t2 - t1)
    return longest


def samples(rec, dataset_size, epochs):
    """Per epoch: samples never trained, trained more than once beyond the
    padding, and the padding itself (DistributedSampler's wrap-around in the
    generation that ends the epoch: ceil(R / W) * W - R extra positions for
    the R samples left at its start and its world size W)."""
    kept, _ = coverage.committed_lines(rec.lines)
    per_epoch = coverage.coverage(rec.lines, dataset_size, epochs)
    out = []
    for epoch in range(epochs):
        missing, repeated, _ = per_epoch[epoch]
        lines = [l for l in kept if l["epoch"] == epoch]
        extra = sum(c - 1 for c in repeated.values())
        padding = 0
        if lines:
            last = max(l["generation"] for l in lines)
            before = sum(len(l["indices"]) for l in lines if l["generation"] != last)
            world = max(l["world_size"] for l in lines if l["generation"] == last)
            rest = dataset_size - before
            padding = -(-rest // world) * world - rest if rest > 0 else 0
        out.append({"epoch": epoch, "skipped": len(missing), "padding": padding,
                    "duplicated": extra - padding, "trained": sum(len(l["indices"]) for l in lines),
                    "skipped_examples": missing[:10],
                    "duplicated_examples": dict(list(repeated.items())[:10]) if extra > padding else {}})
    return out


def analyze(run, injections, final, dataset_size=chaos.FASHION_MNIST_TRAIN, workers=3):
    """Everything measured about a finished run and its faults."""
    rec = Records(run, workers)
    changes = final.get("generation_changes", [])
    median = median_step_seconds(rec)
    results = []
    for inj in injections:
        if inj.kind in ("coordinator", "coordinator_stop"):
            results.append(analyze_coordinator(rec, inj, changes, median))
        else:
            results.append(analyze_injection(rec, inj, changes))
    epochs = int(run.job["epochs"])
    per_epoch = samples(rec, dataset_size, epochs)
    # Test accuracy per epoch, from the coordinator's log (the last line per
    # epoch: a whole-job restart may train an epoch's end twice).
    epoch_accuracy = {}
    for _, _, _, msg in rec.coordinator_log:
        m = re.match(r"epoch (\d+) done: test accuracy ([\d.]+)", msg)
        if m:
            epoch_accuracy[int(m.group(1))] = float(m.group(2))
    joins = [c for c in changes if c.get("cause") == "CHANGE_CAUSE_JOINED"]
    join_detail = [rejoin_phases(rec, c) for c in joins]
    return {
        "dir": run.dir,
        "job": run.job,
        "raw_injections": [dataclasses.asdict(i) for i in injections],
        "final": {k: final.get(k) for k in ("state", "message", "test_accuracy", "elapsed_seconds",
                                            "global_step", "generation_changes")},
        "state": final.get("state"),
        "message": final.get("message"),
        "test_accuracy": final.get("test_accuracy"),
        "epoch_accuracy": [epoch_accuracy[e] for e in sorted(epoch_accuracy)],
        "elapsed_seconds": final.get("elapsed_seconds"),
        "global_step": int(final.get("global_step", 0)),
        "median_step_seconds": median,
        "longest_gap_within_generation": longest_undisturbed_gap(rec),
        "injections": results,
        "samples": {
            "skipped": sum(e["skipped"] for e in per_epoch),
            "duplicated": sum(e["duplicated"] for e in per_epoch),
            "padding": sum(e["padding"] for e in per_epoch),
            "per_epoch": per_epoch,
        },
        "rejoins": {"count": len(joins),
                    "pause_seconds": [round(float(c.get("pause_seconds", 0)), 4) for c in joins],
                    "detail": join_detail},
    }


def injection_from(d):
    return Injection(**{f.name: d[f.name] for f in dataclasses.fields(Injection) if f.name in d})


def finish_checks(run):
    """After run.close(): crashed processes and what was left behind."""
    alive, segments = run.leftovers()
    return {"crashed": run.crashed(), "processes_left": alive, "shm_left": segments}


def summarize(values):
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "max": max(values),
            "min": min(values)}


def dump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
