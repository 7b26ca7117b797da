// toolgym run viewer: curves, a paged episode table, one episode as a conversation and as
// tokens, and before/after evaluation episodes. Plain JS, no framework, no network beyond
// this page's own server. Views are chosen by the URL hash:
//   #                          the run: curves and the episode table
//   #episode=<source>:<index>  one episode (source: a trajectories file name)
//   #compare=<mode>:<row>      row <row> of each evaluation stage of <mode>, side by side
// Once the first view has rendered, document.body.dataset.ready is "1" and
// window.toolgymLoadMs holds performance.now() at that moment; every render sets
// document.body.dataset.rendered to the view's key (e.g. "episode=samples.jsonl:3").
// The page runs under the server's Content-Security-Policy (default-src 'self'): no inline
// scripts, handlers or style attributes here or in index.html (styles set through .style only).
"use strict";

const POLL_MS = 3000;
const TOKEN_RETRY_MS = 1500; // while the tokenizer loads, the episode is asked for again
const MAX_DRAWN = 1500; // points drawn per series; longer series are thinned
const MAX_DOTS = 300; // a series up to this long gets a dot (with a tooltip) per point; a longer
// one is a line only, and hovering the chart shows the point nearest the pointer
const state = {
  summary: null,
  metricsVersion: "",
  metricsRows: [],
  table: { offset: 0, total: null },
  polling: false,
  tokenTimer: null,
  episode: null,  // {source, index} of the episode shown
};
const $ = (selector, root = document) => root.querySelector(selector);

// -- small helpers ------------------------------------------------------------------------------
async function api(route, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(key, value);
  }
  const response = await fetch(`/api/${route}?${query}`);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${route}: HTTP ${response.status}`);
  return body;
}

function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value; // CSSOM: allowed by the CSP
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  for (const child of [].concat(children)) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, children = []) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of [].concat(children)) if (child) node.append(child);
  return node;
}

function fmt(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (typeof value !== "number") return String(value);
  const size = Math.abs(value);
  if (Number.isInteger(value) && size < 1e6) return String(value);
  if (size >= 1000) return value.toFixed(0);
  if (size >= 1) return value.toFixed(3).replace(/\.?0+$/, "");
  if (size === 0) return "0";
  if (size < 1e-3) return value.toExponential(2);
  return String(Number(value.toPrecision(3)));
}

function showError(message) {
  const box = $("#error");
  box.hidden = !message;
  box.textContent = message || "";
  if (message) document.body.dataset.error = message;
  else delete document.body.dataset.error;
}

function markRendered(key) {
  document.body.dataset.rendered = key;
  if (document.body.dataset.ready !== "1") {
    window.toolgymLoadMs = performance.now();
    document.body.dataset.ready = "1";
  }
}

// -- routing ------------------------------------------------------------------------------------
function parseHash() {
  let hash;
  try {
    hash = decodeURIComponent(location.hash.replace(/^#/, ""));
  } catch {
    return { view: "overview" }; // a malformed %-escape: show the run
  }
  const [name, value = ""] = hash.split(/=(.*)/s);
  const cut = value.lastIndexOf(":");
  const left = cut >= 0 ? value.slice(0, cut) : value;
  const right = cut >= 0 ? value.slice(cut + 1) : "";
  if (name === "episode") return { view: "episode", source: left, index: Number(right || 0) };
  if (name === "compare") return { view: "compare", mode: left, row: Number(right || 0) };
  return { view: "overview" };
}

function episodeHash(source, index) {
  return `#episode=${encodeURIComponent(source)}:${index}`;
}

async function route() {
  let target = { view: "overview" };
  try {
    target = parseHash();
  } catch {
    // keep the run view
  }
  for (const view of document.querySelectorAll(".view")) {
    view.hidden = view.id !== `view-${target.view}`;
  }
  showError("");
  try {
    if (target.view === "episode") await renderEpisode(target.source, target.index);
    else if (target.view === "compare") await renderCompare(target.mode, target.row);
    else await renderOverview();
  } catch (error) {
    showError(String(error.message || error));
    markRendered(`error:${target.view}`);
  }
}

// -- the run: summary, notices ------------------------------------------------------------------
async function loadSummary() {
  const summary = await api("summary");
  state.summary = summary;
  $("#run-path").textContent = `${summary.path} (${summary.kind === "run" ? "run folder" : "trajectories file"})`;
  $("#nav-compare").hidden = Object.keys(summary.compare).length === 0;
  fillSourceFilter(summary.sources);
  renderNotices(summary);
  return summary;
}

function renderNotices(summary) {
  const notes = [];
  for (const source of summary.sources) {
    if (source.malformed) {
      notes.push(`${source.name}: ${source.malformed} malformed line(s) skipped (not JSON or not a trajectory)`);
    }
  }
  if (state.metricsMalformed) notes.push(`metrics.jsonl: ${state.metricsMalformed} malformed line(s) skipped`);
  if (summary.refresh_error) notes.push(`${summary.refresh_error} (showing what was read before)`);
  const tokenizer = summary.tokenizer;
  if (!tokenizer.source || tokenizer.error) {
    notes.push(`No tokenizer: the token view shows token ids only (${tokenizer.error || "none found"}; pass --tokenizer PATH).`);
  }
  $("#notices").replaceChildren(...notes.map((text) => el("div", { text })));
}

function fillSourceFilter(sources) {
  const select = $("#f-source");
  const current = select.value;
  const options = [el("option", { value: "", text: "all files" })];
  for (const source of sources) {
    options.push(el("option", { value: source.name, text: `${source.name} (${source.episodes})` }));
  }
  select.replaceChildren(...options);
  select.value = sources.some((s) => s.name === current) ? current : "";
}

async function renderOverview() {
  if (!state.summary) await loadSummary();
  const isRun = state.summary.kind === "run";
  $("#curves").hidden = !isRun;
  await Promise.all([isRun ? loadMetrics() : null, loadTable()]);
  markRendered("overview");
}

// -- curves -------------------------------------------------------------------------------------
const GROUPS = [
  ["Reward & success", (k) => ["reward", "success_rate", "reward_std"].includes(k) || k.startsWith("rewards/")],
  ["Environment skills", (k) => k.startsWith("env/")],
  ["Environments", (k) => k.startsWith("envs/")],
  ["Curriculum", (k) => k.startsWith("curriculum_") || k.startsWith("difficulty/")],
  ["Evaluation", (k) => k.startsWith("eval/")],
  ["Statuses", (k) => k.endsWith("statuses")],
  ["Episodes", (k) => ["turns", "tool_calls", "tool_failures", "valid_tool_calls", "excluded", "groups_without_signal"].includes(k)],
  ["Optimisation", (k) => ["loss", "grad_norm", "kl", "is_weight", "clip_fraction", "learning_rate", "staleness", "entropy"].includes(k)],
  ["Timing", (k) => k.endsWith("_seconds")],
  ["Other", () => true],
];
const FIRST_KEYS = ["reward", "success_rate", "reward_std"];
const PALETTE = ["#0b62c4", "#d4761c", "#1a7f37", "#8250df", "#cf222e", "#0a8a8a", "#9a6700", "#6e7781"];
const STATUS_COLOURS = {
  env_done: "#1a7f37", finished: "#0b62c4", max_turns: "#d4761c", length: "#9a6700",
  tool_timeout: "#cf222e", tool_crash: "#a40e26", too_many_calls: "#bc4c00",
  env_error: "#8250df", engine_error: "#6e7781", judge_error: "#57606a",
};

async function loadMetrics() {
  const answer = await api("metrics", { version: state.metricsVersion });
  if (answer.unchanged) return false;
  state.metricsVersion = answer.version;
  state.metricsRows = answer.rows;
  state.metricsMalformed = answer.malformed;
  renderCurves(answer.rows);
  return true;
}

function metricSeries(rows) {
  // key -> [{name, points: [[step, value]]}]: numbers give one series, dicts one per entry
  const charts = new Map();
  rows.forEach((row, position) => {
    const step = Number.isFinite(row.step) ? row.step : position + 1;
    for (const [key, value] of Object.entries(row)) {
      if (key === "step") continue;
      if (typeof value === "number" && Number.isFinite(value)) {
        addPoint(charts, key, key, step, value);
      } else if (value && typeof value === "object" && !Array.isArray(value)) {
        for (const [name, count] of Object.entries(value)) {
          if (Number.isFinite(count)) addPoint(charts, key, name, step, count);
        }
      }
    }
  });
  // a dict-valued key (statuses): a missing entry in a step counts 0
  for (const [key, series] of charts) {
    if (series.size > 1 || !series.has(key)) fillZeros(rows, key, series);
  }
  return charts;
}

function addPoint(charts, key, name, step, value) {
  if (!charts.has(key)) charts.set(key, new Map());
  const series = charts.get(key);
  if (!series.has(name)) series.set(name, []);
  series.get(name).push([step, value]);
}

function fillZeros(rows, key, series) {
  const steps = rows.map((row, i) => [row, Number.isFinite(row.step) ? row.step : i + 1])
    .filter(([row]) => row[key] && typeof row[key] === "object").map(([, step]) => step);
  for (const [name, points] of series) {
    const have = new Map(points);
    series.set(name, steps.map((step) => [step, have.get(step) ?? 0]));
  }
}

function renderCurves(rows) {
  const charts = metricSeries(rows);
  const keys = [...charts.keys()].sort((a, b) => {
    const rank = (k) => (FIRST_KEYS.includes(k) ? FIRST_KEYS.indexOf(k) : FIRST_KEYS.length);
    return rank(a) - rank(b) || a.localeCompare(b);
  });
  const groups = GROUPS.map(([title]) => [title, []]);
  for (const key of keys) {
    const slot = GROUPS.findIndex(([, test]) => test(key));
    groups[slot][1].push(key);
  }
  const sections = groups.filter(([, members]) => members.length).map(([title, members]) =>
    el("div", { class: "curve-group", dataset: { group: title } }, [
      el("h3", { text: title }),
      el("div", { class: "charts" }, members.map((key) => safeChart(key, charts.get(key)))),
    ]));
  const last = rows.length ? rows[rows.length - 1].step : null;
  $("#curves-info").textContent = rows.length
    ? `${rows.length} logged steps, last step ${fmt(last)}`
    : "no metrics.jsonl lines yet (the page re-reads it every few seconds)";
  $("#curve-groups").replaceChildren(...sections);
}

function safeChart(key, seriesMap) {
  // one chart that cannot be drawn says so, and the others are still drawn
  try {
    return chart(key, seriesMap);
  } catch (error) {
    return el("figure", { class: "chart chart-error", dataset: { key, error: "1" } }, [
      el("figcaption", {}, el("span", { text: key })),
      el("p", { class: "error-text", text: `cannot draw this curve: ${error.message || error}` }),
    ]);
  }
}

function chart(key, seriesMap) {
  const box = { width: 300, height: 130, left: 50, right: 8, top: 6, bottom: 18 };
  const series = [...seriesMap.entries()].map(([name, points], i) => ({
    name, points, drawn: thinned(points), colour: STATUS_COLOURS[name] || PALETTE[i % PALETTE.length],
  }));
  const [x0, x1] = padded(series.map((s) => s.points), 0);
  const [y0, y1] = padded(series.map((s) => s.points), 1);
  const sx = (x) => box.left + ((x - x0) / (x1 - x0)) * (box.width - box.left - box.right);
  const sy = (y) => box.top + (1 - (y - y0) / (y1 - y0)) * (box.height - box.top - box.bottom);
  const parts = axes(x0, x1, y0, y1, sx, sy, box.width, box.height, box.left, box.bottom);
  const count = series.reduce((n, s) => n + s.points.length, 0);
  const radius = count > 600 ? 1.2 : 2.4;
  for (const s of series) {
    const path = s.drawn.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    parts.push(svg("polyline", {
      class: "line", points: path, stroke: s.colour,
      "data-series": s.name, "data-points": s.points.length, "data-drawn": s.drawn.length,
    }));
    if (s.points.length > MAX_DOTS) continue; // hovering finds the nearest point instead
    for (const [x, y] of s.points) {
      parts.push(svg("circle", {
        class: "pt", cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r: radius, fill: s.colour,
        "data-step": x, "data-value": y, "data-series": s.name,
      }, [svg("title", {}, [document.createTextNode(`${s.name} @ step ${fmt(x)}: ${fmt(y)}`)])]));
    }
  }
  const lastPoints = series.length === 1 ? series[0].points : [];
  const lastValue = lastPoints.length ? fmt(lastPoints[lastPoints.length - 1][1]) : "";
  const caption = el("figcaption", {}, [el("span", { text: key }), el("span", { class: "last", text: lastValue })]);
  const legend = series.length > 1
    ? el("div", { class: "series-legend" }, series.map((s) =>
      el("span", {}, [el("i", { style: `background:${s.colour}` }), s.name])))
    : null;
  const graphic = svg("svg", { width: box.width, height: box.height, viewBox: `0 0 ${box.width} ${box.height}`, role: "img" }, parts);
  const thin = series.some((s) => s.drawn.length < s.points.length);
  if (series.some((s) => s.points.length > MAX_DOTS)) hoverNearest(graphic, series, { sx, sy, x0, x1, box });
  return el("figure", { class: "chart", dataset: { key, points: count, thinned: thin ? "1" : "0" } }, [caption, graphic, legend]);
}

function thinned(points, most = MAX_DRAWN) {
  // at most `most` points: the first, the last and evenly spaced ones between
  if (points.length <= most) return points;
  const stride = (points.length - 1) / (most - 1);
  const kept = [];
  for (let i = 0; i < most; i++) kept.push(points[Math.round(i * stride)]);
  return kept;
}

function hoverNearest(graphic, series, { sx, sy, x0, x1, box }) {
  // long series have no dot per point: a marker and a label follow the pointer instead
  const marker = svg("circle", { class: "hover-pt", r: 3, visibility: "hidden" });
  const label = svg("text", { class: "hover-label", x: box.width - box.right, y: box.top + 9, "text-anchor": "end" });
  graphic.append(marker, label);
  graphic.addEventListener("mousemove", (event) => {
    const bounds = graphic.getBoundingClientRect();
    const px = ((event.clientX - bounds.left) / bounds.width) * box.width;
    const py = ((event.clientY - bounds.top) / bounds.height) * box.height;
    const step = x0 + ((px - box.left) / (box.width - box.left - box.right)) * (x1 - x0);
    let best = null;
    for (const s of series) {
      const point = nearestByStep(s.points, step);
      const distance = point && Math.abs(sy(point[1]) - py);
      if (point && (!best || distance < best.distance)) best = { s, point, distance };
    }
    if (!best) return;
    const [x, y] = best.point;
    Object.entries({ cx: sx(x), cy: sy(y), fill: best.s.colour, visibility: "visible" })
      .forEach(([name, value]) => marker.setAttribute(name, value));
    label.textContent = `${series.length > 1 ? `${best.s.name} ` : ""}@ step ${fmt(x)}: ${fmt(y)}`;
  });
  graphic.addEventListener("mouseleave", () => {
    marker.setAttribute("visibility", "hidden");
    label.textContent = "";
  });
}

function nearestByStep(points, step) {
  // binary search over points in step order (as metrics.jsonl logs them)
  if (!points.length) return null;
  let low = 0, high = points.length - 1;
  while (high - low > 1) {
    const middle = (low + high) >> 1;
    if (points[middle][0] < step) low = middle; else high = middle;
  }
  return Math.abs(points[low][0] - step) <= Math.abs(points[high][0] - step) ? points[low] : points[high];
}

function padded(pointLists, axis) {
  // [low, high] of coordinate `axis` over every point, padded when flat (a loop: spreading
  // hundreds of thousands of values into Math.min would overflow the call stack)
  let low = Infinity, high = -Infinity;
  for (const points of pointLists) {
    for (const point of points) {
      const value = point[axis];
      if (value < low) low = value;
      if (value > high) high = value;
    }
  }
  if (low > high) return [0, 1];
  if (low === high) {
    const pad = Math.abs(low) * 0.1 || 1;
    low -= pad; high += pad;
  }
  return [low, high];
}

function axes(x0, x1, y0, y1, sx, sy, width, height, left, bottom) {
  const parts = [];
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    parts.push(svg("line", { class: "grid", x1: left, x2: width - 4, y1: sy(y), y2: sy(y) }));
    const label = svg("text", { x: left - 4, y: sy(y) + 3, "text-anchor": "end" });
    label.textContent = fmt(Number(y.toPrecision(3)));
    parts.push(label);
  }
  parts.push(svg("line", { class: "axis", x1: left, x2: left, y1: 2, y2: height - bottom }));
  for (const [x, anchor] of [[x0, "start"], [x1, "end"]]) {
    const label = svg("text", { x: sx(x), y: height - 4, "text-anchor": anchor });
    label.textContent = `step ${fmt(Number(x.toPrecision(4)))}`;
    parts.push(label);
  }
  return parts;
}

// -- the episode table --------------------------------------------------------------------------
function tableQuery() {
  return {
    source: $("#f-source").value,
    status: $("#f-status").value,
    q: $("#f-q").value.trim(),
    step_min: $("#f-step-min").value,
    step_max: $("#f-step-max").value,
    reward_min: $("#f-reward-min").value,
    reward_max: $("#f-reward-max").value,
    sort: $("#f-sort").value,
    limit: $("#f-limit").value,
    offset: state.table.offset,
  };
}

async function loadTable() {
  const query = tableQuery();
  const page = await api("episodes", query);
  state.table.total = page.total;
  renderStatusFilter(page.statuses);
  renderTableRows(page.rows);
  const first = page.matched ? page.offset + 1 : 0;
  const last = page.offset + page.rows.length;
  $("#page-info").textContent = `${first}–${last} of ${page.matched.toLocaleString("en")} matching`;
  const total = $("#episode-total");
  total.textContent = `${page.total.toLocaleString("en")} episodes`;
  total.dataset.total = page.total;
  total.dataset.matched = page.matched;
  $("#page-prev").disabled = page.offset === 0;
  $("#page-next").disabled = last >= page.matched;
  $("#episode-table").dataset.query = new URLSearchParams(query).toString();
}

function renderStatusFilter(statuses) {
  const select = $("#f-status");
  const current = select.value;
  const options = [el("option", { value: "", text: "any status" })];
  for (const [status, count] of Object.entries(statuses)) {
    options.push(el("option", { value: status, text: `${status} (${count})` }));
  }
  if (current && !(current in statuses)) options.push(el("option", { value: current, text: `${current} (0)` }));
  select.replaceChildren(...options);
  select.value = current;
}

function renderTableRows(rows) {
  const body = $("#episode-table tbody");
  body.replaceChildren(...rows.map((row) => {
    const env = Object.entries(row.env_metrics || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
    const reward = row.reward === null ? "" : row.reward > 0 ? "reward-pos" : row.reward < 0 ? "reward-neg" : "";
    return el("tr", { dataset: { source: row.source, index: row.index, status: row.status } }, [
      el("td", { text: row.source }),
      el("td", { class: "num" }, el("a", { href: episodeHash(row.source, row.index), text: row.index })),
      el("td", { class: "num", text: fmt(row.step) }),
      el("td", { class: `num ${reward}`, text: fmt(row.reward) }),
      el("td", {}, el("span", { class: `status ${row.status}`, text: row.status, title: row.error || "" })),
      el("td", { class: "num", text: fmt(row.turns) }),
      el("td", { class: "num", text: fmt(row.tool_calls) }),
      el("td", { class: "num", text: fmt(row.tool_failures) }),
      el("td", { class: "num", text: fmt(row.tokens) }),
      el("td", { class: "env", text: env }),
    ]);
  }));
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: 10, class: "muted", text: "no episodes match" })));
}

function wireFilters() {
  let timer = null;
  const reload = () => {
    state.table.offset = 0;
    loadTable().catch((error) => showError(String(error.message || error)));
  };
  $("#filters").addEventListener("submit", (event) => event.preventDefault()); // Enter: no reload
  for (const id of ["#f-source", "#f-status", "#f-sort", "#f-limit"]) $(id).addEventListener("change", reload);
  for (const id of ["#f-q", "#f-step-min", "#f-step-max", "#f-reward-min", "#f-reward-max"]) {
    $(id).addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(reload, 250); });
  }
  const turn = (delta) => {
    state.table.offset = Math.max(0, state.table.offset + delta * Number($("#f-limit").value));
    loadTable().catch((error) => showError(String(error.message || error)));
  };
  $("#page-prev").addEventListener("click", () => turn(-1));
  $("#page-next").addEventListener("click", () => turn(1));
  $("#episode-table tbody").addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-source]");
    if (row && !event.target.closest("a")) location.hash = episodeHash(row.dataset.source, row.dataset.index);
  });
}

// -- one episode --------------------------------------------------------------------------------
async function renderEpisode(source, index) {
  if (!state.summary) await loadSummary();
  const answer = await api("episode", { source, index });
  const { summary, episode } = answer;
  const count = (state.summary.sources.find((s) => s.name === source) || {}).episodes || 0;
  $("#episode-title").textContent = `${source} #${index}${summary.step !== null ? ` · step ${fmt(summary.step)}` : ""}`;
  $("#episode-prev").href = episodeHash(source, Math.max(0, index - 1));
  $("#episode-prev").hidden = index <= 0;
  $("#episode-next").href = episodeHash(source, index + 1);
  $("#episode-next").hidden = index + 1 >= count;
  $("#episode-facts").replaceChildren(...facts(summary, episode));
  $("#conversation").replaceChildren(...conversation(episode.messages || []));
  state.episode = { source, index };  // the episode the token view shows
  renderTokens(answer, episode);
  markRendered(`episode=${source}:${index}`);
  retryTokens(source, index, answer.tokenizer.pending);
}

function retryTokens(source, index, pending) {
  // while the tokenizer loads, tokens come back as ids: ask again until they are decoded
  clearTimeout(state.tokenTimer);
  $("#tokens").dataset.pending = pending ? "1" : "0";
  if (!pending) return;
  const key = `episode=${source}:${index}`;
  state.tokenTimer = setTimeout(async () => {
    if (document.body.dataset.rendered !== key) return; // the page moved on
    try {
      const answer = await api("episode", { source, index });
      if (document.body.dataset.rendered !== key) return;
      renderTokens(answer, answer.episode);
      retryTokens(source, index, answer.tokenizer.pending);
    } catch (error) {
      showError(String(error.message || error));
    }
  }, TOKEN_RETRY_MS);
}

function facts(summary, episode) {
  const items = [
    ["reward", fmt(summary.reward)],
    ["status", el("span", { class: `status ${summary.status}`, text: summary.status })],
    ["turns", fmt(summary.turns)],
    ["tool calls", fmt(summary.tool_calls)],
    ["tool failures", fmt(summary.tool_failures)],
    ["tokens", fmt(summary.tokens)],
  ];
  const parts = items.map(([name, value]) => el("div", {}, [el("b", { text: name }), value]));
  if (episode.error) parts.push(el("div", { class: "wide error-text" }, [el("b", { text: "error" }), episode.error]));
  // reward_sources: the total's parts (older files: an unused "rewards")
  const sources = episode.reward_sources || episode.rewards;
  const groups = [["reward sources", sources], ["env metrics", episode.env_metrics], ["metrics", episode.metrics]];
  for (const [name, value] of groups) {
    if (value && Object.keys(value).length) {
      const text = Object.entries(value).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
      parts.push(el("div", { class: "wide", dataset: { fact: name } }, [el("b", { text: name }), el("span", { text })]));
    }
  }
  for (const judgement of episode.judgements || []) parts.push(judgementFact(judgement));
  if (episode.row && Object.keys(episode.row).length) {
    parts.push(el("div", { class: "wide", dataset: { fact: "row" } }, [el("b", { text: "row" }), el("pre", { text: compactJson(episode.row) })]));
  }
  return parts;
}

// One judge call that scored this episode: the score (or the judge's failure), then the chat it
// was asked and its answer, folded.
function judgementFact(judgement) {
  const outcome = judgement.error ? judgement.error : `score ${fmt(judgement.score)}`;
  const parts = judgement.scores ? ` (${Object.entries(judgement.scores).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ")})` : "";
  const where = judgement.position ? `, episode ${judgement.position} of its group` : "";
  const cached = judgement.cached ? ", cached" : "";
  const title = `${judgement.judge} · ${judgement.model}: ${outcome}${parts}${where}${cached}, ${fmt(judgement.seconds)} s`;
  const chat = (judgement.messages || []).map((m) => `[${m.role}]\n${m.content}`).join("\n\n");
  return el("div", { class: "wide", dataset: { fact: "judgement" } }, [
    el("b", { text: "judge" }),
    el("details", { class: "judgement" }, [
      el("summary", { text: title }),
      el("pre", { text: chat }),
      el("pre", { text: `[judge's answer]\n${judgement.answer || ""}` }),
    ]),
  ]);
}

function compactJson(value) {
  return Object.entries(value).map(([k, v]) => `${k}: ${typeof v === "number" ? fmt(v) : JSON.stringify(v)}`).join("\n");
}

// A tool message names its call's failure (None when it worked); older files only word it "Error: ...".
function toolFailed(message, content) {
  if ("failure" in message) return Boolean(message.failure);
  return content.startsWith("Error:");
}

function conversation(messages) {
  const lastAssistant = messages.map((m) => m.role).lastIndexOf("assistant");
  return messages.map((message, position) => {
    const calls = message.tool_calls || [];
    const final = position === lastAssistant && !calls.length;
    const content = String(message.content ?? "");
    const classes = [`msg`, `role-${message.role}`];
    if (final) classes.push("final");
    if (message.role === "tool" && toolFailed(message, content)) classes.push("tool-error");
    const label = final ? "assistant · final answer" : message.role + (message.name ? ` · ${message.name}` : "");
    const parts = [el("div", { class: "role", text: label })];
    if (message.reasoning_content) {
      parts.push(el("details", { class: "reasoning" }, [el("summary", { text: "reasoning" }), el("pre", { text: message.reasoning_content })]));
    }
    if (content) parts.push(el("div", { class: "content", text: content }));
    for (const image of toolImages(message)) parts.push(el("img", { class: "tool-image", src: image, alt: "an image the tool returned" }));
    for (const call of calls) parts.push(toolCall(call));
    if (message.raw_content !== undefined && message.raw_content !== content) {
      parts.push(el("details", { class: "raw" }, [el("summary", { text: "raw text" }), el("pre", { text: message.raw_content })]));
    }
    return el("div", { class: classes.join(" "), dataset: { role: message.role } }, parts);
  });
}

// A tool result's images (content_blocks, data URLs): raster formats only, so that nothing a
// model or tool wrote is ever read as SVG.
const RASTER_IMAGE = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]+$/;
function toolImages(message) {
  const blocks = Array.isArray(message.content_blocks) ? message.content_blocks : [];
  return blocks
    .filter((b) => b && b.type === "image" && typeof b.image === "string" && RASTER_IMAGE.test(b.image))
    .map((b) => b.image);
}

function toolCall(call) {
  const fn = call.function || call;
  let args = fn.arguments;
  if (typeof args !== "string") args = JSON.stringify(args);
  return el("div", { class: "tool-call", dataset: { name: fn.name || "" } }, [
    el("span", { class: "fn", text: fn.name || "?" }), `(${args ?? ""})`]);
}

// -- the token view -----------------------------------------------------------------------------
function renderTokens(answer, episode) {
  const tokens = answer.completion_tokens;
  // only the shown sample's steps: a chat episode's steps name their sample; an inline
  // episode's (no `sample`) are on its last, the one shown
  const shown = answer.sample ?? answer.samples - 1;
  const steps = (episode.step_rewards || []).filter((s) => s.sample === undefined || s.sample === shown);
  const stepEnds = new Map();  // a turn's environment reward and its invalid-call reward add up
  steps.forEach((s) => stepEnds.set(s.end, (stepEnds.get(s.end) || 0) + s.reward));
  const spans = [];
  tokens.forEach((token, position) => {
    spans.push(tokenSpan(token, position));
    if (stepEnds.has(position + 1)) {
      spans.push(el("sup", { class: "step-reward", title: "reward of this step (the environment's, with any invalid-call reward)", text: fmt(stepEnds.get(position + 1)) }));
    }
  });
  $("#tokens").replaceChildren(...spans);
  const prompt = answer.prompt_tokens.map((token, position) => tokenSpan(token, position, true));
  $("#prompt-tokens").replaceChildren(...prompt);
  $("#prompt-count").textContent = `(${prompt.length})`;
  const sampled = tokens.filter((t) => t.mask === 1);
  const logprobs = sampled.map((t) => t.logprob).filter((v) => v !== null);
  const mean = logprobs.length ? logprobs.reduce((a, b) => a + b, 0) / logprobs.length : null;
  $("#token-stats").textContent = `${tokens.length} completion tokens: ${sampled.length} sampled, `
    + `${tokens.length - sampled.length} observation; mean logprob of sampled ${fmt(mean)}`;
  const notes = [];
  if (answer.tokenizer.pending) notes.push("Loading the tokenizer: tokens show their ids until it is ready.");
  else if (!answer.tokenizer.loaded) notes.push(`No tokenizer (${answer.tokenizer.error || "none found"}): tokens show their ids.`);
  if (answer.samples > 1) notes.push(`This episode trains on ${answer.samples} samples (each continues the one it names); these are sample ${shown}'s tokens.`);
  $("#token-note").textContent = notes.join(" ");
  renderGraph(answer, episode);
}

// The episode's samples as a graph: one button per sample (its parent, role and token counts);
// a click shows that sample's tokens.
function renderGraph(answer, episode) {
  const graph = answer.graph || [];
  const shown = answer.sample ?? answer.samples - 1;
  const shownEpisode = state.episode;
  const buttons = graph.length > 1 ? graph.map((node) => {
    const from = node.parent === null ? "root" : `from ${node.parent}`;
    const button = el("button", {
      type: "button",
      class: node.index === shown ? "sample-node shown" : "sample-node",
      title: `sample ${node.index} (${from}, role ${node.role}): prompt ${node.prompt}, sampled ${node.sampled}, observation ${node.observation} tokens`,
      text: `${node.index} · ${from} · ${node.role} · ${node.sampled} sampled`,
    });
    button.dataset.sample = node.index;
    button.addEventListener("click", async () => {
      if (!shownEpisode) return;
      try {
        const other = await api("episode", { ...shownEpisode, sample: node.index });
        if (state.episode !== shownEpisode) return; // the page moved on
        renderTokens(other, episode);
      } catch (error) {
        showError(String(error.message || error));
      }
    });
    return button;
  }) : [];
  $("#sample-graph").replaceChildren(...buttons);
}

function shade(logprob) {
  // sampled tokens: lightness 82% at logprob 0 down to 48% at logprob -8 or lower
  const scale = logprob === null ? 1 : Math.min(1, Math.max(0, 1 + logprob / 8));
  return `hsl(212 90% ${(48 + 34 * scale).toFixed(1)}%)`;
}

function tokenSpan(token, position, isPrompt = false) {
  const text = token.text === null || token.text === undefined ? `[${token.id}]` : token.text;
  const span = el("span", { text });
  span.dataset.id = token.id;
  span.dataset.pos = position;
  // the raw vocabulary string shows the bytes of a piece that decodes to U+FFFD on its own
  const raw = token.token === null || token.token === undefined ? "" : ` (raw ${JSON.stringify(token.token)})`;
  const described = `id ${token.id} ${JSON.stringify(text)}${raw}`;
  if (isPrompt) {
    span.className = "tok prompt";
    span.title = `prompt token ${position}: ${described}`;
  } else {
    const sampled = token.mask === 1;
    const logprob = token.logprob;
    const probability = logprob === null ? 1 : Math.exp(logprob);
    span.className = `tok ${sampled ? "sampled" : "observation"}`;
    span.dataset.mask = sampled ? "1" : "0";
    span.dataset.logprob = logprob === null ? "" : String(logprob);
    if (sampled) {
      span.style.background = shade(logprob);
      if (probability < 0.1) span.classList.add("surprising");
    }
    span.title = sampled
      ? `sampled token ${position}: ${described}\nlogprob ${fmt(logprob)} (p ${probability.toFixed(3)})`
      : `observation token ${position}: ${described} (not trained on)`;
  }
  if (text.includes("\n")) span.classList.add("nl");
  return span;
}

// -- before / after -----------------------------------------------------------------------------
async function renderCompare(mode, row) {
  if (!state.summary) await loadSummary();
  const modes = Object.keys(state.summary.compare);
  if (!modes.length) throw new Error("this run has no eval-<stage>-<mode>.jsonl files to compare");
  const chosen = modes.includes(mode) ? mode : modes[0];
  const answer = await api("compare", { mode: chosen, row: Math.max(0, row || 0) });
  $("#c-mode").replaceChildren(...modes.map((m) => el("option", { value: m, text: m })));
  $("#c-mode").value = answer.mode;
  $("#c-row").value = answer.row;
  $("#c-row").max = Math.max(0, answer.rows - 1);
  $("#c-info").textContent = `row ${answer.row} of 0–${answer.rows - 1}`;
  const withRow = answer.sides.find((s) => s.episode);
  $("#compare-warning").hidden = !answer.warning;
  $("#compare-warning").textContent = answer.warning || "";
  $("#compare-row").textContent = withRow ? compactJson(withRow.episode.row || {}) : "";
  $("#compare-sides").replaceChildren(...answer.sides.map((side) => compareSide(side, answer.row)));
  markRendered(`compare=${answer.mode}:${answer.row}`);
}

function compareSide(side, row) {
  const header = el("h3", {}, [
    el("span", { text: side.stage }),
    el("a", { href: episodeHash(side.source, row), class: "muted", text: side.source }),
  ]);
  if (!side.episode) {
    return el("div", { class: "compare-side", dataset: { source: side.source } }, [header, el("p", { class: "muted", text: "no episode for this row" })]);
  }
  return el("div", { class: "compare-side", dataset: { source: side.source, row } }, [
    header,
    el("div", { class: "facts" }, facts(side.summary, side.episode)),
    el("div", { class: "conversation" }, conversation(side.episode.messages || [])),
  ]);
}

function wireCompare() {
  const go = (mode, row) => { location.hash = `#compare=${mode}:${Math.max(0, row)}`; };
  $("#c-mode").addEventListener("change", () => go($("#c-mode").value, Number($("#c-row").value)));
  $("#c-row").addEventListener("change", () => go($("#c-mode").value, Number($("#c-row").value)));
  $("#c-prev").addEventListener("click", () => go($("#c-mode").value, Number($("#c-row").value) - 1));
  $("#c-next").addEventListener("click", () => go($("#c-mode").value, Number($("#c-row").value) + 1));
}

// -- live updates -------------------------------------------------------------------------------
async function poll() {
  if (state.polling || document.hidden || !state.summary) return;
  state.polling = true;
  try {
    const before = state.summary.sources.reduce((n, s) => n + s.episodes, 0);
    const summary = await loadSummary();
    const after = summary.sources.reduce((n, s) => n + s.episodes, 0);
    const overview = parseHash().view === "overview";
    if (overview && summary.kind === "run") await loadMetrics();
    if (overview && after !== before) await loadTable();
    $("#live").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("#live").textContent = `update failed: ${error.message || error}`;
  } finally {
    state.polling = false;
  }
}

function main() {
  wireFilters();
  wireCompare();
  window.addEventListener("hashchange", route);
  route();
  setInterval(poll, POLL_MS);
}

main();
