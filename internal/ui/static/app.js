// The throttler's status page: polls GET /v1/lanes (and each lane's dead
// letters and, every sample interval, its throughput history) and shows one
// row per lane, with a line of starts per second and backlog over the last
// ten minutes drawn in inline SVG. Plain JavaScript, no dependencies;
// every value from the server goes into the page as text, never as HTML.
"use strict";

(function () {
  const API = "../v1/"; // relative: the page works behind a path prefix
  const KEY = "throttler.key"; // sessionStorage: this tab only
  const EVERY = 2000; // ms between polls while visible
  const HIDDEN_EVERY = 10000; // ms between polls while the tab is hidden
  const DEAD_PAGE = 10; // dead letters listed per lane
  const TOP_KEYS = 5; // busiest keys shown per keyed lane
  const JOBS_PAGE = 50; // recent job records read per lane with results
  const JOBS_SHOWN = 10; // of which listed

  const $ = (id) => document.getElementById(id);
  let who = null; // GET /v1/whoami
  let timer = null;
  let gen = 0;
  let running = false;
  const rows = new Map(); // lane name -> {main, detail, cells}
  const histories = new Map(); // lane name -> {at: ms fetched, every: ms, body}
  const SPARK_W = 120, SPARK_H = 34; // the throughput line's box, px

  // el builds an element: el("td", {class: "num"}, "text", child, ...).
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const k of kids) {
      if (k === null || k === undefined || k === false) continue;
      e.append(typeof k === "string" || typeof k === "number" ? document.createTextNode(String(k)) : k);
    }
    return e;
  }

  function key() { return sessionStorage.getItem(KEY) || ""; }

  // call asks the API; it resolves to {status, body} and never sends the key
  // anywhere but this server's own API (relative URL, same origin).
  async function call(method, path, send) {
    const headers = { "Accept": "application/json" };
    const k = key();
    if (k) headers["Authorization"] = "Bearer " + k;
    const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error" };
    if (send !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(send);
    }
    const resp = await fetch(API + path, init);
    let body = null;
    const text = await resp.text();
    if (text) {
      try { body = JSON.parse(text); } catch (_) { body = { detail: text }; }
    }
    return { status: resp.status, body };
  }

  function problem(r) {
    const b = r.body || {};
    return (b.detail || b.title || "HTTP " + r.status) + (b.status ? "" : " (HTTP " + r.status + ")");
  }

  function showError(msg) {
    const e = $("error");
    e.textContent = msg || "";
    e.hidden = !msg;
  }

  function askKey(msg) {
    stop();
    who = null;
    for (const r of rows.values()) { r.main.remove(); r.detail.remove(); }
    rows.clear();
    $("lanes").hidden = true;
    $("empty").hidden = true;
    $("login").hidden = false;
    $("forget").hidden = true;
    $("who").textContent = "";
    $("updated").textContent = "";
    if (msg) showError(msg); else showError("");
    $("key").focus();
  }

  async function begin() {
    showError("");
    let r;
    try {
      r = await call("GET", "whoami");
    } catch (err) {
      showError("Cannot reach the server: " + err.message + " (trying again)");
      timer = setTimeout(begin, EVERY);
      return;
    }
    if (r.status === 401) {
      const had = key() !== "";
      sessionStorage.removeItem(KEY);
      askKey(had ? "The key was refused: " + problem(r) : "");
      return;
    }
    if (r.status !== 200) {
      showError("GET /v1/whoami: " + problem(r) + " (trying again)");
      timer = setTimeout(begin, EVERY);
      return;
    }
    who = r.body;
    $("login").hidden = true;
    $("forget").hidden = who.anonymous;
    $("who").textContent = who.anonymous ? "open API (no keys)" :
      "key " + who.key + " · " + (who.admin ? "admin" : who.read ? "read" : "no read scope");
    document.body.dataset.admin = who.admin ? "yes" : "no";
    running = true;
    tick();
  }

  function stop() {
    running = false;
    clearTimeout(timer);
    timer = null;
  }

  // tick polls once; calls never overlap (one asked for meanwhile runs
  // right after), so that each answer shown is newer than the last.
  let busy = false, again = false;
  async function tick() {
    if (!running) return;
    if (busy) { again = true; return; }
    busy = true;
    clearTimeout(timer);
    try {
      const r = await call("GET", "lanes");
      if (r.status === 401) { sessionStorage.removeItem(KEY); askKey("The key was refused: " + problem(r)); return; }
      if (r.status === 403) { askKey("This key may not watch the lanes: " + problem(r)); return; }
      if (r.status !== 200) throw new Error("GET /v1/lanes: " + problem(r));
      const lanes = r.body.lanes || [];
      const dead = await Promise.all(lanes.map((l) => l.dead > 0 ? deadLetters(l.name) : Promise.resolve(null)));
      const jobs = await Promise.all(lanes.map((l) => l.results ? recentJobs(l.name) : Promise.resolve(null)));
      await Promise.all(lanes.map((l) => history(l.name)));
      if (!running) return;
      render(lanes, dead, jobs);
      gen++;
      const u = $("updated");
      u.dataset.gen = String(gen);
      u.textContent = "updated " + new Date().toLocaleTimeString();
      document.body.classList.remove("stale");
      showError("");
    } catch (err) {
      document.body.classList.add("stale");
      showError("Cannot update: " + err.message + ". The figures below are from the last answer; trying again.");
    } finally {
      busy = false;
    }
    if (!running) return;
    if (again) { again = false; tick(); return; }
    clearTimeout(timer);
    timer = setTimeout(tick, document.hidden ? HIDDEN_EVERY : EVERY);
  }

  // history fetches a lane's throughput samples when its last answer is at
  // least one sample interval old; a failure keeps the last answer.
  async function history(lane) {
    const h = histories.get(lane);
    if (h && Date.now() - h.at < h.every) return;
    try {
      const r = await call("GET", "lanes/" + encodeURIComponent(lane) + "/history");
      if (r.status !== 200 || !r.body || !Array.isArray(r.body.samples)) return;
      const every = Math.max(1000, 1000 * (+r.body.interval_seconds || 5));
      histories.set(lane, { at: Date.now(), every, body: r.body });
    } catch (_) { /* kept: the last answer */ }
  }

  // recentJobs reads a lane's most recently changed job records.
  async function recentJobs(lane) {
    const r = await call("GET", "lanes/" + encodeURIComponent(lane) + "/jobs?limit=" + JOBS_PAGE);
    if (r.status !== 200) return { error: problem(r) };
    return r.body;
  }

  async function deadLetters(lane) {
    const r = await call("GET", "lanes/" + encodeURIComponent(lane) + "/dead?limit=" + DEAD_PAGE);
    if (r.status !== 200) return { error: problem(r) };
    return r.body;
  }

  // Formatting.
  function fmtRate(perSec) {
    if (!(perSec > 0)) return "0";
    if (perSec >= 1) return num(perSec) + "/s";
    if (perSec * 60 >= 1) return num(perSec * 60) + "/min";
    return num(perSec * 3600) + "/h";
  }
  function num(x) {
    if (Number.isInteger(x)) return x.toLocaleString("en-US");
    return x.toLocaleString("en-US", { maximumFractionDigits: x < 10 ? 2 : 1 });
  }
  // goDuration shortens a Go duration string: "1h0m0s" to "1h".
  function goDuration(d) {
    return String(d).replace(/([hm])0m0s$/, "$1").replace(/([hm])0s$/, "$1");
  }
  function fmtDuration(s) {
    if (!isFinite(s)) return "never";
    s = Math.ceil(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }
  function ago(iso) {
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (!isFinite(s)) return "";
    return s < 1 ? "just now" : fmtDuration(s) + " ago";
  }

  // eta: the backlog at the effective rate, after the pause (if any).
  function eta(l) {
    if (!l.backlog) return { text: "—", secs: 0 };
    let wait = 0;
    if (l.paused_until) wait = Math.max(0, (Date.parse(l.paused_until) - Date.now()) / 1000);
    const rate = l.effective_rate || l.rate;
    const secs = rate > 0 ? wait + l.backlog / rate : Infinity;
    return { text: fmtDuration(secs), secs };
  }

  function bar(frac, cls) {
    const b = el("div", { class: "bar" + (cls ? " " + cls : "") }, el("span"));
    setBar(b, frac);
    return b;
  }
  function setBar(b, frac) {
    const f = isFinite(frac) ? Math.max(0, frac) : 0;
    b.firstChild.style.width = Math.min(f, 1) * 100 + "%";
    b.classList.toggle("full", f >= 0.95 && f <= 1.05);
    b.classList.toggle("over", f > 1.05);
  }

  // Rendering: one main row and one detail row (busiest keys, dead letters)
  // per lane, updated in place so that buttons stay under the pointer.
  function render(lanes, dead, jobs) {
    $("lanes").hidden = lanes.length === 0;
    $("empty").hidden = lanes.length !== 0;
    const seen = new Set();
    let backlog = 0, deadN = 0, paused = 0;
    lanes.forEach((l, i) => {
      seen.add(l.name);
      backlog += l.backlog || 0;
      deadN += l.dead || 0;
      if (l.paused) paused++;
      let r = rows.get(l.name);
      if (!r) {
        r = makeRow(l.name);
        rows.set(l.name, r);
      }
      $("rows").append(r.main, r.detail); // keeps the API's order
      fillRow(r, l, dead[i], jobs[i]);
    });
    for (const [name, r] of rows) {
      if (!seen.has(name)) { r.main.remove(); r.detail.remove(); rows.delete(name); }
    }
    $("summary").textContent = lanes.length + (lanes.length === 1 ? " lane" : " lanes") +
      " · " + num(backlog) + " waiting or in flight · " + num(deadN) + " dead" + (paused ? " · " + paused + " paused" : "");
  }

  function makeRow(name) {
    const c = {};
    const cell = (field, cls) => (c[field] = el("td", { class: cls, "data-field": field }));
    const main = el("tr", { class: "lane", "data-lane": name },
      cell("name", "name"), cell("state"), cell("rate", "num"), cell("burst", "num"), cell("backlog", "num"),
      cell("eta", "num"), cell("util", "util"), cell("inflight", "num"), cell("r429", "num"), cell("retrying", "num"),
      cell("dead", "num"));
    c.name.append(el("b", {}, name), el("span", { class: "target" }));
    c.utilBar = bar(0);
    c.utilText = el("span", { class: "sub" });
    c.util.append(c.utilText, c.utilBar);
    c.backlogN = el("span", { class: "big", "data-value": "" });
    c.backlogSub = el("span", { class: "sub" });
    c.backlogBar = bar(0, "thin");
    c.backlog.append(c.backlogN, c.backlogSub, c.backlogBar);
    c.inflightN = el("span", {});
    c.inflightBar = bar(0, "thin");
    c.inflight.append(c.inflightN, c.inflightBar);
    c.badges = el("span", { class: "badges" });
    c.holdBtn = el("button", { type: "button", class: "hold", hidden: true });
    c.holdBtn.addEventListener("click", () => hold(c.holdBtn, name));
    c.state.append(c.badges, c.holdBtn);
    // The throughput line sits under the utilization bar: both are this
    // instance's starts, one over a minute, one over ten.
    c.spark = spark();
    c.sparkText = el("span", { class: "sub" });
    c.history = el("div", { class: "history", "data-field": "history" }, c.spark.svg, c.sparkText);
    c.util.append(c.history);
    const detail = el("tr", { class: "detail", "data-lane": name, hidden: true }, el("td", { colspan: 11 }));
    return { main, detail, c, deadRows: new Map(), detailParts: null };
  }

  function text(node, s) { if (node.textContent !== s) node.textContent = s; }

  function fillRow(r, l, dead, jobs) {
    const c = r.c;
    text(c.name.querySelector(".target"), l.target || "");
    c.name.querySelector(".target").title = l.target || "";

    c.badges.replaceChildren();
    if (l.error) c.badges.append(el("span", { class: "badge error", title: l.error }, "error"));
    if (l.paused) {
      const until = l.paused_until ? " until " + new Date(l.paused_until).toLocaleTimeString() : "";
      const what = l.paused_by_operator ? "paused by operator" : "paused";
      c.badges.append(el("span", { class: "badge paused", title: l.pause_reason || "" }, what + until));
    } else if (!l.error) {
      c.badges.append(el("span", { class: "badge ok" }, "running"));
    }
    // Admin keys get a button to hold the lane or release it.
    c.holdBtn.hidden = !(who && who.admin);
    if (!c.holdBtn.disabled) {
      c.holdBtn.dataset.paused = l.paused_by_operator ? "yes" : "no";
      text(c.holdBtn, l.paused_by_operator ? "Resume" : "Pause");
      c.holdBtn.title = l.paused_by_operator ? "Let every instance start this lane's jobs again" : "Hold this lane on every instance: jobs are still accepted and queued, none starts";
    }
    if (l.adaptive) {
      const slowed = l.effective_rate < l.rate;
      c.badges.append(el("span", { class: "badge " + (slowed ? "slowed" : "adaptive"),
        title: "Adaptive mode: the rate follows the target's rate-limit answers" },
      slowed ? "adaptive " + Math.round(100 * l.effective_rate / l.rate) + "%" : "adaptive"));
    }

    c.rate.replaceChildren(el("span", { class: "big" }, fmtRate(l.effective_rate)));
    if (l.effective_rate !== l.rate) c.rate.append(el("span", { class: "sub" }, "of " + fmtRate(l.rate)));
    if (l.quota) c.rate.append(el("span", { class: "sub" }, "quota " + num(l.quota.limit) + " per " + goDuration(l.quota.per)));
    text(c.burst, num(l.burst));

    text(c.backlogN, num(l.backlog || 0));
    c.backlogN.dataset.value = String(l.backlog || 0);
    text(c.backlogSub, num(l.waiting || 0) + " waiting" + (l.max_backlog ? " · max " + num(l.max_backlog) : ""));
    setBar(c.backlogBar, l.max_backlog ? (l.backlog || 0) / l.max_backlog : 0);
    c.backlogBar.title = l.max_backlog ? Math.round(100 * (l.backlog || 0) / l.max_backlog) + "% of max_backlog" : "";

    const e = eta(l);
    text(c.eta, e.text);
    c.eta.dataset.seconds = String(isFinite(e.secs) ? Math.ceil(e.secs) : -1);

    const u = l.utilization || 0;
    text(c.utilText, Math.round(100 * u) + "% of " + fmtRate(l.rate));
    setBar(c.utilBar, u);
    c.util.dataset.value = String(u);

    text(c.inflightN, num(l.in_flight || 0) + " / " + num(l.max_inflight));
    setBar(c.inflightBar, l.max_inflight ? (l.in_flight || 0) / l.max_inflight : 0);

    text(c.r429, num(l.recent_429 || 0));
    c.r429.className = "num" + (l.recent_429 ? " hot" : "");
    c.r429.title = "over the last " + (l.recent_429_seconds || 60) + " s on this instance";
    text(c.retrying, num(l.retrying || 0));
    text(c.dead, num(l.dead || 0));
    c.dead.className = "num" + (l.dead ? " hot" : "");

    fillHistory(c, histories.get(l.name), l.rate || 0);
    fillDetail(r, l, dead);
    fillJobs(r, l, jobs);
  }

  // spark makes a lane's throughput chart: the backlog as a shaded area (scaled
  // to its own peak) and the starts per second as a line (scaled to the
  // larger of its peak and the lane's rate), oldest sample on the left.
  function spark() {
    // Cloned from the page's <template id="spark">: the HTML parser made
    // it an SVG element, so no namespace is spelled here.
    const svg = $("spark").content.firstElementChild.cloneNode(true);
    return { svg, backlog: svg.querySelector(".backlog"), starts: svg.querySelector(".starts"), title: svg.querySelector("title") };
  }

  function fillHistory(c, h, rate) {
    const samples = h ? h.body.samples : [];
    const sp = c.spark;
    c.history.dataset.points = String(samples.length);
    if (samples.length === 0) {
      sp.starts.setAttribute("points", "");
      sp.backlog.setAttribute("points", "");
      text(c.sparkText, "collecting…");
      sp.title.textContent = "No samples yet: one comes every " + (h ? h.every / 1000 : 5) + " s.";
      return;
    }
    const n = 120; // the ring's length: the line fills from the right
    const step = SPARK_W / (n - 1);
    const x0 = SPARK_W - (samples.length - 1) * step;
    const peakStarts = Math.max(...samples.map((s) => s.starts_per_second || 0), 1e-9);
    const top = Math.max(peakStarts, rate); // a lane at its full rate reaches the top
    const peakBacklog = Math.max(...samples.map((s) => s.backlog || 0), 1);
    const y = (v, peak) => (SPARK_H - 1 - (SPARK_H - 2) * Math.min(v / peak, 1)).toFixed(1);
    const line = samples.map((s, i) => (x0 + i * step).toFixed(1) + "," + y(s.starts_per_second || 0, top));
    sp.starts.setAttribute("points", line.join(" "));
    const area = samples.map((s, i) => (x0 + i * step).toFixed(1) + "," + y(s.backlog || 0, peakBacklog));
    sp.backlog.setAttribute("points", x0.toFixed(1) + "," + SPARK_H + " " + area.join(" ") + " " + SPARK_W + "," + SPARK_H);
    const last = samples[samples.length - 1];
    const mins = Math.round(samples.length * h.every / 60000);
    text(c.sparkText, fmtRate(last.starts_per_second || 0) + " now · peak " + fmtRate(peakStarts > 1e-9 ? peakStarts : 0));
    sp.title.textContent = "Last " + (mins || "<1") + " min: starts per second on this instance (line, peak " +
      fmtRate(peakStarts > 1e-9 ? peakStarts : 0) + ") and backlog (area, peak " + num(peakBacklog) + ")";
    c.history.dataset.lastStarts = String(last.starts_per_second || 0);
  }

  // fillDetail shows a keyed lane's per-key limits and key counts (its
  // "keyed" object) and busiest keys (when the lanes API lists them in
  // "keys", or "keyed.keys"), and the lane's dead letters.
  function fillDetail(r, l, dead) {
    const td = r.detail.firstChild;
    const keyed = l.keyed && typeof l.keyed === "object" ? l.keyed : null;
    const listed = Array.isArray(l.keys) ? l.keys : keyed && Array.isArray(keyed.keys) ? keyed.keys : [];
    const keys = listed.filter((k) => k && typeof k === "object");
    const hasDead = l.dead > 0 && dead;
    r.detail.hidden = !keyed && keys.length === 0 && !hasDead && !l.results;
    if (!r.detailParts) {
      r.detailParts = { keys: el("div", { class: "keys" }), dead: el("div", { class: "dead" }),
        jobs: el("div", { class: "jobs", hidden: true }), record: el("pre", { class: "record", hidden: true }) };
      td.append(r.detailParts.keys, r.detailParts.dead, r.detailParts.jobs, r.detailParts.record);
    }
    const p = r.detailParts;

    p.keys.replaceChildren();
    p.keys.hidden = !keyed && keys.length === 0;
    if (keyed) {
      const bits = [];
      if (keyed.keys_active !== undefined) bits.push(num(keyed.keys_active) + " keys active");
      if (keyed.keys_paused) bits.push(num(keyed.keys_paused) + " paused");
      if (keyed.per_key_rate !== undefined) bits.push("per key " + fmtRate(keyed.per_key_rate) + (keyed.per_key_burst ? ", burst " + num(keyed.per_key_burst) : ""));
      if (keyed.per_key_max_inflight) bits.push(num(keyed.per_key_max_inflight) + " in flight per key");
      if (keyed.ordered) bits.push("ordered");
      p.keys.append(el("span", { class: "keyed-summary" }, el("span", { class: "badge adaptive" }, "keyed"), el("span", { class: "muted" }, bits.join(" · "))));
    }
    if (keys.length) {
      const count = (k) => k.backlog ?? k.waiting ?? 0;
      const busiest = keys.slice().sort((a, b) => count(b) - count(a)).slice(0, TOP_KEYS);
      p.keys.append(el("span", { class: "muted" }, "Busiest keys" + (keys.length > TOP_KEYS ? " (" + TOP_KEYS + " of " + keys.length + ")" : "") + ":"));
      for (const k of busiest) {
        const bits = [num(count(k)) + " waiting"];
        if (k.in_flight !== undefined) bits.push(num(k.in_flight) + " in flight");
        if (k.rate !== undefined) bits.push(fmtRate(k.rate));
        if (k.paused) bits.push("paused");
        p.keys.append(el("span", { class: "key", "data-key": k.key ?? k.name }, el("b", {}, String(k.key ?? k.name ?? "?")), " · " + bits.join(" · ")));
      }
    }

    p.dead.hidden = !hasDead;
    if (!hasDead) { p.dead.replaceChildren(); r.deadRows.clear(); return; }
    if (dead.error) {
      p.dead.replaceChildren(el("p", { class: "hot" }, "Dead letters: " + dead.error));
      r.deadRows.clear();
      return;
    }
    let table = p.dead.querySelector("tbody");
    if (!table) {
      const head = el("h3", {}, el("span", { class: "title" }));
      if (who && who.admin) {
        head.append(replayAllButton(l.name));
      }
      table = el("tbody");
      p.dead.replaceChildren(head, el("table", {},
        el("thead", {}, el("tr", {}, el("th", { class: "num" }, "Seq"), el("th", {}, "Job id"), el("th", {}, "Reason"),
          el("th", { class: "num" }, "Attempts"), el("th", {}, "Last answer"), el("th", {}, "Dead since"),
          who && who.admin ? el("th", {}, "") : null)),
        table));
    }
    const list = dead.dead || [];
    text(p.dead.querySelector(".title"), "Dead letters: " + num(l.dead) + (l.dead > list.length ? " (oldest " + list.length + " shown)" : ""));
    const keep = new Set();
    for (const d of list) {
      keep.add(d.seq);
      let tr = r.deadRows.get(d.seq);
      if (!tr) {
        tr = el("tr", { class: "dead-letter", "data-seq": d.seq },
          el("td", { class: "num" }, String(d.seq)), el("td", {}, el("code", {}, d.id)), el("td", {}, d.reason),
          el("td", { class: "num" }, String(d.attempts)),
          el("td", { class: "err", title: d.last_error || "" }, (d.last_status ? "HTTP " + d.last_status : "") + (d.last_error ? (d.last_status ? " · " : "") + d.last_error : "") || "—"),
          el("td", { class: "since", title: d.dead_at }, ""),
          who && who.admin ? el("td", {}, el("button", { type: "button", class: "replay", onclick: (ev) => replay(ev.currentTarget, l.name, d.seq) }, "Replay")) : null);
        r.deadRows.set(d.seq, tr);
      }
      tr.querySelector(".since").textContent = ago(d.dead_at);
      table.append(tr); // oldest first, as listed
    }
    for (const [seq, tr] of r.deadRows) {
      if (!keep.has(seq)) { tr.remove(); r.deadRows.delete(seq); }
    }
  }

  // fillJobs lists a lane's recent job records (a lane with results): how
  // many of them are in each state, the newest few, and one opened in full.
  function fillJobs(r, l, jobs) {
    const p = r.detailParts;
    if (!p) return;
    p.jobs.hidden = !l.results || !jobs;
    if (p.jobs.hidden) { p.record.hidden = true; return; }
    if (jobs.error) { p.jobs.replaceChildren(el("p", { class: "hot" }, "Jobs: " + jobs.error)); return; }
    const list = Array.isArray(jobs.jobs) ? jobs.jobs : [];
    const byState = new Map();
    for (const j of list) byState.set(j.state, (byState.get(j.state) || 0) + 1);
    const counts = [...byState].map(([st, n]) => num(n) + " " + String(st).replace("_", " ")).join(" · ");
    const body = el("tbody");
    for (const j of list.slice(0, JOBS_SHOWN)) {
      const last = Array.isArray(j.attempts) && j.attempts.length ? j.attempts[j.attempts.length - 1] : null;
      const open = el("button", { type: "button", class: "open-job", "data-id": j.id }, String(j.id));
      open.addEventListener("click", () => openJob(p.record, l.name, j.id));
      body.append(el("tr", { class: "job", "data-state": j.state },
        el("td", {}, open), el("td", {}, String(j.state)),
        el("td", { class: "num" }, String(Array.isArray(j.attempts) ? j.attempts.length : 0)),
        el("td", {}, last ? (last.status ? "HTTP " + last.status : String(last.error || "")) : "—"),
        el("td", { class: "since", title: j.finished_at || j.stored_at || "" }, ago(j.finished_at || j.stored_at))));
    }
    p.jobs.replaceChildren(
      el("h3", {}, "Recent jobs" + (list.length ? " (last " + list.length + "): " + counts : ": none yet")),
      list.length ? el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Job id"), el("th", {}, "State"),
        el("th", { class: "num" }, "Attempts"), el("th", {}, "Last answer"), el("th", {}, "Changed"))), body) : "");
  }

  // openJob shows one job's record, as the API answers it (as text).
  async function openJob(pre, lane, id) {
    const r = await call("GET", "lanes/" + encodeURIComponent(lane) + "/jobs/" + encodeURIComponent(id));
    pre.hidden = false;
    pre.textContent = r.status === 200 ? JSON.stringify(r.body, null, 2) : "Job " + id + ": " + problem(r);
  }

  function replayAllButton(lane) {
    // Two clicks: the first arms the button for 10 seconds.
    let armed = null;
    const b = el("button", { type: "button", class: "replay-all danger" }, "Replay all");
    b.addEventListener("click", async () => {
      if (!armed) {
        b.textContent = "Click again to replay every dead letter";
        b.classList.add("confirm");
        armed = setTimeout(() => { armed = null; b.textContent = "Replay all"; b.classList.remove("confirm"); }, 10000);
        return;
      }
      clearTimeout(armed);
      armed = null;
      b.disabled = true;
      b.textContent = "Replaying…";
      const r = await act("POST", "lanes/" + encodeURIComponent(lane) + "/dead/replay");
      b.disabled = false;
      b.classList.remove("confirm");
      b.textContent = "Replay all";
      if (r) showNote("Replayed " + num(r.replayed || 0) + " dead letters of " + lane + ".");
    });
    return b;
  }

  async function replay(button, lane, seq) {
    button.disabled = true;
    button.textContent = "Replaying…";
    const r = await act("POST", "lanes/" + encodeURIComponent(lane) + "/dead/" + seq + "/replay");
    if (!r) { button.disabled = false; button.textContent = "Replay"; }
  }

  // hold pauses the lane on every instance, or resumes it.
  async function hold(button, lane) {
    const pause = button.dataset.paused !== "yes";
    button.disabled = true;
    button.textContent = pause ? "Pausing…" : "Resuming…";
    const r = await act("PATCH", "lanes/" + encodeURIComponent(lane), { paused: pause });
    button.disabled = false;
    if (r) {
      button.dataset.paused = r.paused_by_operator ? "yes" : "no";
      button.textContent = r.paused_by_operator ? "Resume" : "Pause";
      showNote((r.paused_by_operator ? "Paused " : "Resumed ") + lane + " on every instance.");
    } else {
      button.textContent = pause ? "Pause" : "Resume";
    }
  }

  // act sends a state-changing call; on success the page updates at once.
  async function act(method, path, body) {
    let r;
    try {
      r = await call(method, path, body);
    } catch (err) {
      showError(method + " " + path + ": " + err.message);
      return null;
    }
    if (r.status === 401) { sessionStorage.removeItem(KEY); askKey("The key was refused: " + problem(r)); return null; }
    if (r.status < 200 || r.status > 299) {
      showError(method + " /v1/" + path + " refused: " + problem(r));
      return null;
    }
    tick();
    return r.body || {};
  }

  let noteTimer = null;
  function showNote(msg) {
    const n = $("note");
    clearTimeout(noteTimer);
    n.textContent = msg;
    noteTimer = setTimeout(() => { n.textContent = ""; }, 6000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const k = $("key").value.trim();
      $("key").value = "";
      if (!k) return;
      sessionStorage.setItem(KEY, k);
      begin();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      askKey("");
    });
    document.addEventListener("visibilitychange", () => { if (running && !document.hidden) tick(); });
    begin();
  });
})();
