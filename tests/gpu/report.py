#!/usr/bin/env python3
"""Folds device_check.sh's steps (OUT/steps.jsonl) and the jobs' measurements
(OUT/jobs.json) into OUT/results.json and OUT/GPU.md. Usage: report.py OUT."""
import datetime
import json
import os
import subprocess
import sys


def machine():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.strip() or "no GPU seen"
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "steps.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    jobs = {}
    if os.path.exists(os.path.join(out, "jobs.json")):
        with open(os.path.join(out, "jobs.json")) as f:
            jobs = json.load(f)
    results = {"date": datetime.date.today().isoformat(), "machine": machine(), "steps": steps,
               "jobs": jobs, "passed": bool(steps) and all(s["ok"] for s in steps)}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = ["# GPU check", "", "Run of `tests/gpu/device_check.sh` on %s, machine: %s." % (
        results["date"], results["machine"]), "", "| step | ok | seconds |", "| --- | --- | --- |"]
    lines += ["| %s | %s | %d |" % (s["step"], "yes" if s["ok"] else "**no**", s["seconds"])
              for s in steps]
    for name, r in jobs.items():
        lines += ["", "## %s" % name, "", "```", json.dumps(r, indent=2)[:3000], "```"]
    with open(os.path.join(out, "GPU.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:len(steps) + 6]))


if __name__ == "__main__":
    main()
