// Trimaran's management page: a small script over /api/v1 with a bearer token.
// Every value from the server is written with textContent (client ids and payloads are untrusted).
"use strict";

const POLL_MS = 2000;
const state = { token: sessionStorage.getItem("trimaran-token"), tab: "overview", last: null, lastQueues: {}, lastBridges: {}, timer: null, vhost: "" };

const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const message = data && data.error ? data.error.message : `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message);
  }
  return data;
}

async function all(path) {
  let items = [];
  let url = path;
  while (url) {
    const page = await api("GET", url);
    items = items.concat(page.items.filter(inVhost));
    url = page.next;
  }
  return items;
}

const seg = (value) => encodeURIComponent(value);

function showError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; return; }
  box.textContent = error.message || String(error);
  box.hidden = false;
  if (error.status === 401) logout();
}

function cell(row, value) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "-" : String(value);
  row.appendChild(td);
  return td;
}

function button(parent, label, action, danger) {
  const b = document.createElement("button");
  b.textContent = label;
  if (danger) b.className = "danger";
  b.addEventListener("click", async () => {
    try { await action(); showError(null); await refresh(); } catch (error) { showError(error); }
  });
  parent.appendChild(b);
  return b;
}

function actions(row) {
  const td = document.createElement("td");
  row.appendChild(td);
  return td;
}

function fill(tbody, items, render) {
  tbody.replaceChildren();
  for (const item of items) {
    const row = document.createElement("tr");
    render(row, item);
    tbody.appendChild(row);
  }
}

function duration(seconds) {
  seconds = Math.max(0, Math.floor(seconds));
  const d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600), m = Math.floor(seconds % 3600 / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${seconds % 60}s`;
  return `${seconds}s`;
}

const rate = (now, before, seconds) => (before === undefined || seconds <= 0 ? "-" : ((now - before) / seconds).toFixed(1));

// -- charts: the server's samples (/api/v1/history) drawn as inline SVG, no library ----------------

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f6feb", "#d9480f", "#2f9e44", "#ae3ec9", "#e8590c", "#0c8599", "#5c940d", "#c2255c"];
const CHART = { width: 600, height: 170, left: 48, right: 8, top: 8, bottom: 22 };
const MAX_QUEUE_LINES = 8;

function svgElement(name, attributes, parent) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (parent) parent.appendChild(element);
  return element;
}

const short = (value) => (value >= 1e6 ? `${(value / 1e6).toFixed(1)}M` : value >= 1e4 ? `${Math.round(value / 1e3)}k`
  : value >= 1e3 ? `${(value / 1e3).toFixed(1)}k` : `${Math.round(value * 10) / 10}`);

// series: [{name, values: [number|null, ...]}] over the same times (epoch ms). A null breaks the line.
function drawChart(svg, times, series, span) {
  const { width, height, left, right, top, bottom } = CHART;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const end = times.length ? times[times.length - 1] : Date.now();
  const start = end - span;
  const values = series.flatMap((s) => s.values.filter((v) => v !== null));
  const top10 = Math.max(1, ...values);
  const step = 10 ** Math.floor(Math.log10(top10));
  const max = Math.ceil(top10 / step * 2) / 2 * step;  // a round top: 1, 1.5, 2, ... times a power of ten
  const x = (t) => left + (width - left - right) * Math.max(0, (t - start) / span);
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  for (const fraction of [0, 0.5, 1]) {
    const value = max * fraction;
    svgElement("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid" }, svg);
    svgElement("text", { x: left - 4, y: y(value) + 4, "text-anchor": "end" }, svg).textContent = short(value);
  }
  const minutes = Math.round(span / 60000);
  svgElement("text", { x: left, y: height - 4 }, svg).textContent = `${minutes} min ago`;
  svgElement("text", { x: width - right, y: height - 4, "text-anchor": "end" }, svg).textContent = "now";
  const legend = svg.parentElement.querySelector(".legend");
  legend.replaceChildren();
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    let run = [];
    const flush = () => {
      if (run.length > 1) svgElement("polyline", { points: run.join(" "), stroke: color }, svg);
      else if (run.length === 1) svgElement("circle", { cx: run[0].split(",")[0], cy: run[0].split(",")[1], r: 2, fill: color }, svg);
      run = [];
    };
    s.values.forEach((v, j) => {
      if (v === null || times[j] < start) { flush(); return; }
      run.push(`${x(times[j]).toFixed(1)},${y(v).toFixed(1)}`);
    });
    flush();
    const item = document.createElement("li");  // coloured by its class: the policy allows no inline style
    item.className = `series-${i % COLORS.length}`;
    const label = document.createElement("span");
    const last = [...s.values].reverse().find((v) => v !== null);
    label.textContent = `${s.name}${last === undefined ? "" : ` ${short(last)}`}`;
    item.appendChild(label);
    legend.appendChild(item);
  });
  // What the browser test reads: how many samples are drawn and the newest value of each series.
  svg.dataset.samples = String(times.filter((t) => t >= start).length);
  svg.dataset.last = series.map((s) => { const v = s.values[s.values.length - 1]; return v === null || v === undefined ? "" : String(v); }).join(",");
}

async function history() {
  const h = await api("GET", "/api/v1/history");
  const samples = h.samples;
  const times = samples.map((s) => s.at_ms);
  // The ring is bounded (15 minutes by default): draw all of it, and at least a minute.
  const span = Math.max(60000, times.length > 1 ? times[times.length - 1] - times[0] : 0);
  return { samples, times, span };
}

async function overviewCharts() {
  const { samples, times, span } = await history();
  drawChart($("chart-messages"), times, [
    { name: "in", values: samples.map((s) => s.messages_in_per_s) },
    { name: "out", values: samples.map((s) => s.messages_out_per_s) },
    { name: "dropped", values: samples.map((s) => s.dropped_per_s) },
  ], span);
  const protocols = [...new Set(samples.flatMap((s) => Object.keys(s.connections)))];
  drawChart($("chart-connections"), times, [
    { name: "all", values: samples.map((s) => Object.values(s.connections).reduce((a, b) => a + b, 0)) },
    ...protocols.map((p) => ({ name: p, values: samples.map((s) => (p in s.connections ? s.connections[p] : null)) })),
  ], span);
}

async function queueCharts() {
  const { samples, times, span } = await history();
  const latest = samples.length ? samples[samples.length - 1].queues : {};
  const names = Object.keys(latest).sort((a, b) => latest[b].depth - latest[a].depth).slice(0, MAX_QUEUE_LINES);
  const line = (field) => names.map((name) => ({ name, values: samples.map((s) => (s.queues[name] ? s.queues[name][field] : null)) }));
  drawChart($("chart-queue-depth"), times, line("depth"), span);
  drawChart($("chart-queue-published"), times, line("published_per_s"), span);
  drawChart($("chart-queue-acked"), times, line("acked_per_s"), span);
}

// Per bridge listed, a pair of small charts (messages per second; backlog bytes), kept across refreshes;
// a bridge no longer listed takes its pair with it. The ids carry the name ([A-Za-z0-9_.-], config.py).
function bridgeFigures(box, name) {
  const found = [...box.children].find((pair) => pair.dataset.bridge === name);
  if (found) return found;
  const pair = document.createElement("div");
  pair.className = "charts";
  pair.dataset.bridge = name;
  for (const [kind, caption] of [["rates", "messages per second"], ["backlog", "backlog bytes"]]) {
    const figure = document.createElement("figure");
    const title = document.createElement("figcaption");
    title.textContent = `${name}: ${caption}`;
    const legend = document.createElement("ul");
    legend.className = "legend";
    figure.append(title, svgElement("svg", { id: `chart-bridge-${kind}-${name}`, class: "chart" }), legend);
    pair.appendChild(figure);
  }
  return pair;
}

async function bridgeCharts(items) {
  const { samples, times, span } = await history();
  const box = $("bridge-charts");
  const charted = items.filter((b) => samples.some((s) => b.name in s.bridges));  // the server's bound
  box.replaceChildren(...charted.map((b) => bridgeFigures(box, b.name)));
  for (const b of charted) {
    const line = (field) => samples.map((s) => (s.bridges[b.name] ? s.bridges[b.name][field] : null));
    drawChart($(`chart-bridge-rates-${b.name}`), times, [
      { name: "sent", values: line("sent_per_s") }, { name: "received", values: line("received_per_s") },
    ], span);
    drawChart($(`chart-bridge-backlog-${b.name}`), times, [{ name: "backlog", values: line("backlog_bytes") }], span);
  }
}

// -- tabs ------------------------------------------------------------------------------------------

async function overview() {
  const o = await api("GET", "/api/v1/overview");
  const facts = [
    ["version", o.version], ["build", o.build], ["node", o.node], ["uptime", duration(o.uptime_s)],
    ["connections", Object.entries(o.connections).map(([k, v]) => `${k} ${v}`).join(", ")],
    ["sessions", o.sessions], ["subscriptions", o.subscriptions], ["retained", o.retained], ["queues", o.queues],
    ["messages", Object.entries(o.messages).map(([k, v]) => `${k} ${v}`).join(", ")],
  ];
  const dl = $("facts");
  dl.replaceChildren();
  for (const [name, value] of facts) {
    const dt = document.createElement("dt"); dt.textContent = name;
    const dd = document.createElement("dd"); dd.textContent = String(value); dd.dataset.fact = name;
    dl.append(dt, dd);
  }
  const now = { at: o.uptime_s, received: o.messages.received, sent: o.messages.sent, dropped: o.messages.dropped,
    bytesIn: o.bytes.received, bytesOut: o.bytes.sent };
  const before = state.last || {};
  const seconds = now.at - (before.at || now.at);
  const cells = $("rates").children;
  ["received", "sent", "dropped", "bytesIn", "bytesOut"].forEach((key, i) => { cells[i].textContent = rate(now[key], before[key], seconds); });
  state.last = now;
  $("server").textContent = `${o.node} · ${o.version} · ${o.build}`;
  await overviewCharts();
}

async function connections() {
  const clients = await all("/api/v1/clients");
  fill($("connection-rows"), clients, (row, c) => {
    row.dataset.clientId = c.client_id;
    cell(row, c.id); cell(row, c.client_id); cell(row, c.vhost); cell(row, c.protocol); cell(row, c.address);
    cell(row, c.user);
    cell(row, duration(Date.now() / 1000 - c.connected_at_ms / 1000));
    button(actions(row), "Kick", async () => {
      if (confirm(`Disconnect ${c.client_id}?`)) await api("DELETE", `/api/v1/clients/${seg(c.id)}`);
    }, true);
  });
}

// The vhost of one queue or session, for the routes that name it (trimaran/admin/api.py).
const inV = (item) => `?vhost=${encodeURIComponent(item.vhost)}`;

async function sessions() {
  const items = await all("/api/v1/sessions");
  fill($("session-rows"), items, (row, s) => {
    row.dataset.clientId = s.client_id;
    cell(row, s.client_id); cell(row, s.vhost); cell(row, s.connected ? "yes" : "no");
    cell(row, { 3: "3.1", 4: "3.1.1", 5: "5.0" }[s.protocol_level] || s.protocol_level);
    cell(row, s.subscription_count); cell(row, s.inflight); cell(row, s.queued); cell(row, s.dropped);
    button(actions(row), "Delete", async () => {
      if (confirm(`End the session of ${s.client_id}?`)) await api("DELETE", `/api/v1/sessions/${seg(s.client_id)}${inV(s)}`);
    }, true);
  });
}

async function queues() {
  const listed = await all("/api/v1/queues");
  const details = await Promise.all(listed.map((q) => api("GET", `/api/v1/queues/${seg(q.name)}${inV(q)}`)));
  const at = Date.now() / 1000;
  const previous = state.lastQueues;
  state.lastQueues = {};
  fill($("queue-rows"), details, (row, q) => {
    const known = `${q.vhost} ${q.name}`;
    const before = previous[known] || {};
    const seconds = at - (before.at || at);
    state.lastQueues[known] = { at, published: q.stats.published || 0, acked: q.stats.acked || 0 };
    row.dataset.queue = q.name;
    row.dataset.vhost = q.vhost;
    cell(row, q.name); cell(row, q.vhost); cell(row, q.mode); cell(row, q.depth).dataset.field = "depth"; cell(row, q.bytes);
    cell(row, q.pending);
    cell(row, q.groups.map((g) => `${g.name}: ${g.lag}`).join(", ") || q.lag);
    cell(row, q.groups.reduce((n, g) => n + g.consumers, 0));
    cell(row, rate(q.stats.published || 0, before.published, seconds));
    cell(row, rate(q.stats.acked || 0, before.acked, seconds));
    cell(row, q.dlq ? `${q.dlq} (${q.dlq_depth})` : "-");
    const td = actions(row);
    const act = (label, fn, danger) => button(td, label, fn, danger);
    act("Peek", () => peek(q));
    act("Purge", async () => {
      if (confirm(`Remove every message of ${q.name}?`)) await api("POST", `/api/v1/queues/${seg(q.name)}/purge${inV(q)}`);
    }, true);
    if (q.dlq_depth > 0) act("Redrive", () => api("POST", `/api/v1/queues/${seg(q.name)}/redrive${inV(q)}`, {}));
  });
  await queueCharts();
}

async function peek(q) {
  const page = await api("GET", `/api/v1/queues/${seg(q.name)}/messages?limit=50&vhost=${encodeURIComponent(q.vhost)}`);
  const where = q.vhost === "/" ? "" : ` (vhost ${q.vhost})`;
  $("peek-title").textContent = `${q.name}${where}: first ${page.items.length} messages`;
  fill($("peek-rows"), page.items, (row, m) => {
    cell(row, m.offset); cell(row, m.topic); cell(row, m.size);
    cell(row, m.encoding === "text" ? m.payload : `base64:${m.payload}`).className = "payload";
  });
  $("peek").hidden = false;
}

const ago = (ms) => (ms ? `${duration(Date.now() / 1000 - ms / 1000)} ago` : "never");

async function webhooks() {
  const items = await all("/api/v1/webhooks");
  $("webhooks-none").hidden = items.length > 0;
  fill($("webhook-rows"), items, (row, w) => {
    row.dataset.webhook = w.name;
    cell(row, w.name); cell(row, w.url); cell(row, w.events.join(", "));
    const health = cell(row, w.healthy ? "healthy" : "failing");
    health.dataset.field = "health";
    health.className = w.healthy ? "good" : "bad";
    cell(row, w.breaker.replace("_", "-"));
    cell(row, w.consecutive_failures);
    const error = cell(row, w.last_error ? `${w.last_error} (${ago(w.last_error_at_ms)})` : "-");
    error.dataset.field = "last-error";
    error.className = "wrap";
    cell(row, ago(w.last_success_at_ms));
    cell(row, `${w.queued} / ${w.queue_size}`); cell(row, w.in_flight);
    cell(row, w.sent); cell(row, w.dropped).dataset.field = "dropped"; cell(row, w.failed);
  });
}

async function bridges() {
  const items = await all("/api/v1/bridges");
  $("bridges-none").hidden = items.length > 0;
  const at = Date.now() / 1000;
  const previous = state.lastBridges;
  state.lastBridges = {};
  fill($("bridge-rows"), items, (row, b) => {
    const before = previous[b.name] || {};
    const seconds = at - (before.at || at);
    state.lastBridges[b.name] = { at, sent: b.sent, received: b.received };
    row.dataset.bridge = b.name;
    cell(row, b.name); cell(row, b.vhost);
    const up = cell(row, `${b.state} for ${duration(b.state_for_s)}`);
    up.dataset.field = "state";
    up.className = { connected: "good", waiting: "bad", stopped: "bad" }[b.state] || "";
    const spoken = { mqttv50: "MQTT 5.0", mqttv311: "MQTT 3.1.1", amqp091: "AMQP 0.9.1", amqp10: "AMQP 1.0" };
    const remote = cell(row, `${b.address} (${spoken[b.protocol_version] || b.protocol_version})`);
    remote.dataset.field = "address";
    remote.title = `${b.kind === "shovel" ? "shovel" : "bridge"} as ${b.client_id}: ${b.topics.join("; ")}`;
    const error = cell(row, b.last_error);
    error.dataset.field = "last-error";
    error.className = "wrap";
    cell(row, rate(b.sent, before.sent, seconds)); cell(row, rate(b.received, before.received, seconds));
    cell(row, b.sent).dataset.field = "sent"; cell(row, b.received).dataset.field = "received";
    cell(row, b.dropped); cell(row, b.backlog_bytes).dataset.field = "backlog";
    button(actions(row), "Restart", () => api("POST", `/api/v1/bridges/${seg(b.name)}/restart`));
  });
  await bridgeCharts(items);
}

async function cluster() {
  let answer = null;
  try {
    answer = await api("GET", "/api/v1/cluster");
  } catch (error) {
    if (error.status !== 404) throw error;  // 404: a node alone
  }
  $("cluster-none").hidden = answer !== null;
  const facts = $("cluster-facts");
  facts.replaceChildren();
  const nodes = answer ? answer.nodes : [];
  if (answer) {
    for (const [name, value] of [["this node", answer.node], ["forwarded", answer.forwarded], ["received", answer.received],
                                 ["forwards dropped", answer.dropped], ["sessions taken over", answer.takeovers]]) {
      const dt = document.createElement("dt"); dt.textContent = name;
      const dd = document.createElement("dd"); dd.textContent = String(value);
      facts.append(dt, dd);
    }
  }
  fill($("node-rows"), nodes, (row, n) => {
    row.dataset.node = n.name;
    cell(row, n.self ? `${n.name} (this one)` : n.name);
    const alive = cell(row, n.state);
    alive.dataset.field = "state";
    alive.className = n.state === "alive" ? "good" : "bad";
    cell(row, n.address); cell(row, ago(n.started_at)); cell(row, ago(n.last_heartbeat)); cell(row, n.routes);
  });
}

// -- vhosts and limits (trimaran/tenant_limits.py) ----------------------------------------------------------

// The vhost selector: "" shows every vhost; items that carry a vhost are shown in theirs only.
const inVhost = (item) => !state.vhost || item.vhost === undefined || item.vhost === state.vhost;

function vhostChoices(names) {
  const select = $("vhost");
  state.vhostNames = [...new Set(["/", ...(state.vhostNames || []), ...names])].sort();
  const known = ["", ...state.vhostNames];
  if ([...select.options].map((o) => o.value).join("\n") === known.join("\n")) return;
  select.replaceChildren();
  for (const name of known) {
    const option = document.createElement("option");
    option.value = name; option.textContent = name || "all";
    select.appendChild(option);
  }
  select.value = known.includes(state.vhost) ? state.vhost : "";
}

async function vhosts() {
  const names = await all("/api/v1/vhosts");
  fill($("vhost-rows"), names.filter((v) => inVhost({ vhost: v.name })), (row, v) => {
    row.dataset.vhost = v.name;
    cell(row, v.name); cell(row, v.declared ? "yes" : "no"); cell(row, v.connections);
    const td = actions(row);
    if (!v.declared) {
      button(td, "Delete", async () => {
        if (confirm(`Delete vhost ${v.name} and everything in it?`)) await api("DELETE", `/api/v1/vhosts/${seg(v.name)}`);
      }, true);
    }
  });
  state.vhostNames = [];  // the full list: a deleted vhost leaves the selector
  vhostChoices(names.map((v) => v.name));
  fill($("permission-rows"), await all("/api/v1/permissions"), (row, p) => {
    row.dataset.permission = `${p.vhost} ${p.user}`;
    cell(row, p.vhost); cell(row, p.user); cell(row, p.configure); cell(row, p.write); cell(row, p.read);
    button(actions(row), "Clear", async () => {
      if (confirm(`Take ${p.user}'s permission for ${p.vhost} away?`)) {
        await api("DELETE", `/api/v1/permissions/${seg(p.vhost)}/${seg(p.user)}`);
      }
    }, true);
  });
}

async function limits() {
  const answer = await api("GET", "/api/v1/limits");
  vhostChoices(Object.keys(answer.vhosts));
  const vhosts = Object.entries(answer.vhosts).filter(([name]) => inVhost({ vhost: name }));
  fill($("vhost-limit-rows"), vhosts, (row, [name, v]) => {
    row.dataset.vhost = name;
    cell(row, name); cell(row, v.connections).dataset.field = "connections";
    cell(row, v.max_connections).dataset.field = "max-connections";
    cell(row, v.max_queues); cell(row, v.max_stored_bytes);
    button(actions(row), "Clear", async () => {
      if (confirm(`Remove the limits of vhost ${name}?`)) await api("DELETE", `/api/v1/limits/vhosts/${seg(name)}`);
    }, true);
  });
  const users = [["", { ...answer.default_user, connections: null }], ...Object.entries(answer.users)];
  fill($("user-limit-rows"), users, (row, [name, u]) => {
    row.dataset.user = name;
    cell(row, name || "(every other user)"); cell(row, u.connections);
    cell(row, u.max_connections); cell(row, u.max_messages_per_s).dataset.field = "messages";
    cell(row, u.max_bytes_per_s);
    if (name) {
      button(actions(row), "Clear", async () => {
        if (confirm(`Remove the limits of user ${name}?`)) await api("DELETE", `/api/v1/limits/users/${seg(name)}`);
      }, true);
    } else actions(row);
  });
  fill($("limit-bite-rows"), answer.bites.filter(inVhost), (row, b) => {
    cell(row, b.vhost); cell(row, b.limit); cell(row, b.count);
  });
}

// A form's PUT (limits, a vhost, a permission), then the tab again.
async function putAndRefresh(event, path, body) {
  event.preventDefault();
  try { await api("PUT", path, body); showError(null); await refresh(); } catch (error) { showError(error); }
}

function limitForms() {
  $("vhost-limit-form").addEventListener("submit", (event) => putAndRefresh(event,
    `/api/v1/limits/vhosts/${seg($("vhost-limit-name").value)}`, {
      max_connections: Number($("vhost-limit-connections").value), max_queues: Number($("vhost-limit-queues").value),
      max_stored_bytes: Number($("vhost-limit-bytes").value),
    }));
  $("user-limit-form").addEventListener("submit", (event) => {
    const user = $("user-limit-name").value.trim();
    putAndRefresh(event, user ? `/api/v1/limits/users/${seg(user)}` : "/api/v1/limits/default-user", {
      max_connections: Number($("user-limit-connections").value),
      max_messages_per_s: Number($("user-limit-messages").value), max_bytes_per_s: Number($("user-limit-bytes").value),
    });
  });
  $("vhost").addEventListener("change", () => { state.vhost = $("vhost").value; refresh(); });
  $("vhost-form").addEventListener("submit", (event) => putAndRefresh(event,
    `/api/v1/vhosts/${seg($("vhost-name").value)}`));
  $("permission-form").addEventListener("submit", (event) => putAndRefresh(event,
    `/api/v1/permissions/${seg($("permission-vhost").value)}/${seg($("permission-user").value)}`, {
      configure: $("permission-configure").value, write: $("permission-write").value, read: $("permission-read").value,
    }));
}

const TABS = { overview, connections, sessions, queues, webhooks, bridges, cluster, vhosts, limits, publish: async () => {} };

async function refresh() {
  if (!state.token) return;
  try { await TABS[state.tab](); showError(null); } catch (error) { showError(error); }
}

function show(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
  for (const name of Object.keys(TABS)) $(name).hidden = name !== tab;
  refresh();
}

// -- login -----------------------------------------------------------------------------------------

function loggedIn() {
  $("login").hidden = true;
  $("tabs").hidden = false;
  $("logout").hidden = false;
  $("vhost-picker").hidden = false;
  all("/api/v1/vhosts").then((names) => vhostChoices(names.map((v) => v.name)), showError);
  show(state.tab);
  clearInterval(state.timer);
  state.timer = setInterval(refresh, POLL_MS);
}

function logout() {
  state.token = null;
  sessionStorage.removeItem("trimaran-token");
  clearInterval(state.timer);
  $("login").hidden = false;
  $("tabs").hidden = true;
  $("logout").hidden = true;
  $("vhost-picker").hidden = true;
  for (const name of Object.keys(TABS)) $(name).hidden = true;
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    state.token = $("token").value.trim();
    try {
      await api("GET", "/api/v1/overview");
      sessionStorage.setItem("trimaran-token", state.token);
      showError(null);
      loggedIn();
    } catch (error) {
      state.token = null;
      showError(error.status === 401 ? new Error(`Log in failed: ${error.message}`) : error);
    }
  });
  $("logout").addEventListener("click", logout);
  limitForms();
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.tab));
  $("publish-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const answer = await api("POST", "/api/v1/publish", {
        topic: $("publish-topic").value, payload: $("publish-payload").value,
        qos: Number($("publish-qos").value), retain: $("publish-retain").checked,
      });
      $("publish-result").textContent = answer.queue ? `stored in ${answer.queue} at offset ${answer.offset}` : `delivered to ${answer.delivered} subscribers`;
      showError(null);
    } catch (error) { showError(error); }
  });
  if (state.token) loggedIn(); else logout();
});
