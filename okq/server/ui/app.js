// okq console: one page, no dependencies. Every number comes from the node's /v1
// API, called with the user's key; the API decides what the key may see and do.
// docs/CONSOLE.md describes the pages and where their numbers come from.
"use strict";

const POLL_S = 5;          // queues and stats, while the tab is visible
const FLEET_POLL_S = 10;   // fleet.status (each node caches it 5 s)
const HISTORY_S = 3600;    // plots: the last hour, kept in this tab only
const store = window.sessionStorage;
const state = {
  key: store.getItem("okq.key") || "",
  ns: store.getItem("okq.ns") || "",
  who: null,
  history: loadHistory("okq.history"),      // [{t, q: {name: sample}}]
  fleetHistory: loadHistory("okq.fleetHistory"),  // [{t, per_s}]
  timers: [],
  view: "text",
};

// -- helpers ---------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function loadHistory(name) {
  try { return JSON.parse(store.getItem(name) || "[]"); } catch (e) { return []; }
}

function saveHistory(name, list) {
  const cut = Date.now() / 1000 - HISTORY_S;
  while (list.length && list[0].t < cut) list.shift();
  try { store.setItem(name, JSON.stringify(list)); } catch (e) { /* full: memory only */ }
}

class ApiError extends Error {
  constructor(status, body) {
    super(body.message || `HTTP ${status}`);
    this.status = status;
    this.code = body.code;
  }
}

async function api(op, body) {
  const headers = { "Content-Type": "application/json" };
  if (state.key) headers.Authorization = "Bearer " + state.key;
  if (state.ns) headers["X-Okq-Namespace"] = state.ns;
  const r = await fetch("/v1/" + op, { method: "POST", headers, body: JSON.stringify(body || {}) });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

const may = (op) => !!state.who && state.who.operations.includes(op);
const main = () => document.getElementById("main");
const fmt = (n) => (n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US"));
const rate = (n) => (n === null || n === undefined ? "–" : n < 10 ? n.toFixed(2) : n.toFixed(0));
const dollars = (n) => "$" + (n < 1 ? n.toFixed(3) : n.toFixed(2));

function age(seconds) {
  if (!seconds) return "–";
  if (seconds < 120) return seconds.toFixed(0) + " s";
  if (seconds < 7200) return (seconds / 60).toFixed(0) + " min";
  if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h";
  return (seconds / 86400).toFixed(1) + " d";
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");
const message = (kind, text) => h("div", { class: "msg " + kind, role: kind === "err" ? "alert" : "status" }, text);

function every(seconds, fn) {
  const tick = async () => { if (document.visibilityState === "visible") await fn(); };
  state.timers.push(setInterval(tick, seconds * 1000));
  return tick();
}

function link(text, onclick, attrs) {
  return h("a", { href: "#", ...(attrs || {}), onclick: (e) => { e.preventDefault(); onclick(); } }, text);
}

// A confirmation in the page (a <dialog>); with `typed`, the user types it first.
function confirmAction(text, typed) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  const label = document.getElementById("confirm-typed-label");
  const input = document.getElementById("confirm-typed");
  const ok = document.getElementById("confirm-ok");
  label.hidden = !typed;
  input.value = "";
  document.getElementById("confirm-name").textContent = typed || "";
  ok.disabled = !!typed;
  input.oninput = () => { ok.disabled = input.value !== typed; };
  return new Promise((resolve) => {
    dlg.onclose = () => resolve(dlg.returnValue === "ok");
    dlg.returnValue = "";
    dlg.showModal();
  });
}

// -- plots: a small SVG line chart ------------------------------------------------------

const COLORS = ["#2563eb", "#16a34a", "#f59e0b", "#9333ea", "#dc2626", "#0891b2"];

function chart(title, series, unit) {
  const W = 560, H = 150, L = 44, B = 18, T = 8;
  // The x axis spans what this tab has seen: a minute at least, an hour at most.
  const now = Date.now() / 1000;
  let first = now;
  for (const s of series) if (s.points.length) first = Math.min(first, s.points[0][0]);
  const span = Math.min(HISTORY_S, Math.max(60, now - first)), t0 = now - span;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
  };
  let max = 0;
  for (const s of series) for (const [, v] of s.points) max = Math.max(max, v);
  max = niceMax(max);
  const x = (t) => L + ((t - t0) / span) * (W - L - 6);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    el("line", { x1: L, x2: W - 6, y1: y(v), y2: y(v), stroke: "#eceff4" });
    el("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, short(v));
  }
  for (const f of [1, 0.75, 0.5, 0.25, 0]) {
    const back = span * f, label = back >= 120 ? `-${Math.round(back / 60)} min` : `-${Math.round(back)} s`;
    el("text", { x: x(now - back), y: H - 4, "text-anchor": f === 1 ? "start" : f ? "middle" : "end" }, f ? label : "now");
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map(([t, v], j) => `${j ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
    el("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.6 });
    const [lt, lv] = s.points[s.points.length - 1];
    el("circle", { cx: x(lt), cy: y(lv), r: 2.5, fill: COLORS[i % COLORS.length] });
  });
  const legend = h("div", { class: "legend" }, series.map((s, i) => {
    const swatch = h("i");
    swatch.style.background = COLORS[i % COLORS.length];
    return h("span", {}, swatch, s.name);
  }));
  return h("div", { class: "chart" }, h("div", { class: "title" }, title + (unit ? ` (${unit})` : "")), svg, legend);
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

const short = (v) => (v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e3 ? (v / 1e3).toFixed(1) + "k" : +v.toFixed(2));

// -- the namespace's queues, sampled every POLL_S seconds -----------------------------

const live = (s) => s.available + s.in_flight + s.scheduled + s.waiting_retry;

async function sample() {
  const { queues } = await api("queues.list");
  const q = {};
  await Promise.all(queues.map(async (info) => {
    try {
      const st = await api("queue.stats", { queue_name: info.name });
      q[info.name] = { ...st, produced: info.produced, info };
    } catch (e) { /* deleted meanwhile */ }
  }));
  state.history.push({ t: Date.now() / 1000, q });
  saveHistory("okq.history", state.history);
  return q;
}

// Items in and out per second between two samples: produced is a store-backed
// counter (every node reads the same manifest); out is what left the live depth.
function rates(name, a, b) {
  const x = a && a.q[name], y = b && b.q[name];
  if (!x || !y || b.t <= a.t || y.produced < x.produced) return { in: null, out: null };
  const dt = b.t - a.t, inn = y.produced - x.produced;
  return { in: inn / dt, out: Math.max(0, inn - (live(y) - live(x))) / dt };
}

function lastTwo() {
  const h = state.history;
  return [h.length > 1 ? h[h.length - 2] : null, h.length ? h[h.length - 1] : null];
}

function depthSeries(names) {
  const fields = [["available", "available"], ["in_flight", "in flight"], ["scheduled", "scheduled"],
    ["waiting_retry", "waiting retry"], ["dead", "dead"]];
  return fields.map(([f, label]) => ({
    name: label,
    points: state.history.filter((s) => names.some((n) => s.q[n]))
      .map((s) => [s.t, names.reduce((sum, n) => sum + (s.q[n] ? s.q[n][f] : 0), 0)]),
  }));
}

function rateSeries(names) {
  const hist = state.history, ins = [], outs = [];
  for (let i = 1; i < hist.length; i++) {
    let a = 0, b = 0, any = false;
    for (const n of names) {
      const r = rates(n, hist[i - 1], hist[i]);
      if (r.in !== null) { a += r.in; b += r.out; any = true; }
    }
    if (any) { ins.push([hist[i].t, a]); outs.push([hist[i].t, b]); }
  }
  return [{ name: "in (produced)", points: ins }, { name: "out (completed, dead-lettered, dropped)", points: outs }];
}

// -- pages -----------------------------------------------------------------------------

async function overview(root) {
  root.append(h("h1", {}, "Queues ", h("span", { class: "badge" }, state.who.namespace)));
  const body = h("div");
  root.append(body);
  await every(POLL_S, async () => {
    let q;
    try { q = await sample(); } catch (e) { body.replaceChildren(message("err", e.message)); return; }
    const names = Object.keys(q).sort();
    const [a, b] = lastTwo();
    const depth = names.reduce((t, n) => t + live(q[n]), 0);
    const table = h("table", { id: "queues" },
      h("tr", {}, ["Queue", "Available", "In flight", "Scheduled", "Waiting retry", "Dead", "Oldest", "In/s", "Out/s"]
        .map((c, i) => h("th", { class: i ? "n" : "" }, c))),
      names.map((n) => {
        const s = q[n], r = rates(n, a, b);
        return h("tr", { "data-queue": n },
          h("td", {}, h("a", { href: "#/queue/" + encodeURIComponent(n) }, n),
            s.info.dead_queue ? h("span", { class: "muted" }, ` → ${s.info.dead_queue}`) : null),
          [s.available, s.in_flight, s.scheduled, s.waiting_retry, s.dead].map((v) => h("td", { class: "n" }, fmt(v))),
          h("td", { class: "n" }, age(s.oldest_age)), h("td", { class: "n" }, rate(r.in)), h("td", { class: "n" }, rate(r.out)));
      }));
    body.replaceChildren(
      h("div", { class: "cards" }, card("queues", names.length), card("live items", fmt(depth)),
        card("history kept", age(state.history.length ? Date.now() / 1000 - state.history[0].t : 0))),
      h("div", { class: "charts" }, chart("Depth, all queues", depthSeries(names), "items"),
        chart("Rates, all queues", rateSeries(names), "items/s")),
      h("h2", {}, "Queues"),
      names.length ? table : h("p", { class: "muted" }, "No queues in this namespace yet."),
      h("p", { class: "note" }, `Refreshed every ${POLL_S} s while this tab is visible. Rates are ` +
        "differences between two samples of counters kept in the store, so any node gives the same; " +
        "the plots keep the samples this tab has taken (up to an hour)."));
  });
}

const card = (k, v) => h("div", { class: "card" }, h("div", { class: "v" }, v), h("div", { class: "k" }, k));

async function queuePage(root, name) {
  const head = h("h1", {}, name);
  const status = h("div");
  const top = h("div"), itemsBox = h("div"), forms = h("div");
  root.append(head, status, top, forms, h("h2", {}, "Items"), itemsBox);
  if (may("queue.produce")) head.append(h("button", { id: "produce-open", onclick: () => produceForm(forms, name, status, reload) }, "Produce test item"));
  if (may("queue.purge")) head.append(h("button", { id: "purge", class: "danger", onclick: () => purge(name, status, reload) }, "Purge"));
  async function reload() { await browse(itemsBox, name, status); }
  await every(POLL_S, async () => {
    try {
      const q = await sample();
      const s = q[name];
      if (!s) { top.replaceChildren(message("err", `no queue ${name}`)); return; }
      const [a, b] = lastTwo(), r = rates(name, a, b), c = s.info;
      top.replaceChildren(
        h("div", { class: "cards" }, card("available", fmt(s.available)), card("in flight", fmt(s.in_flight)),
          card("scheduled", fmt(s.scheduled)), card("waiting retry", fmt(s.waiting_retry)), card("dead", fmt(s.dead)),
          card("oldest", age(s.oldest_age)), card("in/s", rate(r.in)), card("out/s", rate(r.out))),
        h("div", { class: "charts" }, chart("Depth", depthSeries([name]), "items"), chart("Rates", rateSeries([name]), "items/s")),
        h("h2", {}, "Settings"),
        h("dl", { class: "kv", id: "settings" }, [
          ["lease timeout", c.lease_timeout + " s"], ["retention", age(c.retention)],
          ["max attempts", c.max_attempts || "unlimited"], ["dead-letter queue", c.dead_queue || "none"],
          ["expired items to dead letters", c.retention_dead_letter ? "yes" : "no"],
          ["created", when(c.created_at)], ["segments", fmt(c.segments)], ["produced, ever", fmt(c.produced)],
        ].map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    } catch (e) { top.replaceChildren(message("err", e.message)); }
  });
  await reload();
}

function produceForm(box, name, status, reload) {
  const text = h("textarea", { id: "produce-payload", placeholder: "payload (text or JSON)" }, '{"hello": "okq"}');
  const delay = h("input", { id: "produce-delay", type: "number", min: "0", value: "0", size: "6" });
  const send = h("button", { class: "primary", id: "produce-send", onclick: async (e) => {
    e.preventDefault();
    const item = { utf8: text.value };
    if (+delay.value > 0) item.enqueue_at = new Date(Date.now() + delay.value * 1000).toISOString();
    try {
      const r = await api("queue.produce", { queue_name: name, items: [item] });
      status.replaceChildren(message("ok", `produced ${r.ids[0]}`));
      await reload();
    } catch (err) { status.replaceChildren(message("err", err.message)); }
  } }, "Produce");
  box.replaceChildren(h("form", { class: "panel" }, h("h2", {}, "Produce a test item"), text,
    h("div", { class: "row" }, "delay (s)", delay, send)));
}

async function purge(name, status, reload) {
  if (!(await confirmAction(`Purge drops every item of ${name}, now and for good.`, name))) return;
  try {
    await api("queue.purge", { queue_name: name });
    status.replaceChildren(message("ok", `purged ${name}`));
    await reload();
  } catch (e) { status.replaceChildren(message("err", e.message)); }
}

function b64bytes(b64) {
  const bin = atob(b64 || "");
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

function payloadAs(item, view) {
  const bytes = b64bytes(item.bytes);
  if (view === "hex") {
    const lines = [];
    for (let i = 0; i < bytes.length; i += 16) {
      const row = Array.from(bytes.slice(i, i + 16));
      lines.push(i.toString(16).padStart(6, "0") + "  " + row.map((b) => b.toString(16).padStart(2, "0")).join(" "));
    }
    return lines.join("\n");
  }
  const text = item.utf8 !== null && item.utf8 !== undefined ? item.utf8 : null;
  if (text === null) return "(not UTF-8 text: " + bytes.length + " bytes; choose hex)";
  if (view === "json") {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return "(not JSON) " + text; }
  }
  return text;
}

async function browse(box, name, status, dead) {
  const viewSel = h("select", { id: "payload-view" }, ["text", "json", "hex"].map((v) => h("option", { value: v, selected: state.view === v }, v)));
  const table = h("table", { id: "items" });
  const more = h("div");
  const cols = dead ? ["Id", "From queue", "Attempts", "Last error", "Dead since"] : ["Id", "State", "Attempts", "Produced", "Ready", "Last error"];
  table.append(h("tr", {}, cols.map((c) => h("th", {}, c))));
  box.replaceChildren(h("div", { class: "row" }, "payload as", viewSel, h("span", { class: "muted" }, "click an item to see it")), table, more);
  viewSel.addEventListener("change", () => { state.view = viewSel.value; browse(box, name, status, dead); });
  let shown = 0;
  async function page(after) {
    let r;
    try { r = await api("items.list", { queue_name: name, limit: 50, start_after: after }); } catch (e) { status.replaceChildren(message("err", e.message)); return; }
    for (const it of r.items) {
      const meta = it.meta || {};
      const cells = dead
        ? [it.id, meta.source_queue || "–", meta.attempts ?? it.attempts, it.error || meta.error || "", when(it.produced_at)]
        : [it.id, it.state, it.attempts, when(it.produced_at), when(it.ready_at), it.error || meta.error || ""];
      const row = h("tr", { class: "item", "data-id": it.id }, cells.map((c) => h("td", {}, c)));
      const detail = h("tr", { hidden: true, class: "detail" }, h("td", { colspan: cols.length }, itemDetail(it)));
      row.addEventListener("click", () => { detail.hidden = !detail.hidden; });
      table.append(row, detail);
      shown++;
    }
    more.replaceChildren(r.next_start_after
      ? link("more items", () => page(r.next_start_after), { id: "more" })
      : h("p", { class: "muted" }, shown ? `${shown} item(s)` : "No live items."));
  }
  await page(null);
  return table;
}

function itemDetail(it) {
  const meta = { ...(it.meta || {}) };
  const headers = it.headers || meta.headers || {};
  delete meta.headers;
  return h("div", {},
    h("pre", { class: "payload" }, payloadAs(it, state.view)),
    Object.keys(headers).length ? [h("h2", {}, "Headers"), h("pre", { class: "headers" }, JSON.stringify(headers, null, 2))] : null,
    Object.keys(meta).length ? [h("h2", {}, "Meta"), h("pre", {}, JSON.stringify(meta, null, 2))] : null);
}

async function deadPage(root, chosen) {
  root.append(h("h1", {}, "Dead letters"));
  const { queues } = await api("queues.list");
  const deadQueues = [...new Set(queues.map((q) => q.dead_queue).filter(Boolean))].sort();
  if (!deadQueues.length) { root.append(h("p", { class: "muted" }, "No queue of this namespace has a dead-letter queue.")); return; }
  const name = deadQueues.includes(chosen) ? chosen : deadQueues[0];
  root.append(h("nav", { class: "row" }, deadQueues.map((d) => h("a", { href: "#/dead/" + encodeURIComponent(d), class: d === name ? "badge" : "" }, d))));
  const status = h("div"), actions = h("div", { class: "panel row" }), list = h("div");
  root.append(status, actions, h("h2", {}, name), list);
  const st = await api("queue.stats", { queue_name: name });
  const count = st.available + st.scheduled + st.waiting_retry + st.in_flight;
  if (may("dead.redrive")) {
    const all = h("input", { type: "checkbox", id: "select-all" });
    const back = h("button", { id: "redrive", class: "primary", disabled: true }, "Redrive to their source queues");
    const target = h("select", { id: "redrive-target" }, queues.map((q) => q.name).filter((n) => n !== name).map((n) => h("option", { value: n }, n)));
    const move = h("button", { id: "move", disabled: true }, "Move to");
    all.addEventListener("change", () => {
      for (const box of list.querySelectorAll("input.pick")) box.checked = all.checked;
      back.disabled = move.disabled = !all.checked;
    });
    back.addEventListener("click", () => redrive(name, count, null, status, () => deadPage(clear(root), name)));
    move.addEventListener("click", () => redrive(name, count, target.value, status, () => deadPage(clear(root), name)));
    actions.append(h("label", {}, all, ` Select all ${fmt(count)} dead letter(s) in ${name}`), back, move, target);
  } else {
    actions.append(h("span", { class: "muted" }, `${fmt(count)} dead letter(s). This key may not redrive them.`));
  }
  const table = await browse(list, name, status, true);
  if (may("dead.redrive")) {
    for (const row of table.querySelectorAll("tr.item")) {
      row.firstChild.prepend(h("input", { type: "checkbox", class: "pick", disabled: true }), " ");
    }
  }
}

const clear = (el) => { el.replaceChildren(); return el; };

async function redrive(name, count, destination, status, done) {
  const where = destination ? `to ${destination}` : "back to the queues they came from";
  if (!(await confirmAction(`Move all ${count} dead letter(s) of ${name} ${where}?`))) return;
  let moved = 0;
  try {
    for (;;) {
      const body = { queue_name: name, limit: 1000 };
      if (destination) body.destination = destination;
      const r = await api("dead.redrive", body);
      moved += r.moved;
      if (r.moved < 1000) break;
    }
    await done();
    const again = document.querySelector("main > div");
    (again || status).replaceChildren(message("ok", `moved ${moved} dead letter(s) ${where}`));
  } catch (e) { status.replaceChildren(message("err", `moved ${moved}; then: ${e.message}`)); }
}

async function fleetPage(root) {
  root.append(h("h1", {}, "Fleet"));
  const body = h("div");
  root.append(body);
  await every(FLEET_POLL_S, async () => {
    let f;
    try { f = await api("fleet.status"); } catch (e) { body.replaceChildren(message("err", e.message)); return; }
    state.fleetHistory.push({ t: Date.now() / 1000, per_s: f.per_s });
    saveHistory("okq.fleetHistory", state.fleetHistory);
    const procs = f.processes, nodes = procs.filter((p) => p.kind === "node"), comp = procs.filter((p) => p.kind === "compactor");
    const ops = ["get", "put", "list", "head", "delete"];
    const total = ops.reduce((s, o) => s + (f.per_s[o] || 0), 0);
    body.replaceChildren(
      h("div", { class: "cards" }, card("nodes live", `${nodes.filter((n) => n.live).length} of ${nodes.length}`),
        card("store requests/s", rate(total)), card("per month at S3 prices", dollars(f.dollars_per_month)),
        card("sequencer roles", f.roles.length || "none"), card("answered by", f.node)),
      h("div", { class: "charts" }, chart("Store requests, all processes", ["get", "put", "list"].map((o) => ({
        name: o.toUpperCase(), points: state.fleetHistory.map((s) => [s.t, s.per_s[o] || 0]) })), "per s")),
      h("h2", {}, "Processes"), processTable(procs, f.roles),
      h("h2", {}, "Sequencer roles"), f.roles.length ? h("table", { id: "roles" },
        h("tr", {}, ["Shard", "Holder", "Reached at", "Epoch", "Members"].map((c) => h("th", {}, c))),
        f.roles.map((r) => h("tr", {}, h("td", {}, r.shard), h("td", {}, r.holder), h("td", {}, r.url), h("td", {}, r.epoch),
          h("td", {}, Object.keys(r.members).length)))) : h("p", { class: "muted" }, "No sequencer roles: the nodes write directly."),
      h("h2", {}, "Compactor"), comp.length ? h("dl", { class: "kv", id: "compactor" }, comp.flatMap((c) => compactorFacts(c)))
        : h("p", { class: "muted" }, "No compactor reports in this namespace."),
      h("p", { class: "note" }, "Each node and compactor writes a small report to the store every " +
        `${procs.length ? procs[0].interval : 60} s; any node reads them all, so the page is the same whichever node serves it. ` +
        `Prices: S3 Standard, GET $${(f.prices.get * 1000).toFixed(4)} and PUT/LIST $${(f.prices.put * 1000).toFixed(3)} per 1,000; DELETE free.`));
  });
}

function processTable(procs, roles) {
  const holds = (id) => roles.filter((r) => r.holder === id).map((r) => r.shard);
  return h("table", { id: "processes" },
    h("tr", {}, ["Kind", "Id", "Reached at", "Started", "Last report", "GET/s", "PUT/s", "LIST/s", "$/month", "Roles"]
      .map((c, i) => h("th", { class: i >= 5 && i <= 8 ? "n" : "" }, c))),
    procs.map((p) => h("tr", { "data-kind": p.kind },
      h("td", {}, p.kind), h("td", {}, p.id), h("td", {}, p.url || "–"), h("td", {}, when(p.started_at)),
      h("td", { class: p.live ? "state-live" : "state-gone" }, p.live ? `${age(p.age) === "–" ? "0 s" : age(p.age)} ago` : `gone (${age(p.age)} ago)`),
      ["get", "put", "list"].map((o) => h("td", { class: "n" }, rate(p.per_s[o] || 0))),
      h("td", { class: "n" }, dollars(p.dollars_per_month)),
      h("td", {}, holds(p.id).length ? "shard " + holds(p.id).join(", ") : "–"))));
}

function compactorFacts(c) {
  const i = c.info || {};
  const last = i.last_pass_ms ? (Date.now() - i.last_pass_ms) / 1000 : null;
  return [["compactor", c.id], ["last pass", last === null ? "none yet" : `${age(Math.max(last, 1))} ago`],
    ["pass took", i.pass_seconds !== undefined ? i.pass_seconds + " s" : "–"],
    ["lag (longest gap between passes over a queue)", i.lag !== undefined ? i.lag + " s" : "–"],
    ["passes", fmt(i.passes)], ["interval", i.interval ? i.interval + " s" : "–"]]
    .map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]);
}

async function keysPage(root) {
  root.append(h("h1", {}, "API keys"));
  const status = h("div"), list = h("div"), made = h("div");
  root.append(status, made, list);
  async function reload() {
    const { keys } = await api("keys.list");
    list.replaceChildren(h("table", { id: "keys" },
      h("tr", {}, ["Id", "Name", "Role", "Prefixes", "Created", ""].map((c) => h("th", {}, c))),
      keys.map((k) => h("tr", { "data-key": k.id }, h("td", {}, k.id), h("td", {}, k.name), h("td", {}, k.role),
        h("td", {}, k.prefixes.join(", ") || "all queues"), h("td", {}, when(k.created_at)),
        h("td", {}, may("keys.delete") ? h("button", { class: "danger", onclick: () => del(k) }, "Delete") : null)))));
  }
  async function del(k) {
    if (!(await confirmAction(`Delete key ${k.id} (${k.name || k.role})? Every node stops accepting it within seconds.`))) return;
    try { await api("keys.delete", { id: k.id }); await reload(); } catch (e) { status.replaceChildren(message("err", e.message)); }
  }
  if (may("keys.create")) {
    const name = h("input", { id: "key-name", placeholder: "who holds it" });
    const role = h("select", { id: "key-role" }, ["read-only", "producer", "consumer", "admin"].map((r) => h("option", { value: r }, r)));
    const prefixes = h("input", { id: "key-prefixes", placeholder: "prefixes, comma-separated (none: all)" });
    const create = h("button", { class: "primary", id: "key-create", onclick: async (e) => {
      e.preventDefault();
      try {
        const k = await api("keys.create", { name: name.value, role: role.value,
          prefixes: prefixes.value.split(",").map((p) => p.trim()).filter(Boolean) });
        made.replaceChildren(h("div", { class: "panel" }, "New key (shown once, copy it now): ", h("div", { class: "secret", id: "new-key" }, k.key)));
        await reload();
      } catch (err) { status.replaceChildren(message("err", err.message)); }
    } }, "Create key");
    root.insertBefore(h("form", { class: "panel row" }, h("label", {}, "name ", name), h("label", {}, "role ", role),
      h("label", {}, "prefixes ", prefixes), create), list);
  }
  try { await reload(); } catch (e) { status.replaceChildren(message("err", e.message)); }
}

// -- the key, and routing ---------------------------------------------------------------

function loginPage(root, error) {
  const key = h("input", { id: "key", type: "password", autocomplete: "off", placeholder: "okq_…" });
  const ns = h("input", { id: "namespace", placeholder: "the key's own" , value: state.ns });
  const go = h("button", { class: "primary", id: "connect", type: "submit" }, "Connect");
  const form = h("form", { class: "panel login", onsubmit: (e) => {
    e.preventDefault();
    state.key = key.value.trim(); state.ns = ns.value.trim();
    store.setItem("okq.key", state.key); store.setItem("okq.ns", state.ns);
    state.who = null;
    route();
  } }, h("h1", {}, "okq console"),
  error ? message("err", error) : null,
  h("label", { for: "key" }, "API key"), key,
  h("label", { for: "namespace" }, "Namespace (operator keys only)"), ns,
  h("p", { class: "note" }, "The key stays in this tab (sessionStorage) and goes only to this node's API, " +
    "which allows exactly what the key allows. Leave it empty on a node that asks for none."),
  go);
  root.append(form);
  key.focus();
}

function signOut() {
  store.removeItem("okq.key"); store.removeItem("okq.ns");
  state.key = ""; state.ns = ""; state.who = null;
  location.hash = "#/";
  route();
}

async function route() {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  const root = clear(main());
  const [, page, arg] = (location.hash.slice(1) || "/").split("/");
  const who = document.getElementById("who");
  if (!state.who) {
    try { state.who = await api("auth.whoami"); } catch (e) {
      who.replaceChildren();
      document.getElementById("nav").hidden = true;
      loginPage(root, state.key || e.status !== 401 ? e.message : null);
      return;
    }
  }
  document.getElementById("nav").hidden = false;
  document.getElementById("nav-keys").hidden = !may("keys.list");
  who.replaceChildren(h("span", { class: "badge", id: "role" }, state.who.role), " ",
    state.who.key_id, " in ", state.who.namespace, link("sign out", signOut, { id: "sign-out" }));
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === (page || "overview"));
  const name = arg ? decodeURIComponent(arg) : null;
  try {
    if (page === "queue" && name) await queuePage(root, name);
    else if (page === "dead") await deadPage(root, name);
    else if (page === "fleet") await fleetPage(root);
    else if (page === "keys") await keysPage(root);
    else await overview(root);
  } catch (e) { root.append(message("err", e.message)); }
  root.dataset.ready = page || "overview";
}

window.addEventListener("hashchange", route);
route();
