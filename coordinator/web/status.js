// The ddp status page: polls /api/status once a second and redraws. Charts
// are plain SVG drawn here (no library, nothing fetched from elsewhere);
// every text from the server goes in with textContent, never as HTML.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const POLL_MS = 1000;
  const COLORS = ["#2e90fa", "#f79009", "#12b76a", "#f04438", "#7a5af8", "#06aed4", "#ee46bc",
                  "#667085", "#b54708", "#3b7c0f"];
  const CAUSE_COLORS = {START: "#12b76a", LOST: "#f04438", HUNG: "#f79009", FAILED: "#d92d20",
                        JOINED: "#2e90fa", COORDINATOR_RESTART: "#7a5af8", ADOPTED: "#06aed4",
                        SHRUNK: "#ee46bc"};
  // StepTimings' fields as protobuf JSON names them; "other" is the rest of
  // the step's wall time (reports, bookkeeping).
  const PHASES = [["dataMs", "data", "#98a2b3"], ["forwardMs", "forward", "#2e90fa"],
                  ["backwardMs", "backward", "#7a5af8"],
                  ["allreduceWaitMs", "all-reduce wait", "#f04438"],
                  ["optimizerMs", "optimizer", "#12b76a"], ["otherMs", "other", "#d0d5dd"]];

  const $ = (id) => document.getElementById(id);
  const color = (rank) => COLORS[rank % COLORS.length];
  // "JOB_STATE_RUNNING" -> "running"
  const enumName = (v, prefix) => String(v || "").replace(prefix, "").toLowerCase()
      .replace(/_/g, " ") || "unspecified";
  const num = (v) => (typeof v === "number" ? v : Number(v || 0));  // uint64 comes as a string

  function fmt(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
    return v.toFixed(digits === undefined ? (a >= 100 ? 0 : a >= 10 ? 1 : 3) : digits);
  }
  function duration(seconds) {
    if (!isFinite(seconds) || seconds <= 0) return "-";
    const s = Math.round(seconds);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }
  function bytes(n) {
    if (!n) return "0";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return fmt(n, i ? 1 : 0) + " " + units[i];
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function svg(parent, tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function renderSummary(s, now) {
    $("job-id").textContent = s.jobId || "(no job)";
    const state = enumName(s.state, "JOB_STATE_");
    const badge = $("job-state");
    badge.textContent = state;
    badge.className = "badge " + state;
    $("job-message").textContent = s.message || "";
    const step = num(s.globalStep), total = num(s.totalSteps);
    const spec = s.spec || {};
    const cards = [
      ["generation", String(num(s.generation))],
      ["world size", String(s.worldSize) + " (" + s.attachedWorkers + " attached)"],
      ["step", total ? step + " / " + total : String(step)],
      ["epoch", (num(s.epoch) + 1) + " / " + num(s.epochs)],
      ["loss (mean)", fmt(s.loss)],
      ["samples/s", fmt(s.samplesPerSec)],
      ["ETA", duration(s.etaSeconds)],
      ["test accuracy", s.testAccuracy ? fmt(100 * s.testAccuracy, 1) + " %" : "-"],
      ["elapsed", duration(s.elapsedSeconds)],
      ["faults", s.faults + " / " + ((spec.faultBudget !== undefined) ? spec.faultBudget : "-")],
      ["global batch", String(num(s.globalBatch))],
      ["checkpoint", num(s.lastCheckpointStep) ? "step " + num(s.lastCheckpointStep) : "-"],
      ["waiting on data", s.dataWaitFraction ? fmt(100 * s.dataWaitFraction, 0) + " % (rank " +
                          num(s.dataWaitRank) + ")" : "-"],
    ];
    const data = spec.dataset || {};
    if (data.skipBadSamples) cards.push(["samples skipped", String(num(s.samplesSkipped))]);
    const box = $("summary");
    clear(box);
    for (const [label, value] of cards) {
      const card = el("div", undefined, "card");
      card.appendChild(el("div", label, "label"));
      card.appendChild(el("div", value, "value"));
      box.appendChild(card);
    }
    renderDataNote(s);
    $("progress-bar").style.width = (total ? Math.min(100, 100 * step / total) : 0) + "%";
    $("updated").textContent = "Coordinator time " + new Date(now * 1000).toLocaleTimeString() + ".";
  }

  // Training that waits on data, and bad samples skipped, said in words.
  function renderDataNote(s) {
    const notes = [];
    if (s.dataWaitFraction > 0.1) {
      notes.push("Training waits on data: rank " + num(s.dataWaitRank) + " spent " +
                 fmt(100 * s.dataWaitFraction, 0) + " % of its recent steps waiting for its next " +
                 "batch (raise dataset.loaderThreads or prefetchBatches, or read from faster " +
                 "storage).");
    }
    const bad = s.badSamples || [];
    if (num(s.samplesSkipped) > 0 || bad.length) {
      notes.push(num(s.samplesSkipped) + " samples replaced; bad: " + bad.join("; "));
    }
    $("data-note").textContent = notes.join(" ");
  }

  function renderTimeline(changes, now) {
    const box = $("timeline");
    clear(box);
    const left = 20, right = 880, y = 30;
    if (!changes.length) {
      svg(box, "text", {x: left, y: 38, class: "empty"}, "no generation yet");
      return;
    }
    const t0 = changes[0].atUnixSeconds, t1 = Math.max(now, t0 + 1);
    const x = (t) => left + (right - left) * (t - t0) / (t1 - t0);
    svg(box, "line", {x1: left, x2: right, y1: y, y2: y, class: "axis"});
    changes.forEach((c, i) => {
      const end = i + 1 < changes.length ? changes[i + 1].atUnixSeconds : t1;
      const cause = enumName(c.cause, "CHANGE_CAUSE_").toUpperCase().replace(/ /g, "_");
      const fill = CAUSE_COLORS[cause] || "#667085";
      const g = svg(box, "g", {class: "generation", "data-generation": num(c.toGeneration)});
      svg(g, "rect", {x: x(c.atUnixSeconds), y: y - 6, width: Math.max(1, x(end) - x(c.atUnixSeconds)),
                      height: 12, fill: fill, "fill-opacity": 0.25});
      svg(g, "circle", {cx: x(c.atUnixSeconds), cy: y, r: 5, fill: fill});
      svg(g, "text", {x: x(c.atUnixSeconds) + 4, y: y - 10},
          "g" + num(c.toGeneration) + " " + enumName(c.cause, "CHANGE_CAUSE_"));
      svg(g, "title", {}, c.reason || "");
    });
    svg(box, "text", {x: left, y: 62}, new Date(t0 * 1000).toLocaleTimeString());
    svg(box, "text", {x: right, y: 62, "text-anchor": "end"}, "now");

    const body = $("changes").tBodies[0];
    clear(body);
    for (const c of changes.slice().reverse()) {
      const tr = el("tr");
      const cells = [
        num(c.fromGeneration) + " \u2192 " + (num(c.toGeneration) || "forming"),
        enumName(c.cause, "CHANGE_CAUSE_"),
        new Date(c.atUnixSeconds * 1000).toLocaleTimeString(),
        String(c.worldSize), String(num(c.resumeStep)), String(num(c.stepsLost)),
        c.pauseSeconds ? fmt(c.pauseSeconds, 2) + " s" : "-",
        (c.left || []).join(", "), (c.joined || []).join(", "), c.reason || ""];
      cells.forEach((v, i) => tr.appendChild(el("td", v, i === 9 ? "detail" : undefined)));
      body.appendChild(tr);
    }
  }

  // One line per rank, x = step. `pick` chooses the y value of a point
  // [unix_seconds, step, loss, samples_per_sec]. A loss that falls by
  // orders of magnitude is drawn on a log scale, or its tail is a flat line.
  function renderChart(id, ranks, rawPick, zeroBased) {
    let pick = rawPick, unlog = (v) => v;
    const values = [];
    for (const r of ranks) for (const p of r.points) values.push(rawPick(p));
    const finite = values.filter((v) => v !== null && isFinite(v));
    const lo = Math.min.apply(null, finite), hi = Math.max.apply(null, finite);
    const logScale = !zeroBased && finite.length > 0 && lo > 0 && hi / lo > 100;
    if (logScale) {
      pick = (p) => { const v = rawPick(p); return v > 0 ? Math.log10(v) : null; };
      unlog = (v) => Math.pow(10, v);
    }
    const box = $(id);
    clear(box);
    const L = 52, R = 430, T = 12, B = 206;
    let xmin = Infinity, xmax = -Infinity, ymin = Infinity, ymax = -Infinity;
    for (const r of ranks) {
      for (const p of r.points) {
        const v = pick(p);
        if (v === null || !isFinite(v)) continue;
        xmin = Math.min(xmin, p[1]); xmax = Math.max(xmax, p[1]);
        ymin = Math.min(ymin, v); ymax = Math.max(ymax, v);
      }
    }
    if (!isFinite(xmin)) {
      svg(box, "text", {x: L, y: 120, class: "empty"}, "no steps reported yet");
      return;
    }
    if (zeroBased) ymin = Math.min(0, ymin);
    if (ymax === ymin) { ymax += Math.abs(ymax) * 0.1 || 1; ymin -= zeroBased ? 0 : Math.abs(ymin) * 0.1; }
    if (xmax === xmin) xmax = xmin + 1;
    const X = (v) => L + (R - L) * (v - xmin) / (xmax - xmin);
    const Y = (v) => B - (B - T) * (v - ymin) / (ymax - ymin);
    for (let i = 0; i <= 4; i++) {
      const v = ymin + (ymax - ymin) * i / 4;
      svg(box, "line", {x1: L, x2: R, y1: Y(v), y2: Y(v), class: "axis"});
      svg(box, "text", {x: L - 4, y: Y(v) + 4, "text-anchor": "end"}, fmt(unlog(v)));
    }
    svg(box, "text", {x: L, y: B + 16}, "step " + xmin);
    svg(box, "text", {x: R, y: B + 16, "text-anchor": "end"}, "step " + xmax);
    if (logScale) svg(box, "text", {x: (L + R) / 2, y: B + 16, "text-anchor": "middle"}, "log scale");
    ranks.forEach((r, i) => {
      const pts = [];
      for (const p of r.points) {
        const v = pick(p);
        if (v !== null && isFinite(v)) pts.push(X(p[1]).toFixed(1) + "," + Y(v).toFixed(1));
      }
      svg(box, "polyline", {class: "curve", "data-rank": r.rank, points: pts.join(" "),
                            stroke: color(r.rank)});
      svg(box, "text", {x: L + 8 + 92 * (i % 4), y: B + 30, fill: color(r.rank)},
          "rank " + r.rank + " " + r.worker_id);
    });
  }

  function renderBreakdown(members) {
    const box = $("breakdown");
    const rows = members.filter((w) => w.stepSeconds > 0);
    const rowH = 22, top = 26;
    box.setAttribute("viewBox", "0 0 900 " + (top + Math.max(1, rows.length) * rowH + 8));
    clear(box);
    let x = 110;
    for (const [, label, fill] of PHASES) {
      svg(box, "rect", {x: x, y: 6, width: 10, height: 10, fill: fill});
      svg(box, "text", {x: x + 14, y: 15}, label);
      x += 24 + 7 * label.length;
    }
    if (!rows.length) {
      svg(box, "text", {x: 110, y: top + 14, class: "empty"}, "no step reported yet");
      return;
    }
    const totals = rows.map((w) => 1000 * w.stepSeconds);
    const scale = 640 / Math.max.apply(null, totals);
    rows.forEach((w, i) => {
      const t = w.timings || {};
      const parts = Object.assign({}, t);
      const known = PHASES.slice(0, 5).reduce((a, [k]) => a + (t[k] || 0), 0);
      parts.otherMs = Math.max(0, totals[i] - known);
      const y = top + i * rowH;
      svg(box, "text", {x: 4, y: y + 14}, "rank " + w.rank);
      let px = 110;
      for (const [key, label, fill] of PHASES) {
        const ms = parts[key] || 0;
        const width = ms * scale;
        if (width <= 0) continue;
        const r = svg(box, "rect", {x: px, y: y + 2, width: width, height: rowH - 6, fill: fill,
                                    class: "phase", "data-phase": key});
        svg(r, "title", {}, label + ": " + fmt(ms, 2) + " ms");
        px += width;
      }
      svg(box, "text", {x: px + 6, y: y + 14}, fmt(totals[i], 1) + " ms");
    });
  }

  function renderWorkers(workers) {
    const body = $("workers").tBodies[0];
    clear(body);
    const sorted = workers.slice().sort((a, b) =>
        (a.rank < 0) - (b.rank < 0) || a.rank - b.rank || a.workerId.localeCompare(b.workerId));
    for (const w of sorted) {
      const state = enumName(w.state, "WORKER_STATE_");
      const tr = el("tr", undefined, state);
      tr.dataset.workerId = w.workerId;
      const r = w.reduction || {};
      const cells = [
        [w.rank >= 0 ? String(w.rank) : "-", "num"], [w.workerId], [w.host], [w.device], [state],
        [enumName(w.phase, "STEP_PHASE_")], [String(num(w.step)), "num"], [fmt(w.lastLoss), "num"],
        [fmt(w.samplesPerSec), "num"],
        [(r.bucketsReduced || 0) + " / " + (r.bucketsTotal || 0), "num"],
        [fmt(r.allreduceMs, 2), "num"], [fmt(r.waitMs, 2), "num"], [bytes(num(r.bytes)), "num"],
        [String((w.unusedParameters || []).length), "num"],
        [fmt(w.secondsSinceHeartbeat, 1) + " s ago", "num"], [w.detail || "", "detail"]];
      for (const [text, cls] of cells) tr.appendChild(el("td", text, cls));
      if (w.unusedParameters && w.unusedParameters.length) {
        tr.cells[13].title = w.unusedParameters.join("\n");
      }
      body.appendChild(tr);
    }
  }

  // The workers a job held over time, as a step line: [unix_seconds,
  // workers, world_size] points, one per change, drawn up to now.
  function allocationLine(points, now, maxWorkers) {
    const w = 160, h = 24;
    const box = document.createElementNS(SVG, "svg");
    box.setAttribute("viewBox", "0 0 " + w + " " + h);
    box.setAttribute("class", "allocation");
    if (!points.length) return box;
    const t0 = points[0][0], span = Math.max(now - t0, 1);
    const x = (t) => 1 + (w - 2) * Math.min(1, Math.max(0, (t - t0) / span));
    const y = (n) => h - 2 - (h - 4) * n / Math.max(maxWorkers, 1);
    let d = "";
    points.forEach((p, i) => {
      d += (i ? " L" + x(p[0]) + " " + y(points[i - 1][1]) + " L" : "M") + x(p[0]) + " " + y(p[1]);
    });
    d += " L" + x(now) + " " + y(points[points.length - 1][1]);
    svg(box, "path", {d: d, class: "curve", stroke: COLORS[0]});
    svg(box, "title", {}, points.map((p) => p[1] + " worker(s) from " +
        new Date(p[0] * 1000).toLocaleTimeString()).join("\n"));
    return box;
  }

  // Every job of the pool: running, and the last few that ended.
  function renderJobs(jobs, allocations, now) {
    const body = $("jobs").tBodies[0];
    clear(body);
    const byJob = {};
    for (const a of allocations) byJob[a.job_id] = a.points;
    const most = Math.max(1, ...allocations.map((a) => Math.max(0, ...a.points.map((p) => p[1]))));
    for (const j of jobs) {
      const state = enumName(j.state, "JOB_STATE_");
      const tr = el("tr", undefined, state);
      tr.dataset.jobId = j.jobId;
      const cells = [[j.jobId], [state], [String(j.priority || 0), "num"], [j.owner || "-"],
                     [String(j.workers || 0), "num"]];
      for (const [text, cls] of cells) tr.appendChild(el("td", text, cls));
      const line = el("td");
      line.appendChild(allocationLine(byJob[j.jobId] || [], now, most));
      tr.appendChild(line);
      for (const [text, cls] of [[String(j.worldSize || 0), "num"],
                                 [String(num(j.globalStep)), "num"],
                                 [fmt(j.samplesPerSec), "num"], [j.message || "", "detail"]]) {
        tr.appendChild(el("td", text, cls));
      }
      body.appendChild(tr);
    }
  }

  // Jobs waiting for the current one to end, next first.
  function renderQueue(queue, size) {
    const body = $("queue").tBodies[0];
    clear(body);
    $("queue-size").textContent = size ? "(" + size + " waiting)" : "(empty)";
    for (const j of queue) {
      const tr = el("tr");
      tr.dataset.jobId = j.jobId;
      const cells = [[String(j.queuePosition), "num"], [j.jobId], [String(j.priority || 0), "num"],
                     [j.owner || "-"], [duration(j.ageSeconds || 0), "num"],
                     [j.message || "", "detail"]];
      for (const [text, cls] of cells) tr.appendChild(el("td", text, cls));
      body.appendChild(tr);
    }
  }

  function render(data) {
    const s = data.status || {};
    const changes = s.generationChanges || [];
    const workers = s.workers || [];
    const ranks = (data.history && data.history.ranks) || [];
    renderSummary(s, data.now_unix_seconds);
    renderTimeline(changes, data.now_unix_seconds);
    renderChart("loss-chart", ranks, (p) => p[2], false);
    renderChart("rate-chart", ranks, (p) => p[3], true);
    renderBreakdown(workers.filter((w) => w.rank >= 0 && w.state !== "WORKER_STATE_LOST"));
    renderWorkers(workers);
    renderJobs(s.jobs || [], (data.history && data.history.jobs) || [], data.now_unix_seconds);
    renderQueue(s.queue || [], s.queuedJobs || 0);
  }

  function setConnection(ok, why) {
    $("conn").textContent = ok ? "" : "coordinator unreachable (" + why + "); retrying";
  }

  async function poll() {
    try {
      const response = await fetch("/api/status", {cache: "no-store"});
      if (!response.ok) throw new Error("HTTP " + response.status);
      render(await response.json());
      setConnection(true);
    } catch (e) {
      setConnection(false, e.message);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
