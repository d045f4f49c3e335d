// tokenmill dashboard: plain browser JavaScript, no library, no build step, nothing loaded from elsewhere.
// The API key lives in this tab's sessionStorage and goes out only as a bearer header to this page's origin.
// Every value from the API is rendered as text (textContent / SVG text nodes), never as markup.
// The page folds no events itself: what it shows of a job is the job detail (GET /v1/jobs/{id}, the service's
// summary folded by pipeline/job/fold.py), fetched again on each event of the job's stream and while it runs.
// It reads fields that a given service may not have yet (a status line, Ray start events) only when present.
"use strict";

const KEY_ITEM = "tokenmill.apiKey";
const JOBS_EVERY_MS = 3000;        // the jobs list
const DETAIL_EVERY_MS = 2000;      // the selected job while it is not finished
const LOG_EVERY_MS = 3000;         // the selected job's log while it runs and "follow" is ticked
const SCHEDULES_EVERY_MS = 10000;  // schedules change rarely
const RECONNECT_MS = 2000;         // an event stream that broke off
const LOG_TAIL_BYTES = 256 << 10;  // the end of a log shown
const VIEW_MAX_CHARS = 512 << 10;  // the most of a file shown in the page (download for all of it)
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const CANCELLABLE = new Set(["QUEUED", "RUNNING"]);
const RETRYABLE = new Set(["FAILED", "CANCELLED"]);
const SVG_NS = "http://www.w3.org/2000/svg";
const VIEWABLE = /\.(json|jsonl|txt)$/;

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined || Number.isNaN(n)) ? "-" : Math.round(n).toLocaleString("en-US");
const secs = (s) => (typeof s === "number") ? `${s < 10 ? s.toFixed(1) : fmt(s)} s` : "-";
const shortId = (id) => String(id).slice(0, 8);
const when = (t) => t ? new Date(t).toLocaleString([], { dateStyle: "short", timeStyle: "medium" }) : "-";

let selected = null;  // the job shown: {id, stream, detailTimer, logTimer, lastEvent, terminal, loading, stale, ...}
let schedule = null;  // the schedule shown: {id, data}
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

async function jsonOf(r) {
  try { return await r.json(); } catch { return null; }
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
  closeSchedule();
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
  refreshMixtures();
  refreshAblations();
  timers.push(setInterval(() => refreshJobs().catch((e) => {
    if (!(e instanceof Unauthorized)) setStatus(`cannot reach the API: ${e.message}`, true);
  }), JOBS_EVERY_MS));
  timers.push(setInterval(() => {
    refreshSchedules(); refreshMixtures(); refreshAblations(); if (schedule) loadSchedule(schedule);
  },
                          SCHEDULES_EVERY_MS));
  const wanted = new URLSearchParams(location.hash.slice(1));
  if (wanted.get("job")) select(wanted.get("job"));
  if (wanted.get("schedule")) openSchedule(wanted.get("schedule"));
}

function setHash() {
  const h = new URLSearchParams();
  if (selected) h.set("job", selected.id);
  if (schedule) h.set("schedule", schedule.id);
  history.replaceState(null, "", `#${h}`);
}

// ---- small DOM helpers -----------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k === "className") node.className = v;
    else if (k.startsWith("data-") || k === "title" || k === "type") node.setAttribute(k, String(v));
    else node[k] = v;
  }
  node.append(...children);
  return node;
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

function idCode(id) {
  // the first 8 of the 16 hex digits; the whole id on hover (title) and in data-id
  return el("code", { className: "id", title: id, "data-id": id, text: shortId(id) });
}

function jobLink(id) {
  if (!id) return document.createTextNode("-");
  const b = el("button", { type: "button", className: "link", title: id, "data-job": id, text: shortId(id) });
  b.addEventListener("click", () => { select(id); $("job-panel").scrollIntoView({ block: "start" }); });
  return b;
}

function say(node, text, isError = false) {
  node.textContent = text;
  node.classList.toggle("error", isError);
}

function locText(loc) {
  // ["body", "inputs", 0, "path"] -> "inputs[0].path": the field of the spec, as the spec spells it
  const parts = Array.isArray(loc) ? (loc[0] === "body" ? loc.slice(1) : loc) : [];
  let out = "";
  for (const p of parts) out += typeof p === "number" ? `[${p}]` : (out ? `.${p}` : String(p));
  return out || "(the spec)";
}

function refusal(r, data) {
  // a refusal's {detail}: a list of {loc, msg} (422, 403) or one message (404, 409, 413...)
  const detail = data && data.detail;
  if (Array.isArray(detail)) {
    return { text: `HTTP ${r.status}: ${detail.length} problem${detail.length === 1 ? "" : "s"}`,
             problems: detail.map((p) => [locText(p && p.loc), String((p && p.msg) || "")]) };
  }
  return { text: `HTTP ${r.status}: ${typeof detail === "string" ? detail : r.statusText}`, problems: [] };
}

// ---- submit ----------------------------------------------------------------------------------------------

async function submitSpec(e) {
  e.preventDefault();
  const out = $("submit-result"), errors = $("submit-errors");
  errors.replaceChildren();
  errors.hidden = true;
  // JSON is sent as JSON; anything else as YAML, which the API reads as written (errors with line and column)
  const text = $("spec").value;
  let spec = null;
  try { spec = JSON.parse(text); } catch { /* YAML */ }
  if (spec !== null && (typeof spec !== "object" || Array.isArray(spec))) {
    say(out, "a job spec is an object: {\"name\": ..., \"inputs\": [...], \"output\": {...}}", true);
    delete out.dataset.job;
    return;
  }
  const headers = { "Content-Type": spec === null ? "application/yaml" : "application/json" };
  const key = $("idempotency").value.trim();
  if (key) headers["Idempotency-Key"] = key;
  $("submit").disabled = true;
  say(out, "submitting...");
  try {
    const r = await api("v1/jobs", { method: "POST", headers, body: spec === null ? text : JSON.stringify(spec) });
    const data = await jsonOf(r);
    if ((r.status === 201 || r.status === 200) && data && data.id) {
      say(out, r.status === 201 ? `queued as job ${data.id}`
                                : `this Idempotency-Key made job ${data.id} before: shown, not queued again`);
      out.dataset.job = data.id;
      refreshJobs().catch(() => {});
      select(data.id);
      return;
    }
    const why = refusal(r, data);
    say(out, why.text, true);
    delete out.dataset.job;
    errors.replaceChildren(...why.problems.map(([loc, msg]) => {
      const li = el("li", { "data-loc": loc });
      li.append(el("code", { text: loc }), document.createTextNode(`: ${msg}`));
      return li;
    }));
    errors.hidden = why.problems.length === 0;
  } catch (err) {
    if (!(err instanceof Unauthorized)) say(out, `cannot reach the API: ${err.message}`, true);
  } finally {
    $("submit").disabled = false;
  }
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
  tr.dataset.state = job.state;
  tr.title = job.output_path ? `${job.id}\n${job.output_path}` : job.id;
  tr.classList.toggle("selected", selected !== null && selected.id === job.id);
  tr.append(cell(job.name), cell(idCode(job.id)), cell(badge(job.state)),
            cell(new Date(job.created_at).toLocaleString([], { dateStyle: "short", timeStyle: "short" })));
  tr.addEventListener("click", () => select(job.id));
  return tr;
}

// ---- one job ---------------------------------------------------------------------------------------------

function deselect() {
  if (selected === null) return;
  selected.stream.abort();
  clearInterval(selected.detailTimer);
  clearInterval(selected.logTimer);
  selected = null;
}

function select(id) {
  deselect();
  for (const tr of $("jobs").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.job === id);
  const sel = { id, stream: new AbortController(), detailTimer: null, logTimer: null, lastEvent: 0, terminal: false,
                loading: false, stale: false, ray: null, job: null, artifacts: null, logLoading: false };
  selected = sel;
  setHash();
  $("job-panel").hidden = false;
  $("job-panel").dataset.job = "";
  $("job-action").textContent = "";
  $("log").textContent = "";
  $("log-info").textContent = "";
  $("job-artifacts").replaceChildren(el("p", { className: "muted", text: "Served once the job has succeeded." }));
  refresh(sel);
  sel.detailTimer = setInterval(() => { if (!sel.terminal) refresh(sel); }, DETAIL_EVERY_MS);
  sel.logTimer = setInterval(() => { if (!sel.terminal && $("log-follow").checked) loadLog(sel); }, LOG_EVERY_MS);
  loadLog(sel);
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
  const wasTerminal = sel.job !== null && TERMINAL.has(sel.job.state);
  const row = [...$("jobs").tBodies[0].rows].find((tr) => tr.dataset.job === job.id);
  if (row && row.dataset.state !== job.state) refreshJobs().catch(() => {});  // the list says the same at once
  sel.job = job;
  sel.terminal = TERMINAL.has(job.state);
  const panel = $("job-panel");
  panel.dataset.job = job.id;
  panel.dataset.state = job.state;
  $("job-title").textContent = job.name;
  const idNode = $("job-id");
  idNode.textContent = shortId(job.id);
  idNode.title = job.id;
  idNode.dataset.id = job.id;
  $("job-output").textContent = job.output_path || "-";
  $("job-cancel").hidden = !CANCELLABLE.has(job.state);
  $("job-retry").hidden = !RETRYABLE.has(job.state);
  $("job-meta").textContent = metaLine(job);
  $("job-activity").textContent = activity(job, sel);
  $("job-phases").textContent = phasesLine(job);
  $("job-error").hidden = !job.error;
  $("job-error").textContent = job.error ? `${job.error.category}: ${job.error.message || ""}` : "";
  renderStages(job);
  renderShards(job);
  renderThroughput(job);
  if (job.state !== "SUCCEEDED" && sel.artifacts !== null) {  // retried: its files are served again once it succeeds
    sel.artifacts = null;
    $("job-artifacts").replaceChildren(el("p", { className: "muted", text: "Served once the job has succeeded." }));
  }
  if (job.state === "SUCCEEDED" && sel.artifacts === null) {
    sel.artifacts = "loading";
    loadArtifacts($("job-artifacts"), `v1/jobs/${encodeURIComponent(job.id)}/artifacts`, () => sel === selected);
  }
  if (sel.terminal && !wasTerminal) loadLog(sel);  // the log's last lines, once
}

function metaLine(job) {
  const t = job.throughput || {};
  const meta = [job.state, `attempt ${job.attempt}`];
  if (t.docs_per_s) meta.push(`${fmt(t.docs_per_s)} docs/s (curate average)`);
  if (t.tokens_per_s) meta.push(`${fmt(t.tokens_per_s)} tokens/s (write-phase average)`);
  if (job.tokens) meta.push(`${fmt(job.tokens)} tokens`);
  const total = job.timings && job.timings.total;
  if (total && job.tokens) meta.push(`${fmt(job.tokens / total)} tokens/s whole-job average (${secs(total)})`);
  if (job.documents !== null && job.documents !== undefined) meta.push(`${fmt(job.documents)} documents kept`);
  return meta.join(" \u00b7 ");
}

const PHASE_WORDS = { ray: "starting Ray", curate: "curating", tokenizer: "training the tokenizer",
                      write: "writing shards",
                      finalize: "publishing the output" };

function activity(job, sel) {
  // what the job is doing now, in words: the service's own line when it has one, else read off the detail
  for (const k of ["status", "status_text", "activity"]) {
    if (typeof job[k] === "string" && job[k]) return job[k];
  }
  switch (job.state) {
    case "QUEUED": return job.attempt ? "queued again: waits for a free slot" : "queued: waits for a free slot";
    case "CANCELLING": return "cancelling: stopping the job's work; nothing will be published";
    case "SUCCEEDED": return `finished${job.timings && job.timings.total ? ` in ${secs(job.timings.total)}` : ""}`;
    case "FAILED": return `failed${job.error ? ` (${job.error.category})` : ""}`;
    case "CANCELLED": return "cancelled: nothing published";
    default: break;
  }
  if (!job.phase) {
    if (sel.ray === "starting") return "starting Ray";
    if (Object.keys(job.phases || {}).length === 0) {
      return sel.ray === "started" ? "Ray started: the job is starting" : "starting the job process and its Ray";
    }
    return job.timings && job.timings.total ? "its work is done: the service is recording the result"
                                            : "between phases";
  }
  let text = PHASE_WORDS[job.phase] || job.phase;
  const p = (job.progress || {})[job.phase];
  if (p) {
    const unit = p.unit === "docs" ? "documents" : (p.unit || "");
    const of = p.total !== null && p.total !== undefined ? ` of ${fmt(p.total)}` : "";
    text += `: ${fmt(p.done)}${of} ${unit} ${{ curate: "read", write: "packed" }[job.phase] || "done"}`;
  }
  if (job.phase === "write") text += ` (${fmt((job.shards || {}).done || 0)} shards so far)`;
  return text;
}

function phasesLine(job) {
  const parts = Object.entries(job.phases || {}).map(([name, p]) => {
    if (p.state === "started") return `${name}: running`;
    return `${name}: ${p.state}${p.state === "finished" ? ` in ${secs(p.seconds)}` : ""}`;
  });
  return parts.length ? `phases \u2014 ${parts.join(" \u00b7 ")}` : "";
}

async function jobAction(what) {
  const sel = selected;
  if (!sel) return;
  const out = $("job-action");
  say(out, `${what}...`);
  try {
    const r = await api(`v1/jobs/${encodeURIComponent(sel.id)}/${what}`, { method: "POST" });
    const data = await jsonOf(r);
    if (r.ok && data) say(out, `${what}: HTTP ${r.status}, the job is ${data.state}`);
    else say(out, `${what}: ${refusal(r, data).text}`, true);
    if (sel === selected) {
      if (r.ok && what === "retry") { sel.terminal = false; sel.artifacts = null; follow(sel); }
      refresh(sel);
    }
    refreshJobs().catch(() => {});
  } catch (err) {
    if (!(err instanceof Unauthorized)) say(out, `${what}: cannot reach the API: ${err.message}`, true);
  }
}

function reuseSpec() {
  if (!selected || !selected.job || !selected.job.spec) return;
  $("spec").value = JSON.stringify(selected.job.spec, null, 2);
  $("submit-details").open = true;
  $("spec").focus();
}

async function copyId() {
  if (!selected) return;
  try {
    await navigator.clipboard.writeText(selected.id);
    say($("job-action"), `copied ${selected.id}`);
  } catch {
    say($("job-action"), `job id: ${selected.id}`);  // no clipboard here: shown whole, to select by hand
  }
}

// ---- the job's log ---------------------------------------------------------------------------------------

async function loadLog(sel) {
  if (sel.logLoading) return;
  sel.logLoading = true;
  try {
    const source = $("log-source").value;
    const r = await api(`v1/jobs/${encodeURIComponent(sel.id)}/logs?tail_bytes=${LOG_TAIL_BYTES}` +
                        `&source=${encodeURIComponent(source)}`);
    if (sel !== selected) return;
    const pre = $("log");
    if (!r.ok) { say($("log-info"), `log: ${refusal(r, await jsonOf(r)).text}`, true); return; }
    const text = await r.text();
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
    const attempt = r.headers.get("X-Attempt");
    say($("log-info"), attempt === "0" ? "no attempt yet" :
      `attempt ${attempt || "?"}, ${fmt(text.length)} characters (the last ${fmt(LOG_TAIL_BYTES / 1024)} KiB at most)` +
      `; read ${new Date().toLocaleTimeString()}`);
  } catch (err) {
    if (!(err instanceof Unauthorized) && sel === selected) say($("log-info"), `log: ${err.message}`, true);
  } finally {
    sel.logLoading = false;
  }
}

// ---- artifacts: fetched with the key, shown in the page or saved from a Blob URL ---------------------------

function artifactPath(base, name) {
  return `${base}/${name.split("/").map(encodeURIComponent).join("/")}`;
}

async function loadArtifacts(container, base, stillWanted) {
  container.replaceChildren(el("p", { className: "muted", text: "loading the list of files..." }));
  try {
    const r = await api(base);
    if (!stillWanted()) return;
    const data = await jsonOf(r);
    if (!r.ok || !data || !Array.isArray(data.files)) {
      container.replaceChildren(el("p", { className: "error", text: `files: ${refusal(r, data).text}` }));
      return;
    }
    renderArtifacts(container, base, data.files);
  } catch (err) {
    if (!(err instanceof Unauthorized)) {
      container.replaceChildren(el("p", { className: "error", text: `files: ${err.message}` }));
    }
  }
}

function renderArtifacts(container, base, files) {
  const viewer = el("pre", { className: "viewer" });
  viewer.hidden = true;
  const note = el("p", { className: "muted artifact-note" });
  const table = el("table", { className: "artifact-list" });
  table.append(el("thead", {}, el("tr", {}, el("th", { text: "file" }), el("th", { className: "num", text: "bytes" }),
                                  el("th", { text: "sha256" }), el("th", { text: "" }))));
  const body = el("tbody");
  for (const f of files) {
    const tr = el("tr", { "data-name": f.name });
    const actions = el("td", { className: "buttons" });
    if (VIEWABLE.test(f.name)) {
      const view = el("button", { type: "button", className: "small view", "data-name": f.name, text: "view" });
      view.addEventListener("click", () => viewArtifact(base, f.name, viewer, note));
      actions.append(view);
    }
    const save = el("button", { type: "button", className: "small download", "data-name": f.name, text: "download" });
    save.addEventListener("click", () => downloadArtifact(base, f.name, note));
    actions.append(save);
    const sha = el("code", { title: f.sha256, text: String(f.sha256).slice(0, 12) });
    tr.append(cell(f.name), cell(fmt(f.bytes), "num"), cell(sha), actions);
    body.append(tr);
  }
  table.append(body);
  const summary = el("p", { className: "muted", text: files.length ? `${files.length} files` : "no published file" });
  container.replaceChildren(summary, el("div", { className: "scroll" }, table), note, viewer);
  const cardName = CARD_NAMES.find((n) => files.some((f) => f.name === n));
  if (cardName) {
    const card = el("div", { className: "card-view" });
    container.prepend(card);
    loadCard(card, base, cardName, new Set(files.map((f) => f.name)));
  }
}

// ---- the dataset card: README.md as text, its SVG figures parsed and sanitized (no innerHTML, no blob: images) --

// README.md: the card (where the Hub reads it); CARD.md: where an output carded before that has it
const CARD_NAMES = ["README.md", "CARD.md"];
const CARD_FIGURE = /\]\((card\/[A-Za-z0-9_-]+\.svg)\)/g;

async function loadCard(box, base, cardName, names) {
  box.replaceChildren(el("h4", { text: "Dataset card" }), el("p", { className: "muted", text: `loading ${cardName}...` }));
  try {
    const r = await api(artifactPath(base, cardName));
    if (!r.ok) { box.replaceChildren(el("p", { className: "error", text: `card: ${refusal(r, await jsonOf(r)).text}` })); return; }
    const text = await r.text();
    const figures = el("div", { className: "card-figures" });
    const shown = [...new Set([...text.matchAll(CARD_FIGURE)].map((m) => m[1]))].filter((n) => names.has(n));
    box.replaceChildren(el("h4", { text: "Dataset card" }), figures,
                        el("pre", { className: "card-text", text }));
    for (const name of shown) {
      const fr = await api(artifactPath(base, name));
      if (!fr.ok) continue;
      const node = safeSvg(await fr.text());
      if (node) figures.append(el("figure", { "data-name": name }, node));
    }
  } catch (err) {
    if (!(err instanceof Unauthorized)) box.replaceChildren(el("p", { className: "error", text: `card: ${err.message}` }));
  }
}

function safeSvg(text) {
  // parsed as XML (scripts in it never run), then stripped of anything active before it joins the page
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const root = doc.documentElement;
  if (!root || root.namespaceURI !== "http://www.w3.org/2000/svg" || root.localName !== "svg") return null;
  // the card's figures carry presentation attributes, no inline style (pipeline/card/figures.py)
  for (const bad of root.querySelectorAll("script, foreignObject, iframe, a, style")) bad.remove();
  for (const node of [root, ...root.querySelectorAll("*")]) {
    node.removeAttribute("style");
    for (const attr of [...node.attributes]) {
      const value = attr.value.trim().toLowerCase();
      if (attr.name.toLowerCase().startsWith("on") || ((attr.localName === "href") && !value.startsWith("#"))) {
        node.removeAttribute(attr.name);
      }
    }
  }
  root.removeAttribute("width");
  root.removeAttribute("height");
  root.setAttribute("class", "card-figure");
  return document.importNode(root, true);
}

async function viewArtifact(base, name, viewer, note) {
  say(note, `reading ${name}...`);
  try {
    const r = await api(artifactPath(base, name));
    if (!r.ok) { say(note, `${name}: ${refusal(r, await jsonOf(r)).text}`, true); return; }
    let text = await r.text();
    if (name.endsWith(".json")) {
      try { text = JSON.stringify(JSON.parse(text), null, 2); } catch { /* shown as it is */ }
    }
    const whole = text.length;
    viewer.textContent = whole > VIEW_MAX_CHARS ? text.slice(0, VIEW_MAX_CHARS) : text;
    viewer.dataset.name = name;
    viewer.hidden = false;
    viewer.scrollIntoView({ block: "nearest" });
    say(note, whole > VIEW_MAX_CHARS ? `${name}: the first ${fmt(VIEW_MAX_CHARS)} of ${fmt(whole)} characters ` +
                                       "(download for all of it)" : `${name}:`);
  } catch (err) {
    if (!(err instanceof Unauthorized)) say(note, `${name}: ${err.message}`, true);
  }
}

async function downloadArtifact(base, name, note) {
  // a plain link cannot send the key: fetch with it, then save the bytes from a Blob URL of this page
  say(note, `downloading ${name}...`);
  try {
    const r = await api(artifactPath(base, name));
    if (!r.ok) { say(note, `${name}: ${refusal(r, await jsonOf(r)).text}`, true); return; }
    const blob = await r.blob();
    const href = URL.createObjectURL(blob);
    const a = el("a", { href, download: name.split("/").pop() });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(href), 60000);
    const etag = (r.headers.get("ETag") || "?").replace(/"/g, "");
    say(note, `${name}: ${fmt(blob.size)} bytes saved (sha256 ${etag})`);
  } catch (err) {
    if (!(err instanceof Unauthorized)) say(note, `${name}: ${err.message}`, true);
  }
}

// ---- charts ----------------------------------------------------------------------------------------------

function renderStages(job) {
  // stages: [{stage: "01-normalize", docs_in, docs_out, dropped: {reason: n}}], in pipeline order
  const rows = [...(job.stages || [])].sort((a, b) => a.stage.localeCompare(b.stage));
  $("funnel-caption").textContent = TERMINAL.has(job.state) ? "Documents through the stages"
                                                             : "Documents through the stages, so far";
  renderFunnel(rows, job);
  renderDrops(rows);
}

const stageName = (key) => key.replace(/^\d+-/, "");

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function renderFunnel(rows, job) {
  const chart = $("funnel");
  const W = 560, rowH = 30, labelW = 120, numW = 150, barW = W - labelW - numW;
  const H = Math.max(1, rows.length) * rowH + 26;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  if (rows.length === 0) {
    // before the first stage report: what is known, the documents read so far, else the job's activity
    const read = job.progress && job.progress.curate;
    if (read && read.done) {
      const g = svg("g", { class: "progress-row", "data-read": read.done });
      g.append(svg("text", { x: 0, y: 23 }, "read"),
               svg("rect", { class: "out", x: labelW, y: 9, width: barW, height: rowH - 10 }),
               svg("text", { x: labelW + barW + 8, y: 23 }, `${fmt(read.done)} so far`),
               svg("text", { x: labelW, y: H - 4, class: "muted" }, "per-stage figures come with the next report"));
      chart.replaceChildren(g);
    } else {
      chart.replaceChildren(svg("text", { x: 8, y: 22, class: "muted" },
                                TERMINAL.has(job.state) ? "no stage figures" : "no stage figures yet"));
    }
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

function renderShards(job) {
  const shards = job.shards || { done: 0, total: null, reused: 0 };
  const total = shards.total, done = shards.done || 0;
  $("shards-fill").style.width = total ? `${Math.min(100, 100 * done / total).toFixed(1)}%` : (done ? "100%" : "0");
  let text;
  if (total !== null && total !== undefined) text = `${fmt(done)} of ${fmt(total)} shards written`;
  else if (done) text = `${fmt(done)} written so far (the total is known when the write phase ends)`;
  else if (TERMINAL.has(job.state)) text = "no shard written";
  else text = `no shard yet: ${activity(job, selected || {})}`;
  $("shards-text").textContent = text + (shards.reused ? ` (${fmt(shards.reused)} kept from an earlier attempt)` : "");
}

// ---- events: each one asks for the detail again ------------------------------------------------------------

async function follow(sel) {
  // Server-sent events over fetch (EventSource cannot send an Authorization header); resumes with Last-Event-ID.
  if (sel.following) return;
  sel.following = true;
  try {
    while (sel === selected) {
      try {
        const r = await api(`v1/jobs/${encodeURIComponent(sel.id)}/events`, {
          signal: sel.stream.signal,
          headers: { "Last-Event-ID": String(sel.lastEvent), Accept: "text/event-stream" } });
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
  } finally {
    sel.following = false;
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
    sel.ray = null;
    try { if (TERMINAL.has(JSON.parse(fields.data).state)) sel.terminal = true; } catch { /* not JSON */ }
  }
  // a service whose job processes report their Ray's start (the page reads these events only when they come)
  if (fields.event === "ray_starting") sel.ray = "starting";
  if (fields.event === "ray_started" || fields.event === "job_started") sel.ray = "started";
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

function renderThroughput(job) {
  // series: {docs: [[seconds, documents read]], tokens: [[seconds, tokens written]]} of the job detail; the
  // dashed line is the phase average the header gives (throughput.docs_per_s, tokens_per_s). Each lane spans
  // its own phase's seconds: a short write phase at the end of a long curate stays readable.
  const series = job.series || {}, avg = job.throughput || {};
  const chart = $("throughput");
  const W = 560, H = 236, left = 84, right = 10, laneH = 80;
  chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const lanes = [["docs", "documents/s read (curate), between progress reports", series.docs || [], avg.docs_per_s],
                 ["tokens", "tokens/s written (write phase), between shard writes", series.tokens || [],
                  avg.tokens_per_s]];
  const nodes = [];
  lanes.forEach(([cls, label, cumulative, mean], lane) => {
    const pts = rates(cumulative);
    const top = 18 + lane * (laneH + 30);
    const g = svg("g", { class: `lane ${cls}-lane`, "data-points": pts.length });
    g.append(svg("text", { x: left, y: top - 4 }, label),
             svg("line", { class: "axis", x1: left, y1: top + laneH, x2: W - right, y2: top + laneH }));
    if (pts.length === 0) {
      g.append(svg("text", { x: left + 8, y: top + laneH / 2, class: "muted" }, "no data yet"));
    } else {
      const t0 = cumulative[0][0], t1 = pts[pts.length - 1][0], span = Math.max(t1 - t0, 1e-3);
      const yMax = Math.max(mean || 0, ...pts.map((p) => p[1])) || 1;
      const x = (t) => left + (W - left - right) * (t - t0) / span;
      const y = (v) => top + laneH - laneH * v / (1.15 * yMax);  // headroom under the lane's title
      const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
      g.append(svg("path", { class: cls, d }),
               svg("text", { x: left - 6, y: y(yMax) + 4, "text-anchor": "end", class: "muted" }, fmt(yMax)),
               svg("text", { x: left - 6, y: y(yMax) + 16, "text-anchor": "end", class: "muted" }, "peak"),
               svg("text", { x: left - 6, y: top + laneH, "text-anchor": "end", class: "muted" }, "0"),
               svg("text", { x: left, y: top + laneH + 12, class: "muted" }, `${t0.toFixed(1)} s`),
               svg("text", { x: W - right, y: top + laneH + 12, "text-anchor": "end", class: "muted" },
                   `${t1.toFixed(1)} s`));
      if (pts.length === 1) g.append(svg("circle", { class: cls, cx: x(pts[0][0]), cy: y(pts[0][1]), r: 3 }));
      if (mean) {
        g.append(svg("line", { class: `average ${cls}`, x1: left, x2: W - right, y1: y(mean), y2: y(mean),
                               "data-average": mean }),
                 svg("text", { x: left + 4, y: y(mean) - 3, class: "muted" }, `average ${fmt(mean)}/s`));
      }
    }
    nodes.push(g);
  });
  nodes.push(svg("text", { x: W / 2, y: H - 2, "text-anchor": "middle", class: "muted" },
                 "seconds since the attempt started (each lane spans its phase)"));
  chart.replaceChildren(...nodes);
}

// ---- mixtures (shown only when the API has them) ---------------------------------------------------------

function pinnedText(pinned) {
  if (pinned && pinned.schedule) return `schedule ${shortId(pinned.schedule)} v${pinned.version}`;
  if (pinned && pinned.job) return `job ${shortId(pinned.job)}`;
  return "-";
}

async function listItems(path) {
  // the `items` of a list route, or null when the API has no such route (the panel stays hidden)
  try {
    const r = await api(path);
    if (!r.ok) return null;
    const body = await r.json();
    return Array.isArray(body.items) ? body.items : null;
  } catch (e) {
    return null;
  }
}

async function refreshMixtures() {
  const items = await listItems("v1/mixtures");
  $("mixtures-panel").hidden = items === null;
  if (items === null) return;
  $("mixtures-empty").hidden = items.length > 0;
  // items: MixtureOut of /v1/mixtures (service/api/routers/mixtures.py); one row per source
  $("mixtures").tBodies[0].replaceChildren(...items.flatMap((mix) => mix.sources.map((src, i) => {
    const tr = document.createElement("tr");
    tr.dataset.mixture = mix.id;
    if (i === 0) {
      const name = cell(mix.name);
      const id = cell(idCode(mix.id));
      name.rowSpan = id.rowSpan = mix.sources.length;
      tr.append(name, id);
    }
    tr.append(cell(src.name), cell(pinnedText(src.pinned)), cell(src.target_share.toFixed(3), "num"),
              cell(src.tokens.toLocaleString(), "num"), cell(src.epochs.toFixed(2), "num"));
    return tr;
  })));
}

// ---- ablations (shown only when the API has them) --------------------------------------------------------

async function refreshAblations() {
  const items = await listItems("v1/ablations");
  $("ablations-panel").hidden = items === null;
  if (items === null) return;
  $("ablations-empty").hidden = items.length > 0;
  // items: AblationOut of /v1/ablations (service/api/routers/ablations.py); one row per variant once finished
  $("ablations").tBodies[0].replaceChildren(...items.flatMap((ab) => {
    const variants = Object.entries(ab.scores || {});
    const rows = variants.length ? variants : [[null, null]];
    return rows.map(([name, scores], i) => {
      const tr = document.createElement("tr");
      tr.dataset.ablation = ab.id;
      if (i === 0) {
        const cells = [cell(ab.name), cell(idCode(ab.id)), cell(ab.state)];
        for (const c of cells) c.rowSpan = rows.length;
        tr.append(...cells);
      }
      const common = scores && scores.common;
      tr.append(cell(name || `${ab.steps_done.length} steps done`),
                cell(common ? common.mean.toFixed(4) : "-", "num"),
                cell(common ? common.spread.toFixed(4) : "-", "num"));
      return tr;
    });
  }));
}

// ---- schedules (shown only when the API has them) --------------------------------------------------------

async function refreshSchedules() {
  const items = await listItems("v1/schedules");
  $("schedules-panel").hidden = items === null;
  if (items === null) return;
  $("schedules-empty").hidden = items.length > 0;
  // items: ScheduleOut of /v1/schedules (service/api/schemas.py)
  $("schedules").tBodies[0].replaceChildren(...items.map((sch) => {
    const tr = document.createElement("tr");
    tr.dataset.schedule = sch.id;
    tr.title = sch.id;
    tr.classList.toggle("selected", schedule !== null && schedule.id === sch.id);
    tr.append(cell(sch.name), cell(`${sch.cron} (${sch.timezone})`),
              cell(sch.next_fire_at ? new Date(sch.next_fire_at).toLocaleString() : "-"),
              cell(sch.paused ? "paused" : "active"),
              cell(sch.latest_version === null || sch.latest_version === undefined ? "-" : `v${sch.latest_version}`),
              cell(sch.last_run ? badge(sch.last_run.state) : "-"));
    tr.addEventListener("click", () => openSchedule(sch.id));
    return tr;
  }));
}

function closeSchedule() {
  schedule = null;
  $("schedule-panel").hidden = true;
  $("schedule-confirm").hidden = true;
}

function openSchedule(id) {
  schedule = { id, data: null, versionShown: null };
  setHash();
  for (const tr of $("schedules").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.schedule === id);
  $("schedule-panel").hidden = false;
  $("schedule-panel").dataset.schedule = "";
  $("schedule-action").textContent = "";
  $("schedule-confirm").hidden = true;
  $("version-artifacts").hidden = true;
  $("version-artifacts").replaceChildren();
  loadSchedule(schedule);
}

async function loadSchedule(sch) {
  const base = `v1/schedules/${encodeURIComponent(sch.id)}`;
  try {
    const [r, rv, rr] = await Promise.all([api(base), api(`${base}/versions`), api(`${base}/runs?limit=20`)]);
    if (sch !== schedule) return;
    const data = await jsonOf(r);
    if (!r.ok || !data) { say($("schedule-title"), `schedule ${sch.id}: ${refusal(r, data).text}`, true); return; }
    sch.data = data;
    const panel = $("schedule-panel");
    panel.dataset.schedule = data.id;
    panel.dataset.paused = String(Boolean(data.paused));
    say($("schedule-title"),
        `${data.name} \u2014 ${data.cron} (${data.timezone}), ${data.paused ? "paused" : "active"}`);
    $("schedule-id").textContent = data.id;
    $("schedule-output").textContent = data.output_path || "-";
    const next = Array.isArray(data.next_fire_times) ? data.next_fire_times : [];
    $("schedule-next").textContent = next.length ? next.slice(0, 3).map(when).join(", ")
                                                  : (data.paused ? "paused" : "-");
    $("schedule-pause").hidden = Boolean(data.paused);
    $("schedule-resume").hidden = !data.paused;
    renderVersions(sch, rv.ok ? await jsonOf(rv) : null);
    renderRuns(rr.ok ? await jsonOf(rr) : null);
  } catch (err) {
    if (!(err instanceof Unauthorized)) say($("schedule-action"), `schedule: ${err.message}`, true);
  }
}

function renderVersions(sch, data) {
  const items = data && Array.isArray(data.items) ? data.items : [];
  $("versions").tBodies[0].replaceChildren(...items.map((v) => {
    const tr = el("tr", { "data-version": v.number });
    const files = el("button", { type: "button", className: "small files", "data-version": v.number, text: "files" });
    files.addEventListener("click", () => showVersionFiles(sch, v.number));
    tr.append(cell(`v${v.number}${data.latest === v.number ? " (latest)" : ""}`), cell(fmt(v.documents), "num"),
              cell(fmt(v.tokens), "num"), cell(fmt(v.shards), "num"), cell(when(v.published_at)),
              cell(jobLink(v.job_id)), cell(files));
    return tr;
  }));
  $("versions-empty").hidden = items.length > 0;
}

function renderRuns(data) {
  const items = data && Array.isArray(data.items) ? data.items : [];
  $("runs").tBodies[0].replaceChildren(...items.map((run) => {
    const tr = el("tr", { "data-run": run.number });
    tr.append(cell(String(run.number)), cell(when(run.fire_at)), cell(badge(run.state)), cell(jobLink(run.job_id)),
              cell(run.version === null || run.version === undefined ? "-" : `v${run.version}`),
              cell(run.message || ""));
    return tr;
  }));
  $("runs-empty").hidden = items.length > 0;
}

function showVersionFiles(sch, number) {
  const box = $("version-artifacts");
  box.hidden = false;
  box.dataset.version = number;
  const inner = el("div");
  box.replaceChildren(el("h3", { text: `Files of v${number}` }), inner);
  loadArtifacts(inner, `v1/schedules/${encodeURIComponent(sch.id)}/versions/${number}/artifacts`,
                () => sch === schedule);
}

const SCHEDULE_ACTIONS = {
  pause: ["Pause", "No slot fires while it is paused; a run already going finishes and publishes."],
  resume: ["Resume", "It fires again from the next slot after now; slots missed while paused are not made up."],
  delete: ["Delete", "Its history goes; its published folders stay on disk but are no longer served."],
};

function askSchedule(what) {
  if (!schedule || !schedule.data) return;
  const [label, why] = SCHEDULE_ACTIONS[what];
  $("schedule-confirm-text").textContent = `${label} schedule \u201c${schedule.data.name}\u201d? ${why}`;
  $("schedule-confirm-yes").textContent = `${label} it`;
  $("schedule-confirm-yes").dataset.action = what;
  $("schedule-confirm").hidden = false;
}

async function confirmedSchedule() {
  const sch = schedule, what = $("schedule-confirm-yes").dataset.action;
  $("schedule-confirm").hidden = true;
  if (!sch || !what) return;
  const base = `v1/schedules/${encodeURIComponent(sch.id)}`;
  const out = $("schedule-action");
  try {
    const r = what === "delete" ? await api(base, { method: "DELETE" })
                                : await api(`${base}/${what}`, { method: "POST" });
    if (!r.ok) { say(out, `${what}: ${refusal(r, await jsonOf(r)).text}`, true); return; }
    if (what === "delete") {
      closeSchedule();
      setHash();
      setStatus(`schedule ${sch.id} deleted`);
    } else {
      say(out, `${what}: HTTP ${r.status}`);
      loadSchedule(sch);
    }
    refreshSchedules();
  } catch (err) {
    if (!(err instanceof Unauthorized)) say(out, `${what}: cannot reach the API: ${err.message}`, true);
  }
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
$("submit-form").addEventListener("submit", submitSpec);
$("job-cancel").addEventListener("click", () => jobAction("cancel"));
$("job-retry").addEventListener("click", () => jobAction("retry"));
$("job-reuse").addEventListener("click", reuseSpec);
$("job-copy").addEventListener("click", copyId);
$("log-refresh").addEventListener("click", () => { if (selected) loadLog(selected); });
$("log-source").addEventListener("change", () => { if (selected) { $("log").textContent = ""; loadLog(selected); } });
$("schedule-pause").addEventListener("click", () => askSchedule("pause"));
$("schedule-resume").addEventListener("click", () => askSchedule("resume"));
$("schedule-delete").addEventListener("click", () => askSchedule("delete"));
$("schedule-confirm-yes").addEventListener("click", confirmedSchedule);
$("schedule-confirm-no").addEventListener("click", () => { $("schedule-confirm").hidden = true; });
if (apiKey()) connect();
