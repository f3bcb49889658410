// raftmq web console: plain JavaScript over the node's public JSON API (docs/console.md).
// Nothing is fetched from anywhere but this node; the API token typed in is kept in sessionStorage
// (this tab only) and sent as "Authorization: Bearer <token>".
"use strict";

const TICK_MS = 2000;
const HISTORY_MS = 15 * 60 * 1000; // lag shown per series (what the nodes keep: GET …/groups/lag)
const NODE_HISTORY_EVERY_MS = 10000; // the node's lag history is read again this often
const MAX_TOPICS_SAMPLED = 50;
const TOKEN_KEY = "raftmq.token";
const PAGE = 20; // messages per page of the message browser
const COLORS = ["#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7ea4", "#57606a"];

const state = {
  view: "cluster",
  topic: null, // selected on the topics view
  consumer: null, // "group\u0000topic" selected on the groups view
  dlq: null, // {topic, group} selected on the dead letters view
  browse: null, // {topic, queue, offset} on the message browser (offset null: the oldest)
  lag: new Map(), // "group\u0000topic" -> [[time_ms, lag], ...] sampled by this page
  nodeLag: new Map(), // "group\u0000topic" -> [[time_ms, lag], ...] sampled by the node
  nodeLagAt: 0, // when nodeLag was read
  highs: new Map(), // "topic/queue" -> [time_ms, high_offset] of the previous sample
  rates: new Map(), // "topic/queue" -> messages per second
  groups: new Map(), // topic -> GET /v1/topics/{topic}/groups answer
  tokensRequired: null, // from GET /v1/cluster (or the page itself); null: not known yet
  busy: false,
  again: false,
};

// -- helpers -----------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 });
}

// One time format everywhere: ISO 8601 in UTC (2026-11-28T09:45:12.345Z), and its clock part
// (09:45:12Z) where the date goes without saying (chart axes, the status line).
function isoTime(ms) {
  return new Date(ms).toISOString();
}

function isoClock(ms) {
  return `${new Date(ms).toISOString().slice(11, 19)}Z`;
}

// A consumer group's generation packs the coordinator's Raft term (the high 32 bits) and a counter
// of the group's changes in that term (the low 32 bits): 4294967312 is term 1, change 16, "1.16".
const GENERATION_TERM = 2 ** 32;

function generationText(generation) {
  return `${Math.floor(generation / GENERATION_TERM)}.${generation % GENERATION_TERM}`;
}

function generationTitle(generation) {
  return `generation ${generation}: the coordinator's term ${Math.floor(generation / GENERATION_TERM)}, change ${generation % GENERATION_TERM} of the group in that term`;
}

function badge(text, kind) {
  return el("span", { class: `badge ${kind}`, text });
}

function fill(tableId, rows, emptyText) {
  const body = document.querySelector(`#${tableId} tbody`);
  const columns = document.querySelectorAll(`#${tableId} thead th`).length;
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: columns, text: emptyText }))]));
}

function pathOf(...parts) {
  return parts.map((p) => encodeURIComponent(p)).join("/");
}

class ApiFailure extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(`${status} ${e.code || "error"}: ${e.message || "request failed"}`);
    this.status = status;
    this.code = e.code;
  }
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
  });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) throw new ApiFailure(response.status, body);
  return body;
}

function banner(text, kind) {
  const b = document.getElementById("banner");
  b.hidden = !text;
  b.textContent = text || "";
  b.className = `banner ${kind || ""}`;
}

function explain(error) {
  if (error instanceof ApiFailure && (error.status === 401 || error.status === 403)) {
    return `The API refused the request (${error.message}). Enter an API token above.`;
  }
  return `Request failed: ${error.message}`;
}

// -- data --------------------------------------------------------------------------------------

async function topicsDescribed() {
  const { topics } = await api("/v1/topics");
  const sampled = topics.slice(0, MAX_TOPICS_SAMPLED);
  // The list puts each dead-letter topic right after its source and marks it dead_letter_of.
  const described = await Promise.all(
    sampled.map((t) =>
      api(`/v1/topics/${pathOf(t.name)}`)
        .then((d) => ({ ...d, dead_letter_of: t.dead_letter_of || null }))
        .catch(() => ({ ...t, queues: null })),
    ),
  );
  const now = Date.now();
  for (const t of described) {
    for (const q of t.queues || []) {
      if (q.high_offset === null) continue;
      const key = `${t.name}/${q.queue}`;
      const previous = state.highs.get(key);
      if (previous && now > previous[0]) {
        state.rates.set(key, Math.max(0, ((q.high_offset - previous[1]) * 1000) / (now - previous[0])));
      }
      state.highs.set(key, [now, q.high_offset]);
    }
  }
  return { topics, described };
}

async function sampleGroups(topics) {
  const names = topics.map((t) => t.name).slice(0, MAX_TOPICS_SAMPLED);
  const answers = await Promise.all(names.map((n) => api(`/v1/topics/${pathOf(n)}/groups`).catch(() => null)));
  const now = Date.now();
  state.groups = new Map();
  names.forEach((name, i) => {
    if (!answers[i]) return;
    state.groups.set(name, answers[i]);
    for (const g of answers[i].groups) {
      const key = `${g.group}\u0000${name}`;
      const series = state.lag.get(key) || [];
      series.push([now, g.lag]);
      while (series.length && series[0][0] < now - HISTORY_MS) series.shift();
      state.lag.set(key, series);
    }
  });
}

// The node keeps each group's lag for the last minutes (GET /v1/topics/{topic}/groups/lag), so the
// chart has history as soon as the page opens; the page's own samples since then are added.
async function readNodeHistory(topics) {
  const now = Date.now();
  if (now - state.nodeLagAt < NODE_HISTORY_EVERY_MS) return;
  state.nodeLagAt = now;
  const answers = await Promise.all(topics.map((t) => api(`/v1/topics/${pathOf(t)}/groups/lag`).catch(() => null)));
  const read = new Map();
  const interval = answers.find((a) => a && a.interval_ms);
  if (interval) {
    document.getElementById("lag-note").textContent =
      `The last ${fmt(interval.history_ms / 60000)} minutes as node ${interval.node} sampled them (every ${fmt(interval.interval_ms / 1000)} s), then every ${TICK_MS / 1000} s while this page is open. Each group on its own scale.`;
  }
  answers.forEach((answer, i) => {
    for (const g of (answer && answer.groups) || []) read.set(`${g.group}\u0000${topics[i]}`, g.samples);
  });
  state.nodeLag = read;
}

function lagSeries(key) {
  const fromNode = state.nodeLag.get(key) || [];
  const last = fromNode.length ? fromNode[fromNode.length - 1][0] : -Infinity;
  const since = Date.now() - HISTORY_MS;
  return [...fromNode, ...(state.lag.get(key) || []).filter((p) => p[0] > last)].filter((p) => p[0] >= since);
}

// -- views -------------------------------------------------------------------------------------

async function renderCluster() {
  showCluster(await api("/v1/cluster"));
}

function learnTokens(view) {
  if (typeof view.tokens_required !== "boolean") return;
  state.tokensRequired = view.tokens_required;
  // A cluster without API tokens answers anyone on this node: say so instead of asking for one.
  document.getElementById("token").placeholder = view.tokens_required ? "API token" : "API token (none needed)";
  const note = document.getElementById("create-note");
  note.hidden = !view.tokens_required;
}

// How many more nodes may fail with every group still holding a majority of its replicas: per group,
// its replicas on reachable nodes beyond a majority of all its replicas; the fewest over the groups.
function failuresTolerated(view) {
  const up = new Set(view.nodes.filter((n) => n.reachable).map((n) => n.id));
  const margins = view.groups.map((g) => {
    const holders = replicaNodes(g);
    return holders.filter((id) => up.has(id)).length - (Math.floor(holders.length / 2) + 1);
  });
  return margins.length ? Math.max(0, Math.min(...margins)) : 0;
}

// A group's replica nodes: the placement (reachable or not), and any node that answered for it.
function replicaNodes(g) {
  return [...new Set([...(g.placement || []), ...g.replicas.map((r) => r.node_id)])].sort();
}

function showCluster(view) {
  learnTokens(view);
  document.getElementById("node-id").textContent = `node ${view.node_id}`;
  const leads = new Map();
  for (const g of view.groups) {
    if (g.leader) leads.set(g.leader, [...(leads.get(g.leader) || []), g.group_id]);
  }
  fill(
    "nodes-table",
    view.nodes.map((n) =>
      el(
        "tr",
        { "data-node": n.id },
        el("td", {}, el("strong", { text: n.id }), n.id === view.node_id ? el("span", { class: "muted", text: " (this node)" }) : null),
        el("td", { text: n.http }),
        el("td", { text: n.raft ?? "–" }), // shown to a cluster admin only
        el("td", {}, n.reachable ? badge("up", "good") : badge("unreachable", "bad")),
        el("td", { text: (leads.get(n.id) || []).join(", ") || "–" }),
      ),
    ),
    "no nodes",
  );
  fill(
    "groups-table",
    view.groups.map((g) => {
      const commit = Math.max(0, ...g.replicas.map((r) => r.commit_index));
      return el(
        "tr",
        { "data-group": g.group_id },
        el("td", {}, el("strong", { text: g.group_id === "meta" ? "meta (metadata)" : `queue group ${g.group_id}` })),
        el("td", { class: "leader" }, g.leader ? g.leader : badge("no leader", "bad")),
        el("td", { class: "term", text: g.term }),
        el("td", { class: "num", text: fmt(commit) }),
        el(
          "td",
          {},
          replicaNodes(g).map((id) => {
            const r = g.replicas.find((x) => x.node_id === id);
            if (!r) {
              // Its node did not answer: the replica is still the group's, marked down.
              return el("span", { class: "replica down", "data-replica": id, "data-down": "" }, `${id} · `, badge("down", "bad"), " ");
            }
            const lag = Math.max(0, commit - r.applied_index);
            return el(
              "span",
              { class: `replica${r.is_leader ? " leader" : ""}`, "data-replica": r.node_id },
              `${r.node_id}${r.is_leader ? " ★" : ""} · ${fmt(r.applied_index)} `,
              lag > 0 ? badge(`lag ${fmt(lag)}`, "warn") : badge("lag 0", "good"),
            );
          }),
        ),
      );
    }),
    "no groups",
  );
  const reachable = view.nodes.filter((n) => n.reachable).length;
  const led = view.groups.filter((g) => g.leader).length;
  const tolerated = failuresTolerated(view);
  const card = (value, label, kind, id) =>
    el("div", { class: `card ${kind || ""}`, id }, el("div", { class: "value", text: value }), el("div", { class: "label", text: label }));
  document.getElementById("cluster-cards").replaceChildren(
    card(`${reachable}/${view.nodes.length}`, "nodes reachable", reachable < view.nodes.length ? "bad" : ""),
    card(`${led}/${view.groups.length}`, "groups with a leader", led < view.groups.length ? "bad" : ""),
    card(`${tolerated}`, `more node failure${tolerated === 1 ? "" : "s"} tolerated`, tolerated === 0 ? "bad" : "", "tolerated"),
  );
}

function topicRate(t) {
  return (t.queues || []).reduce((sum, q) => sum + (state.rates.get(`${t.name}/${q.queue}`) || 0), 0);
}

async function renderTopics() {
  const { topics, described } = await topicsDescribed();
  await sampleGroups(topics);
  // (A topic of the link not listed yet, e.g. just created, shows once the list has it.)
  fill(
    "topics-table",
    described.map((t) => {
      const messages = (t.queues || []).reduce((s, q) => s + ((q.high_offset || 0) - (q.low_offset || 0)), 0);
      const source = t.dead_letter_of;
      return el(
        "tr",
        {
          class: `clickable${state.topic === t.name ? " selected" : ""}${source ? " dead-letters" : ""}`,
          "data-topic": t.name,
          ...(source ? { "data-dead-letter-of": source.topic, title: `dead letters of ${source.group} on ${source.topic}` } : {}),
          onclick: () => selectTopic(t.name),
        },
        el("td", {}, source ? el("span", { class: "nest", text: "└ " }) : "", el("a", { class: "link", text: t.name })),
        el("td", { class: "num", text: Array.isArray(t.queues) ? t.queues.length : "–" }),
        el("td", { text: [...new Set(t.queue_groups)].join(", ") }),
        el("td", { class: "num", text: fmt(messages) }),
        el("td", { class: "num", text: fmt(topicRate(t)) }),
        el("td", { text: t.retention_ms ? `${fmt(t.retention_ms / 1000)} s` : "forever" }),
      );
    }),
    "no topics yet",
  );
  const detail = document.getElementById("topic-detail");
  const topic = described.find((t) => t.name === state.topic);
  detail.hidden = !topic;
  if (!topic) return;
  document.getElementById("topic-title").textContent = `Topic ${topic.name}`;
  fill(
    "queues-table",
    (topic.queues || []).map((q) =>
      el(
        "tr",
        { "data-queue": q.queue },
        el("td", { class: "num", text: q.queue }),
        el("td", { text: q.group_id }),
        el("td", { text: q.leader || "–" }),
        el("td", { text: q.replicas.join(", ") }),
        el("td", { class: "num low", text: fmt(q.low_offset) }),
        el("td", { class: "num high", text: fmt(q.high_offset) }),
        el("td", { class: "num", text: fmt((q.high_offset || 0) - (q.low_offset || 0)) }),
        el("td", { class: "num", text: fmt(state.rates.get(`${topic.name}/${q.queue}`) || 0) }),
        el("td", {}, el("a", { class: "link browse", href: `#messages/${pathOf(topic.name, String(q.queue))}`, text: "browse messages" })),
      ),
    ),
    "no queues",
  );
  const groups = (state.groups.get(topic.name) || { groups: [] }).groups;
  fill(
    "topic-groups-table",
    groups.map((g) =>
      el(
        "tr",
        { "data-consumer": g.group },
        el("td", { text: g.group }),
        el("td", { class: "num", text: fmt(g.lag) }),
        el("td", { class: "num", text: fmt(g.in_flight) }),
        el("td", { class: "num", text: fmt(g.retrying) }),
        el("td", { class: "num", text: fmt(g.dead_letters) }),
      ),
    ),
    "no consumer group has read this topic",
  );
}

// Creating and deleting topics needs a token with admin on the topic (the one typed in above);
// a refusal is shown in the banner as the API's error.
async function createTopic(event) {
  event.preventDefault();
  const name = document.getElementById("create-name").value.trim();
  const queues = Number(document.getElementById("create-queues").value || 8);
  const hours = document.getElementById("create-retention").value;
  const body = { name, queues };
  if (hours) body.retention_ms = Number(hours) * 3600 * 1000;
  try {
    await api("/v1/topics", { method: "POST", body });
    document.getElementById("create-name").value = "";
    banner(`Created topic ${name} with ${queues} queue${queues === 1 ? "" : "s"}.`, "info");
    location.hash = `#topics/${pathOf(name)}`;
  } catch (error) {
    banner(explain(error));
    return; // (a refresh would clear the banner)
  }
  await refresh();
}

async function deleteTopic() {
  const name = state.topic;
  if (!name) return;
  if (!window.confirm(`Delete topic ${name} and all its messages? This cannot be undone.`)) return;
  try {
    await api(`/v1/topics/${pathOf(name)}`, { method: "DELETE" });
    banner(`Deleted topic ${name}.`, "info");
    location.hash = "#topics";
  } catch (error) {
    banner(explain(error));
    return; // (a refresh would clear the banner)
  }
  await refresh();
}

function selectTopic(name) {
  state.topic = name;
  location.hash = `#topics/${encodeURIComponent(name)}`;
}

function consumers() {
  const rows = [];
  for (const [topic, answer] of state.groups) {
    for (const g of answer.groups) rows.push({ ...g, topic, key: `${g.group}\u0000${topic}` });
  }
  return rows.sort((a, b) => (a.group + a.topic).localeCompare(b.group + b.topic));
}

async function renderGroups() {
  const { topics } = await api("/v1/topics");
  await sampleGroups(topics);
  const rows = consumers();
  await readNodeHistory([...new Set(rows.map((r) => r.topic))]);
  const colors = new Map(rows.map((r, i) => [r.key, COLORS[i % COLORS.length]]));
  fill(
    "consumers-table",
    rows.map((r) => {
      const spark = el("canvas", { class: "spark", width: 160, height: 28 });
      drawChart(spark, [{ color: colors.get(r.key), points: lagSeries(r.key) }], { spark: true });
      return el(
        "tr",
        {
          class: `clickable${state.consumer === r.key ? " selected" : ""}`,
          "data-consumer": r.group,
          "data-topic": r.topic,
          onclick: () => {
            location.hash = `#groups/${pathOf(r.group, r.topic)}`;
          },
        },
        el("td", {}, el("span", { class: "badge", text: "●" }), " ", el("strong", { text: r.group })),
        el("td", { text: r.topic }),
        el("td", { class: "num lag", text: fmt(r.lag) }),
        el("td", { class: "num in-flight", text: fmt(r.in_flight) }),
        el("td", { class: "num", text: fmt(r.retrying) }),
        el("td", { class: "num dead-letters", text: fmt(r.dead_letters) }),
        el("td", {}, spark),
      );
    }),
    "no consumer groups yet: commit an offset or receive from a topic",
  );
  for (const row of document.querySelectorAll("#consumers-table tbody tr[data-consumer]")) {
    const key = `${row.dataset.consumer}\u0000${row.dataset.topic}`;
    row.querySelector(".badge").style.color = colors.get(key);
  }
  drawLagCharts(rows, colors);
  // A group opened from its link may have members but no committed progress yet: it is shown too.
  const [group, topic] = state.consumer ? state.consumer.split("\u0000") : [null, null];
  document.getElementById("consumer-detail").hidden = !group;
  if (!group) return;
  const selected = rows.find((r) => r.key === state.consumer) || { group, topic, queues: [] };
  document.getElementById("consumer-title").textContent = `${group} on ${topic}`;
  const holder = await renderMembers(group, topic);
  fill(
    "consumer-queues-table",
    selected.queues.map((q) =>
      el(
        "tr",
        { "data-queue": q.queue },
        el("td", { class: "num", text: q.queue }),
        el("td", { class: "holder", text: holder.get(q.queue) || "–" }),
        el("td", { text: q.group_id }),
        el("td", { class: "num", text: fmt(q.committed_offset) }),
        el("td", { class: "num", text: fmt(q.high_offset) }),
        el("td", { class: "num", text: fmt(q.lag) }),
        el("td", { class: "num", text: fmt(q.in_flight) }),
        el("td", { class: "num", text: fmt(q.retrying) }),
        el("td", { class: "num", text: fmt(q.dead_letters) }),
      ),
    ),
    "no queues",
  );
}

const STATE_BADGE = { stable: "good", rebalancing: "warn", empty: "bad" };

function ago(ms) {
  return ms < 1000 ? "just now" : `${fmt(ms / 1000)} s ago`;
}

function queueList(queues) {
  return queues.length ? queues.join(", ") : "–";
}

// The group's members on the topic from its coordinator (GET …/groups/{group}/members); returns
// queue -> member id, for the per-queue table.
async function renderMembers(group, topic) {
  const holder = new Map();
  const stateBox = document.getElementById("group-state");
  const note = document.getElementById("members-note");
  let answer;
  try {
    answer = await api(`/v1/topics/${pathOf(topic, "groups", group, "members")}`);
  } catch (e) {
    stateBox.replaceChildren(badge("members unknown", "bad"));
    note.textContent = `Members could not be read: ${e.message}`;
    fill("group-members-table", [], "–");
    return holder;
  }
  stateBox.replaceChildren(badge(answer.state, STATE_BADGE[answer.state] || "warn"));
  stateBox.dataset.state = answer.state;
  for (const m of answer.members) for (const q of m.queues) holder.set(q, m.member_id);
  const shown = answer.truncated ? `, the first ${fmt(answer.members.length)} by id shown` : "";
  const unassigned = answer.unassigned_queues.length
    ? `; queues held by no member: ${queueList(answer.unassigned_queues)}`
    : "";
  note.title = answer.generation === null ? "" : generationTitle(answer.generation);
  note.textContent =
    `${fmt(answer.member_count)} member${answer.member_count === 1 ? "" : "s"}${shown}` +
    (answer.generation === null ? "" : `, generation ${generationText(answer.generation)}`) +
    `; a member is dropped after ${fmt(answer.session_timeout_ms / 1000)} s without a heartbeat${unassigned}.`;
  fill(
    "group-members-table",
    answer.members.map((m) =>
      el(
        "tr",
        { "data-member": m.member_id },
        el("td", {}, el("strong", { text: m.member_id })),
        el("td", { class: "queues", text: queueList(m.queues) }),
        el("td", { class: "pending", text: queueList(m.pending) }),
        el("td", { class: "seen", title: isoTime(m.last_seen_ms), text: ago(m.last_seen_ago_ms) }),
        m.applied_generation === null
          ? el("td", { class: "num generation", text: "–" })
          : el("td", { class: "num generation", title: generationTitle(m.applied_generation), text: generationText(m.applied_generation) }),
      ),
    ),
    "no member consumes this topic in the group (members are clustering consumers that heartbeat)",
  );
  return holder;
}

// -- message browser ------------------------------------------------------------------------------
// Values, keys and headers are untrusted: they only ever reach the page as text nodes (el's "text"
// and children), never as HTML.

function bytesOf(m) {
  if (m.value !== undefined) return new TextEncoder().encode(m.value);
  const raw = atob(m.value_b64);
  return Uint8Array.from(raw, (ch) => ch.charCodeAt(0));
}

function hexDump(bytes) {
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = Array.from(bytes.slice(i, i + 16));
    const hex = row.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${i.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join("\n") || "(empty)";
}

function shownValue(m, format) {
  if (format === "hex") return [hexDump(bytesOf(m))];
  const text = m.value !== undefined ? m.value : new TextDecoder().decode(bytesOf(m));
  if (format === "json") {
    try {
      return [JSON.stringify(JSON.parse(text), null, 2)];
    } catch (_) {
      return [el("span", { class: "muted note", text: "not JSON: " }), text];
    }
  }
  if (m.value === undefined) return [el("span", { class: "muted note", text: "binary, as UTF-8: " }), text];
  return [text];
}

function browseTo(offset) {
  const { topic, queue } = state.browse;
  location.hash = `#messages/${pathOf(topic, String(queue), String(Math.max(0, offset)))}`;
}

async function renderMessages() {
  const b = state.browse;
  if (!b) return;
  const described = await api(`/v1/topics/${pathOf(b.topic)}`);
  const q = (described.queues || []).find((x) => x.queue === b.queue);
  if (!q) throw new Error(`topic ${b.topic} has no queue ${b.queue}`);
  const low = q.low_offset || 0;
  const high = q.high_offset || 0;
  const offset = Math.min(Math.max(b.offset === null ? low : b.offset, low), high);
  const format = document.getElementById("messages-format").value;
  const answer = await api(`/v1/topics/${pathOf(b.topic, "queues", String(b.queue), "messages")}?offset=${offset}&max=${PAGE}`);
  document.getElementById("messages-title").textContent = `Messages of ${b.topic}, queue ${b.queue}`;
  const input = document.getElementById("messages-offset");
  if (document.activeElement !== input) input.value = String(offset);
  const shown = answer.messages.length;
  document.getElementById("messages-range").textContent = shown
    ? `offsets ${fmt(answer.messages[0].offset)}–${fmt(answer.messages[shown - 1].offset)} of ${fmt(answer.low_offset)}–${fmt(answer.high_offset - 1)}`
    : `no messages from offset ${fmt(offset)} (retained: ${answer.high_offset > answer.low_offset ? `${fmt(answer.low_offset)}–${fmt(answer.high_offset - 1)}` : "none"})`;
  state.page = { low: answer.low_offset, high: answer.high_offset, offset, next: answer.next_offset };
  document.getElementById("messages-prev").disabled = offset <= answer.low_offset;
  document.getElementById("messages-oldest").disabled = offset <= answer.low_offset;
  document.getElementById("messages-next").disabled = answer.next_offset >= answer.high_offset;
  fill(
    "messages-table",
    answer.messages.map((m) =>
      el(
        "tr",
        { "data-offset": m.offset },
        el("td", { class: "num", text: m.offset }),
        el("td", { class: "key", text: m.key === null || m.key === undefined ? "–" : m.key }),
        el("td", { class: "payload" }, shownValue(m, format)),
        el("td", { class: "headers", text: Object.entries(m.headers || {}).map(([k, v]) => `${k}: ${v}`).join("\n") || "–" }),
        el("td", { class: "time", text: m.timestamp_ms ? isoTime(m.timestamp_ms) : "–" }),
      ),
    ),
    "no messages here",
  );
}

function startBrowser() {
  const page = () => state.page || { low: 0, high: 0, offset: 0, next: 0 };
  document.getElementById("messages-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = Number(document.getElementById("messages-offset").value);
    if (Number.isInteger(value) && value >= 0) browseTo(value);
  });
  document.getElementById("messages-oldest").addEventListener("click", () => browseTo(page().low));
  document.getElementById("messages-prev").addEventListener("click", () => browseTo(Math.max(page().low, page().offset - PAGE)));
  document.getElementById("messages-next").addEventListener("click", () => browseTo(page().next));
  document.getElementById("messages-newest").addEventListener("click", () => browseTo(Math.max(page().low, page().high - PAGE)));
  document.getElementById("messages-format").addEventListener("change", () => refresh());
}

// Dead-letter topics are named <topic>.<group>.dlq; the list marks them dead_letter_of. (A node
// older than that mark: both parts may contain dots, so the split is the one whose <topic> exists.)
function subscriptionsWithDlq(topics) {
  const marked = topics.filter((t) => t.dead_letter_of);
  if (marked.length) {
    return marked
      .map((t) => ({ topic: t.dead_letter_of.topic, group: t.dead_letter_of.group, dlq: t.name }))
      .sort((a, b) => a.dlq.localeCompare(b.dlq));
  }
  const names = new Set(topics.map((t) => t.name));
  const found = [];
  for (const name of names) {
    if (!name.endsWith(".dlq")) continue;
    const stem = name.slice(0, -4);
    for (let i = stem.indexOf("."); i > 0; i = stem.indexOf(".", i + 1)) {
      if (names.has(stem.slice(0, i)) && i < stem.length - 1) {
        found.push({ topic: stem.slice(0, i), group: stem.slice(i + 1), dlq: name });
        break;
      }
    }
  }
  return found.sort((a, b) => a.dlq.localeCompare(b.dlq));
}

async function renderDlq() {
  const { topics } = await api("/v1/topics");
  await sampleGroups(topics);
  const subs = subscriptionsWithDlq(topics);
  const count = (s) => {
    const g = ((state.groups.get(s.topic) || { groups: [] }).groups || []).find((x) => x.group === s.group);
    return g ? g.dead_letters : null;
  };
  // Grouped under their source topic: sorted by it, its name on the first of its rows.
  subs.sort((a, b) => a.topic.localeCompare(b.topic) || a.group.localeCompare(b.group));
  if (state.dlq && !state.dlq.dlq) {
    // From a link (#dlq/<topic>/<group>): the row's dead-letter topic.
    const linked = subs.find((s) => s.topic === state.dlq.topic && s.group === state.dlq.group);
    if (linked) state.dlq = linked;
  }
  fill(
    "dlq-table",
    subs.map((s, i) =>
      el(
        "tr",
        {
          class: `clickable${state.dlq && state.dlq.dlq === s.dlq ? " selected" : ""}${i && subs[i - 1].topic === s.topic ? " same-source" : ""}`,
          "data-dlq": s.dlq,
          "data-source": s.topic,
          onclick: () => {
            location.hash = `#dlq/${pathOf(s.topic, s.group)}`;
          },
        },
        el("td", { class: "source", text: i && subs[i - 1].topic === s.topic ? "" : s.topic }),
        el("td", { text: s.group }),
        el("td", { text: s.dlq }),
        el("td", { class: "num", text: fmt(count(s)) }),
        el("td", {}, el("a", { class: "link", text: "browse" })),
      ),
    ),
    "no dead-letter topics: one is created with a group's first dead letter",
  );
  const detail = document.getElementById("dlq-detail");
  if (state.dlq && !subs.some((s) => s.dlq === state.dlq.dlq)) state.dlq = null;
  detail.hidden = !state.dlq;
  if (!state.dlq) return;
  const { topic, group } = state.dlq;
  const listed = await api(`/v1/topics/${pathOf(topic, "subscriptions", group, "dlq")}?max=200`);
  document.getElementById("dlq-title").textContent = `Dead letters of ${group} on ${topic}`;
  document.getElementById("redrive-all").disabled = listed.messages.length === 0;
  // Redrive goes in order per queue, from the queue's redrive offset: the API can redrive one
  // message alone only when it is the oldest of its queue (POST …/redrive {"queue", "max": 1}).
  const perQueue = new Map();
  for (const m of listed.messages) perQueue.set(m.queue, (perQueue.get(m.queue) || 0) + 1);
  document.getElementById("redrive-queues").replaceChildren(
    ...[...perQueue].map(([queue, n]) =>
      el("button", { type: "button", class: "redrive-queue", "data-queue": queue, onclick: () => redrive(queue), text: `Redrive all of queue ${queue}${listed.messages.length >= 200 ? "" : ` (${n})`}` }),
    ),
  );
  const seen = new Set();
  fill(
    "dlq-messages",
    listed.messages.map((m) => {
      const h = m.headers || {};
      const value = m.value !== undefined ? m.value : `base64: ${m.value_b64}`;
      const oldest = !seen.has(m.queue);
      seen.add(m.queue);
      return el(
        "tr",
        { "data-queue": m.queue, "data-offset": m.offset },
        el("td", { class: "num", text: m.queue }),
        el("td", { class: "num", text: m.offset }),
        el("td", { text: m.key === null || m.key === undefined ? "–" : m.key }),
        el("td", { class: "value", title: value, text: value }),
        el("td", { text: h["raftmq-dlq-reason"] || "–" }),
        el("td", { class: "num", text: h["raftmq-dlq-attempts"] || "–" }),
        el("td", { class: "time", text: m.timestamp_ms ? isoTime(m.timestamp_ms) : "–" }),
        el(
          "td",
          {},
          oldest
            ? el("button", { type: "button", class: "redrive-one", onclick: () => redrive(m.queue, 1), text: "Redrive this message" })
            : el("span", { class: "muted", title: "Redrive goes in order: the older dead letters of this queue first", text: "after the ones above" }),
        ),
      );
    }),
    "no dead letters",
  );
}

async function redrive(queue, max) {
  if (!state.dlq) return;
  const { topic, group } = state.dlq;
  const body = queue === undefined ? {} : max === undefined ? { queue } : { queue, max };
  try {
    const r = await api(`/v1/topics/${pathOf(topic, "subscriptions", group, "dlq", "redrive")}`, { method: "POST", body });
    const one = max === 1 && r.redriven === 1 ? r.queues.find((q) => q.count === 1) : null;
    const text = one
      ? `Redrove the dead letter at offset ${one.redrive_offset - 1} of queue ${one.queue} to ${topic} for ${group}.`
      : `Redrove ${r.redriven} message${r.redriven === 1 ? "" : "s"} to ${topic} for ${group}${r.more ? " (more left)" : ""}.`;
    banner(text, "info");
    setTimeout(() => document.getElementById("banner").textContent === text && banner(""), 10000);
  } catch (error) {
    banner(explain(error));
    return; // (a refresh would clear the banner)
  }
  await refresh();
}

// -- chart ---------------------------------------------------------------------------------------

// One small chart per (group, topic), each with its own Y axis and its name above it as text: a
// group lagging by millions does not flatten one lagging by ten, and no legend is cut off.
function drawLagCharts(rows, colors) {
  const box = document.getElementById("lag-charts");
  if (!rows.length) {
    box.replaceChildren(el("p", { class: "empty", text: "no consumer groups to chart yet" }));
    return;
  }
  box.replaceChildren(
    ...rows.map((r) => {
      const canvas = el("canvas", { class: "lag", width: 420, height: 160 });
      const figure = el(
        "figure",
        { class: "lag-chart", "data-consumer": r.group, "data-topic": r.topic },
        el("figcaption", {}, el("span", { class: "swatch", text: "●" }), " ", el("strong", { text: r.group }), ` on ${r.topic} · lag ${fmt(r.lag)}`),
        canvas,
      );
      figure.querySelector(".swatch").style.color = colors.get(r.key);
      return figure;
    }),
  );
  // Drawn once in the page: the canvas takes its laid-out size.
  rows.forEach((r, i) => drawChart(box.children[i].querySelector("canvas"), [{ color: colors.get(r.key), points: lagSeries(r.key) }], {}));
}

function niceStep(max, ticks) {
  const raw = Math.max(max, 1) / ticks;
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
}

function drawChart(canvas, series, { spark }) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || Number(canvas.getAttribute("width"));
  const height = canvas.clientHeight || Number(canvas.getAttribute("height"));
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const pad = spark ? { l: 2, r: 2, t: 3, b: 3 } : { l: 60, r: 16, t: 12, b: 26 };
  ctx.font = "12px system-ui, sans-serif";
  const now = Date.now();
  const all = series.flatMap((s) => s.points);
  const t0 = all.length ? Math.min(...all.map((p) => p[0])) : now - 60000;
  // The big chart shows at least a minute; a sparkline spans its own samples.
  const span = Math.max(now - t0, spark ? 10000 : 60000);
  const step = niceStep(Math.max(0, ...all.map((p) => p[1])), 4);
  const top = step * Math.max(1, Math.ceil(Math.max(0, ...all.map((p) => p[1])) / step));
  if (!spark) {
    // The Y labels right-align at pad.l - 8: make room for the widest one (e.g. "1,200,000").
    let widest = 0;
    for (let v = 0; v <= top; v += step) widest = Math.max(widest, ctx.measureText(fmt(v)).width);
    pad.l = Math.max(pad.l, Math.ceil(widest) + 16);
  }
  const x = (t) => pad.l + ((t - (now - span)) / span) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - (v / top) * (height - pad.t - pad.b);
  ctx.font = "12px system-ui, sans-serif";
  if (!spark) {
    ctx.strokeStyle = "#eaeef2";
    ctx.fillStyle = "#656d76";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let v = 0; v <= top; v += step) {
      ctx.beginPath();
      ctx.moveTo(pad.l, y(v));
      ctx.lineTo(width - pad.r, y(v));
      ctx.stroke();
      ctx.fillText(fmt(v), pad.l - 8, y(v));
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    // As many time labels as fit (a label is about 60 px wide): 5 on a wide chart, 3 on a small one.
    const ticks = Math.max(1, Math.min(4, Math.floor((width - pad.l - pad.r) / 120)));
    for (let i = 0; i <= ticks; i++) {
      const t = now - span + (span * i) / ticks;
      ctx.textAlign = i === 0 ? "left" : i === ticks ? "right" : "center";
      ctx.fillText(isoClock(t), x(t), height - pad.b + 6);
    }
    ctx.textAlign = "center";
    if (!series.length) {
      ctx.textBaseline = "middle";
      ctx.fillText("no consumer groups to chart yet", width / 2, height / 2);
    }
  }
  series.forEach((s) => {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = spark ? 1.5 : 2;
    ctx.beginPath();
    s.points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
  });
}

// -- main loop -------------------------------------------------------------------------------------

const RENDER = { cluster: renderCluster, topics: renderTopics, groups: renderGroups, dlq: renderDlq, messages: renderMessages };

function decoded(text) {
  try {
    return decodeURIComponent(text);
  } catch (_) {
    return null; // not valid percent-encoding (a mistyped link): no topic selected
  }
}

// Views are linkable: #topics/<topic>, #messages/<topic>/<queue>[/<offset>],
// #groups/<group>/<topic>, #dlq/<topic>/<group> (each part percent-encoded).
function route() {
  const [view, ...args] = location.hash.replace(/^#/, "").split("/");
  const parts = args.map(decoded);
  state.view = RENDER[view] ? view : "cluster";
  if (state.view === "topics") state.topic = parts[0] || null;
  if (state.view === "groups") state.consumer = parts[0] && parts[1] ? `${parts[0]}\u0000${parts[1]}` : null;
  if (state.view === "dlq") {
    const same = state.dlq && state.dlq.topic === parts[0] && state.dlq.group === parts[1];
    state.dlq = parts[0] && parts[1] ? (same ? state.dlq : { topic: parts[0], group: parts[1], dlq: null }) : null;
  }
  if (state.view === "messages") {
    const queue = Number(parts[1]);
    const offset = parts[2] === undefined ? null : Number(parts[2]);
    if (parts[0] && Number.isInteger(queue) && queue >= 0 && (offset === null || (Number.isInteger(offset) && offset >= 0))) {
      state.browse = { topic: parts[0], queue, offset };
    } else {
      state.view = "topics"; // a malformed link: the topics to pick from
      state.browse = null;
    }
  }
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${state.view}`;
  const tab = state.view === "messages" ? "topics" : state.view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === tab);
  showFirstView();
  refresh();
}

// The node writes what the first view needs into the page itself (console.py): whether the cluster
// requires API tokens and, when it does not, the cluster view. The page shows it before any request
// of its own, so a page captured as soon as it has loaded is not an empty "loading…"; used once.
function showFirstView() {
  const island = document.getElementById("first-view");
  if (!island) return;
  island.remove();
  let first = null;
  try {
    first = JSON.parse(island.textContent);
  } catch (_) {
    return;
  }
  learnTokens(first);
  const status = document.getElementById("status");
  if (first.tokens_required && !sessionStorage.getItem(TOKEN_KEY)) {
    banner("This cluster requires API tokens: enter one above to see its data.");
    status.textContent = "waiting for an API token";
  } else if (first.cluster && state.view === "cluster") {
    showCluster(first.cluster);
    status.textContent = `as of ${isoClock(first.at_ms)}, when the page was served · refreshing every ${TICK_MS / 1000} s`;
  }
}

async function refresh() {
  if (state.busy) {
    state.again = true; // e.g. a token was entered while a refresh was under way
    return;
  }
  state.busy = true;
  state.again = false;
  const status = document.getElementById("status");
  try {
    await RENDER[state.view]();
    const every = state.view === "messages" ? "read again on Go or a page button" : `refreshing every ${TICK_MS / 1000} s`;
    status.textContent = `updated ${isoClock(Date.now())} · ${every}`;
    const b = document.getElementById("banner");
    if (!b.classList.contains("info")) banner("");
  } catch (error) {
    banner(explain(error));
    status.textContent = `failed at ${isoClock(Date.now())}`;
  } finally {
    state.busy = false;
  }
  if (state.again) refresh();
}

function start() {
  const input = document.getElementById("token");
  input.value = sessionStorage.getItem(TOKEN_KEY) || "";
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    else sessionStorage.removeItem(TOKEN_KEY);
    banner("");
    refresh();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    input.value = "";
    refresh();
  });
  document.getElementById("redrive-all").addEventListener("click", () => redrive(undefined));
  startBrowser();
  document.getElementById("create-topic").addEventListener("submit", createTopic);
  document.getElementById("delete-topic").addEventListener("click", deleteTopic);
  window.addEventListener("hashchange", route);
  route();
  // The message browser shows what it was asked for; it is read again on a click, not every tick.
  setInterval(() => state.view !== "messages" && refresh(), TICK_MS);
}

start();
