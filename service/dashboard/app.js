// tokenmill dashboard: plain browser JavaScript, no library, no build step, nothing loaded from elsewhere.
// The API key lives in this tab's sessionStorage and goes out only as a bearer header to this page's origin.
// Every value from the API is rendered as text (textContent / SVG text nodes), never as markup.
// The page folds no events itself: what it shows of a job is the job detail (GET /v1/jobs/{id}, the service's
// summary folded by pipeline/job/fold.py), fetched again on each event of the job's stream and while it runs.
"use strict";

const KEY_ITEM = "tokenmill.apiKey";
const JOBS_EVERY_MS = 3000;        // the jobs list
const DETAIL_EVERY_MS = 2000;      // the selected job while it is not finished
const SCHEDULES_EVERY_MS = 10000;  // schedules change rarely
const RECONNECT_MS = 2000;         // an event stream that broke off
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined || Number.isNaN(n)) ? "-" : Math.round(n).toLocaleString("en-US");

let selected = null;  // {id, stream: AbortController, detailTimer, lastEvent, terminal, loading, stale}
let timers = [];

// ---- the key ---------------------------------------------------------------------------------------------

function apiKey() { return sessionStorage.getItem(KEY_ITEM); }

function setStatus(text, isError = false) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", isError);
}

class Unauthorized extends Error {}

async function api(path, init = {}) {
  const headers = { ...(init.headers || {}), Authorization: `Bearer ${apiKey()}` };
  const r = await fetch(path, { ...init, headers, cache: "no-store" });
  if (r.status === 401) {
    forget("the API key was refused");
    throw new Unauthorized();
  }
  return r;
}

function forget(reason) {
  sessionStorage.removeItem(KEY_ITEM);
  stop();
  $("main").hidden = true;
  $("key-form").hidden = false;
  $("forget").hidden = true;
  setStatus(reason || "", Boolean(reason));
}

function stop() {
  timers.forEach(clearInterval);
  timers = [];
  deselect();
}

async function connect() {
  $("key-form").hidden = true;
  $("forget").hidden = false;
  $("main").hidden = false;
  try {
    await refreshJobs();
  } catch (e) {
    if (!(e instanceof Unauthorized)) setStatus(`cannot reach the API: ${e.message}`, true);
    return;
  }
  refreshSchedules();
  timers.push(setInterval(() => refreshJobs().catch((e) => {
    if (!(e instanceof Unauthorized)) setStatus(`cannot reach the API: ${e.message}`, true);
  }), JOBS_EVERY_MS));
  timers.push(setInterval(refreshSchedules, SCHEDULES_EVERY_MS));
  const wanted = new URLSearchParams(location.hash.slice(1)).get("job");
  if (wanted) select(wanted);
}

// ---- jobs list -------------------------------------------------------------------------------------------

async function refreshJobs() {
  const r = await api("v1/jobs?limit=100");
  if (!r.ok) { setStatus(`jobs: HTTP ${r.status}`, true); return; }
  const { items } = await r.json();
  const body = $("jobs").tBodies[0];
  body.replaceChildren(...items.map(jobRow));
  $("jobs-empty").hidden = items.length > 0;
  setStatus(`connected; updated ${new Date().toLocaleTimeString()}`);
}

function jobRow(job) {
  const tr = document.createElement("tr");
  tr.dataset.job = job.id;
  tr.classList.toggle("selected", selected !== null && selected.id === job.id);
  tr.append(cell(job.name), cell(badge(job.state)),
            cell(new Date(job.created_at).toLocaleString([], { dateStyle: "short", timeStyle: "short" })));
  tr.addEventListener("click", () => select(job.id));
  return tr;
}

function cell(content, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  if (content instanceof Node) td.append(content); else td.textContent = content;
  return td;
}

function badge(state) {
  const span = document.createElement("span");
  span.className = `state ${String(state).toLowerCase()}`;
  span.textContent = state;
  return span;
}

// ---- one job ---------------------------------------------------------------------------------------------

function deselect() {
  if (selected === null) return;
  selected.stream.abort();
  clearInterval(selected.detailTimer);
  selected = null;
}

function select(id) {
  deselect();
  history.replaceState(null, "", `#job=${encodeURIComponent(id)}`);
  for (const tr of $("jobs").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.job === id);
  const sel = { id, stream: new AbortController(), detailTimer: null, lastEvent: 0, terminal: false,
                loading: false, stale: false };
  selected = sel;
  $("job-panel").hidden = false;
  refresh(sel);
  sel.detailTimer = setInterval(() => { if (!sel.terminal) refresh(sel); }, DETAIL_EVERY_MS);
  follow(sel);
}

function refresh(sel) {
  // one detail request at a time: a stream catching up delivers hundreds of events at once, and those that
  // arrive while a request is out ask for one more after it
  if (sel.loading) { sel.stale = true; return; }
  sel.loading = true;
  loadDetail(sel).catch(() => {}).finally(() => {
    sel.loading = false;
    if (sel.stale && sel === selected) { sel.stale = false; refresh(sel); }
  });
}

async function loadDetail(sel) {
  const r = await api(`v1/jobs/${encodeURIComponent(sel.id)}`);
  if (sel !== selected) return;
  if (!r.ok) { $("job-title").textContent = `job ${sel.id}: HTTP ${r.status}`; return; }
  const job = await r.json();
  sel.terminal = TERMINAL.has(job.state);
  $("job-panel").dataset.job = job.id;
  $("job-panel").dataset.state = job.state;
  $("job-title").textContent = job.name;
  const meta = [job.state, `attempt ${job.attempt}`];
  if (job.phase) meta.push(`phase ${job.phase}`);
  if (job.throughput.docs_per_s) meta.push(`${fmt(job.throughput.docs_per_s)} docs/s`);
  if (job.throughput.tokens_per_s) meta.push(`${fmt(job.throughput.tokens_per_s)} tokens/s`);
  if (job.tokens) meta.push(`${fmt(job.tokens)} tokens`);
  $("job-meta").textContent = meta.join(" \u00b7 ");
  $("job-error").hidden = !job.error;
  $("job-error").textContent = job.error ? `${job.error.category}: ${job.error.message || ""}` : "";
  renderStages(job.stages);
  renderShards(job.shards);
  renderThroughput(job.series);
}

function renderStages(stages) {
  // stages: [{stage: "01-normalize", docs_in, docs_out, dropped: {reason: n}}], in pipeline order
  const rows = [...stages].sort((a, b) => a.stage.localeCompare(b.stage));
  renderFunnel(rows);
  renderDrops(rows);
}

const stageName = (key) => key.replace(/^\d+-/, "");

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function renderFunnel(rows) {
  const chart = $("funnel");
  const W = 560, rowH = 30, labelW = 120, numW = 150, barW = W - labelW - numW;
  const H = Math.max(1, rows.length) * rowH + 26;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  if (rows.length === 0) {
    chart.replaceChildren(svg("text", { x: 8, y: 22, class: "muted" }, "no stage figures yet"));
    return;
  }
  const max = Math.max(1, ...rows.map((r) => r.docs_in || 0));
  const legendY = H - 4;
  const legend = svg("g", { class: "legend" });
  legend.append(svg("rect", { class: "out", x: labelW, y: legendY - 9, width: 10, height: 10 }),
                svg("text", { x: labelW + 14, y: legendY, class: "muted" }, "kept"),
                svg("rect", { class: "in", x: labelW + 60, y: legendY - 9, width: 10, height: 10 }),
                svg("text", { x: labelW + 74, y: legendY, class: "muted" }, "dropped (entered → kept)"));
  chart.replaceChildren(legend, ...rows.map((r, i) => {
    const y = 5 + i * rowH;
    const wIn = barW * (r.docs_in || 0) / max, wOut = barW * (r.docs_out || 0) / max;
    const dropped = Object.values(r.dropped || {}).reduce((a, b) => a + b, 0);
    const g = svg("g", { class: "stage", "data-stage": stageName(r.stage), "data-in": r.docs_in || 0,
                         "data-out": r.docs_out || 0 });
    g.append(svg("title", {}, `${r.stage}: ${fmt(r.docs_in)} in, ${fmt(r.docs_out)} out, ${fmt(dropped)} dropped`),
             svg("text", { x: 0, y: y + 18 }, stageName(r.stage)),
             svg("rect", { class: "in", x: labelW, y: y + 4, width: wIn.toFixed(1), height: rowH - 10 }),
             svg("rect", { class: "out", x: labelW, y: y + 4, width: wOut.toFixed(1), height: rowH - 10 }),
             svg("text", { x: labelW + barW + 8, y: y + 18 }, `${fmt(r.docs_in)} \u2192 ${fmt(r.docs_out)}`));
    return g;
  }));
}

function renderDrops(rows) {
  const drops = [];
  for (const r of rows) {
    for (const [reason, n] of Object.entries(r.dropped || {})) drops.push([stageName(r.stage), reason, n]);
  }
  drops.sort((a, b) => b[2] - a[2] || a[1].localeCompare(b[1]));
  $("drops").tBodies[0].replaceChildren(...drops.map(([stage, reason, n]) => {
    const tr = document.createElement("tr");
    tr.append(cell(stage), cell(reason), cell(fmt(n), "num"));
    return tr;
  }));
  $("drops-empty").hidden = drops.length > 0;
}

function renderShards(shards) {
  const total = shards.total;
  const done = shards.done;
  $("shards-fill").style.width = total ? `${Math.min(100, 100 * done / total).toFixed(1)}%` : (done ? "100%" : "0");
  $("shards-text").textContent = `${fmt(done)} of ${total === null ? "?" : fmt(total)} shards written` +
    (shards.reused ? ` (${fmt(shards.reused)} kept from an earlier attempt)` : "");
}

// ---- events: each one asks for the detail again ------------------------------------------------------------

async function follow(sel) {
  // Server-sent events over fetch (EventSource cannot send an Authorization header); resumes with Last-Event-ID.
  while (sel === selected) {
    try {
      const r = await api(`v1/jobs/${encodeURIComponent(sel.id)}/events`, {
        signal: sel.stream.signal, headers: { "Last-Event-ID": String(sel.lastEvent), Accept: "text/event-stream" } });
      if (!r.ok) return;
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          onFrame(sel, buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
      if (sel.terminal || sel !== selected) return;  // the server ends the stream after the job's last event
    } catch (e) {
      if (e instanceof Unauthorized || sel.stream.signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

function onFrame(sel, frame) {
  const fields = {};
  for (const line of frame.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const k = i < 0 ? line : line.slice(0, i);
    const v = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    fields[k] = k in fields ? `${fields[k]}\n${v}` : v;
  }
  if (fields.id) sel.lastEvent = Number(fields.id);
  if (fields.event === "state" && fields.data) {
    // the service's lifecycle event: a terminal one means the stream is about to end
    try { if (TERMINAL.has(JSON.parse(fields.data).state)) sel.terminal = true; } catch { /* not JSON */ }
  }
  if (fields.id) refresh(sel);
}

function rates(points) {
  // cumulative [seconds since start, total] -> [seconds since start, rate over the step before it]
  const out = [];
  for (let i = 1; i < points.length; i++) {
    const dt = points[i][0] - points[i - 1][0];
    if (dt > 0) out.push([points[i][0], (points[i][1] - points[i - 1][1]) / dt]);
  }
  return out;
}

function renderThroughput(series) {
  // series: {docs: [[seconds, documents read]], tokens: [[seconds, tokens written]]} of the job detail
  const chart = $("throughput");
  const W = 560, H = 220, left = 70, right = 10, laneH = 80;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const lanes = [["docs", "documents/s (curate)", rates((series && series.docs) || [])],
                 ["tokens", "tokens/s (write)", rates((series && series.tokens) || [])]];
  const tMax = Math.max(1, ...lanes.flatMap(([, , pts]) => pts.map((p) => p[0])));
  const nodes = [];
  lanes.forEach(([cls, label, pts], lane) => {
    const top = 18 + lane * (laneH + 25);
    const g = svg("g", { class: `lane ${cls}-lane`, "data-points": pts.length });
    g.append(svg("text", { x: left, y: top - 4 }, label),
             svg("line", { class: "axis", x1: left, y1: top + laneH, x2: W - right, y2: top + laneH }));
    if (pts.length === 0) {
      g.append(svg("text", { x: left + 8, y: top + laneH / 2, class: "muted" }, "no data yet"));
    } else {
      const yMax = Math.max(...pts.map((p) => p[1])) || 1;
      const x = (t) => left + (W - left - right) * t / tMax;
      const y = (v) => top + laneH - laneH * v / yMax;
      const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
      g.append(svg("path", { class: cls, d }),
               svg("text", { x: left - 6, y: top + 10, "text-anchor": "end", class: "muted" }, fmt(yMax)),
               svg("text", { x: left - 6, y: top + laneH, "text-anchor": "end", class: "muted" }, "0"));
      if (pts.length === 1) g.append(svg("circle", { class: cls, cx: x(pts[0][0]), cy: y(pts[0][1]), r: 3 }));
    }
    nodes.push(g);
  });
  nodes.push(svg("text", { x: W - right, y: H - 2, "text-anchor": "end", class: "muted" },
                 `seconds since the attempt started (0 to ${fmt(tMax)})`));
  chart.replaceChildren(...nodes);
}

// ---- schedules (shown only when the API has them) --------------------------------------------------------

async function refreshSchedules() {
  let items = null;
  try {
    const r = await api("v1/schedules");
    if (r.ok) {
      const body = await r.json();
      items = Array.isArray(body.items) ? body.items : null;
    }
  } catch (e) {
    items = null;
  }
  $("schedules-panel").hidden = items === null;
  if (items === null) return;
  $("schedules-empty").hidden = items.length > 0;
  // items: ScheduleOut of /v1/schedules (service/api/schemas.py)
  $("schedules").tBodies[0].replaceChildren(...items.map((sch) => {
    const tr = document.createElement("tr");
    tr.dataset.schedule = sch.id;
    tr.append(cell(sch.name), cell(`${sch.cron} (${sch.timezone})`),
              cell(sch.next_fire_at ? new Date(sch.next_fire_at).toLocaleString() : "-"),
              cell(sch.paused ? "paused" : "active"),
              cell(sch.latest_version === null ? "-" : `v${sch.latest_version}`),
              cell(sch.last_run ? badge(sch.last_run.state) : "-"));
    return tr;
  }));
}

// ---- start -----------------------------------------------------------------------------------------------

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_ITEM, key);
  $("key").value = "";
  connect();
});
$("forget").addEventListener("click", () => forget());
if (apiKey()) connect();
