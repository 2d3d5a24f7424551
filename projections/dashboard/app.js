/* runwatch customer dashboard: vanilla JS, no dependencies, charts as inline SVG.
 *
 * Reads the customer API with the tenant's key (sent as X-API-Key):
 *   GET /v1/usage, /v1/runs (paged), /v1/runs/{id}, /v1/runs/{id}/charts (paged by step),
 *   GET /dashboard/api/runs/{id}/alerts
 * The key comes from the URL fragment (#key=...; removed from the address bar at once) or
 * from the sign-in form, and is kept in sessionStorage (this tab only).
 * Every text from the server is put in the DOM with textContent, never as HTML.
 */
"use strict";

(function () {
  const KEY_STORE = "runwatch.apiKey";
  const REFRESH_MS = 15000;
  const MAX_CHART_PAGES = 50;
  const SVGNS = "http://www.w3.org/2000/svg";
  const STATE_LABEL = {
    SUBMITTED: "Submitted",
    QUEUED: "Queued",
    PROVISIONING: "Provisioning",
    RUNNING: "Running",
    DEGRADED: "Degraded",
    PAUSED_BY_GATE: "Paused by gate",
    SUCCEEDED: "Succeeded",
    FAILED: "Failed",
    CANCELLED: "Cancelled",
  };
  const CLASS_LABEL = {
    platform_fault: "Platform fault",
    tenant_code_fault: "Your code or data",
    algorithmic_non_convergence: "Did not converge",
  };
  const CHARTS = [
    { key: "reward", metric: "reward", title: "Reward", sub: "mean training reward per step", fmt: fmtNum },
    { key: "kl", metric: "kl", title: "KL to reference", sub: "per-token KL divergence from the frozen reference", fmt: fmtNum },
    { key: "eval_gate", metric: "eval_gate", title: "Eval-gate score", sub: "held-out score the optimizer never sees", fmt: fmtNum, dots: true },
    { key: "spend_usd", metric: "spend", title: "Spend so far", sub: "USD at list prices", fmt: fmtUsd, area: true, zero: true },
  ];

  let apiKey = null;
  let selected = null;
  let timer = null;
  let loadSeq = 0;

  // ---- small DOM helpers ------------------------------------------------------------
  const $ = (sel) => document.querySelector(sel);
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
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) if (c) node.append(c);
    return node;
  }

  // ---- formatting -------------------------------------------------------------------
  function fmtNum(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e6 || a < 1e-3) return v.toExponential(2);
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toPrecision(3).replace(/0+$/, "").replace(/\.$/, "");
  }
  function fmtUsd(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    if (Math.abs(v) >= 1000) return "$" + Math.round(v).toLocaleString("en-US");
    if (Math.abs(v) >= 1) return "$" + v.toFixed(2);
    return "$" + v.toFixed(v === 0 ? 2 : 4);
  }
  function fmtInt(v) {
    return Number.isFinite(v) ? Math.round(v).toLocaleString("en-US") : "–";
  }
  function fmtCompact(v) {
    if (!Number.isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "B";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    return fmtInt(v);
  }
  function fmtAgo(ts) {
    if (!ts) return "–";
    const s = Date.now() / 1000 - ts;
    if (s < 0) return "just now";
    if (s < 60) return Math.round(s) + " s ago";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    if (s < 86400) return (s / 3600).toFixed(1).replace(/\.0$/, "") + " h ago";
    return Math.round(s / 86400) + " d ago";
  }
  function fmtTime(ts) {
    return ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "";
  }
  function stateBadge(state) {
    const s = state || "SUBMITTED";
    return el("span", { class: "state " + s, "data-state": s, text: STATE_LABEL[s] || s });
  }

  // ---- the API ----------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, detail) {
      super(detail || "HTTP " + status);
      this.status = status;
    }
  }
  async function api(path) {
    const r = await fetch(path, {
      headers: { "X-API-Key": apiKey, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
    if (!r.ok) {
      let detail = "";
      try {
        detail = (await r.json()).detail;
      } catch (_) {
        /* not JSON */
      }
      throw new ApiError(r.status, typeof detail === "string" ? detail : "");
    }
    return r.json();
  }
  async function apiPost(path, body) {
    const r = await fetch(path, {
      method: "POST",
      headers: { "X-API-Key": apiKey, Accept: "application/json", "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
      cache: "no-store",
      credentials: "omit",
    });
    let doc = null;
    try {
      doc = await r.json();
    } catch (_) {
      /* not JSON */
    }
    if (!r.ok) {
      const detail = doc && typeof doc.detail === "string" ? doc.detail : "";
      throw new ApiError(r.status, detail);
    }
    return doc;
  }
  async function allRuns() {
    const items = [];
    let offset = 0;
    while (offset !== null && offset !== undefined) {
      const page = await api(`/v1/runs?limit=500&offset=${offset}`);
      items.push(...page.items);
      offset = page.next_offset;
    }
    return items;
  }
  async function allCharts(runId) {
    const out = { reward: [], kl: [], eval_gate: [], spend_usd: [] };
    let since = 0;
    for (let i = 0; i < MAX_CHART_PAGES && since !== null && since !== undefined; i++) {
      const c = await api(`/v1/runs/${encodeURIComponent(runId)}/charts?limit=2000&since_step=${since}`);
      for (const k of Object.keys(out)) out[k].push(...c[k]);
      since = c.next_since_step;
    }
    return out;
  }

  // ---- URL fragment: #key=...&run=... ------------------------------------------------
  function readFragment() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const key = params.get("key");
    if (key) {
      sessionStorage.setItem(KEY_STORE, key);
      params.delete("key");
      const rest = params.toString();
      history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    }
    return params.get("run");
  }
  function setRunInUrl(runId) {
    const target = runId ? "#run=" + encodeURIComponent(runId) : location.pathname + location.search;
    if (runId ? location.hash !== target : location.hash) history.pushState(null, "", target);
  }

  // ---- sign in / out ----------------------------------------------------------------
  function showSignin(message) {
    apiKey = null;
    sessionStorage.removeItem(KEY_STORE);
    clearInterval(timer);
    $("#app").hidden = true;
    $("#session").hidden = true;
    $("#runs tbody").replaceChildren();
    $("#summary").replaceChildren();
    $("#detail").replaceChildren();
    $("#detail").hidden = true;
    $("#signin").hidden = false;
    const err = $("#signin .error");
    err.textContent = message || "";
    err.hidden = !message;
    $("#signin input[name=key]").focus();
  }
  async function signIn(key, runFromUrl) {
    apiKey = key;
    let usage;
    try {
      usage = await api("/v1/usage");
    } catch (e) {
      if (e.status === 401) return showSignin("That API key is not valid. Check it and try again.");
      if (e.status === 400) return showSignin("This page is for tenant keys; operators use the operator API.");
      return showSignin("Could not reach runwatch (" + e.message + ").");
    }
    sessionStorage.setItem(KEY_STORE, key);
    $("#signin").hidden = true;
    $("#app").hidden = false;
    $("#session").hidden = false;
    $("#tenant").textContent = "Tenant: " + usage.tenant_id;
    selected = runFromUrl || null;
    await refresh(usage);
    clearInterval(timer);
    timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  }

  // ---- summary and run list ----------------------------------------------------------
  function tile(label, value, hint, extra) {
    return el("div", { class: "tile" },
      el("div", { class: "label", text: label }),
      el("div", { class: "value", text: value }),
      hint ? el("div", { class: "hint", text: hint }) : null,
      extra || null);
  }
  function renderSummary(u) {
    const pools = u.gpu_seconds_by_pool || {};
    const hours = (s) => (s || 0) / 3600;
    const total = Object.values(pools).reduce((a, b) => a + b, 0);
    const chips = el("div", { class: "chips" },
      Object.entries(u.runs_by_state || {}).sort().map(([s, n]) =>
        el("span", { class: "chip", text: `${STATE_LABEL[s] || s} ${n}` })));
    $("#summary").replaceChildren(
      tile("Runs", fmtInt(u.runs), null, chips),
      tile("Spend so far", fmtUsd(u.spend_usd), "all runs, list prices"),
      tile("GPU hours", hours(total).toFixed(1),
        `trainer ${hours(pools.trainer).toFixed(1)} · rollout ${hours(pools.rollout_fleet).toFixed(1)}`),
      tile("Device hours billed", hours(Object.values(u.device_seconds_by_kind || {})
        .reduce((a, b) => a + b, 0)).toFixed(2),
        Object.entries(u.device_seconds_by_kind || {}).sort()
          .map(([k, s]) => `${k} ${hours(s).toFixed(2)}`).join(" · ") || "none yet"),
      tile("Committed steps", fmtInt(u.committed_steps),
        u.tokens_trained || u.tokens_generated
          ? `${fmtCompact(u.tokens_trained)} tokens trained · ${fmtCompact(u.tokens_generated)} generated`
          : "optimizer steps committed"),
      tile("Cost per step", u.cost_per_step_usd === null ? "–" : fmtUsd(u.cost_per_step_usd),
        "spend ÷ committed optimizer steps"));
  }
  function renderRuns(runs) {
    const body = $("#runs tbody");
    $("#runs-count").textContent = runs.length === 1 ? "1 run" : `${runs.length} runs`;
    if (!runs.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "empty", text: "No runs yet." })));
      return;
    }
    // newest first for the reader; the API pages oldest first
    const rows = [...runs].reverse().map((r) => {
      const reason = el("div", { class: "text", title: r.reason || "" });
      if (r.failure_class) reason.append(el("span", { class: "chip class", text: CLASS_LABEL[r.failure_class] || r.failure_class }), " ");
      reason.append(r.reason || "—");
      return el("tr",
        {
          "data-run-id": r.run_id,
          "data-state": r.state || "SUBMITTED",
          class: r.run_id === selected ? "selected" : null,
          tabindex: 0,
          onclick: () => select(r.run_id),
          onkeydown: (e) => { if (e.key === "Enter") select(r.run_id); },
        },
        el("td", { class: "run mono", text: r.run_id }),
        el("td", {}, stateBadge(r.state)),
        el("td", { class: "reason" }, reason),
        el("td", { class: "num", text: r.last_step === null ? "–" : fmtInt(r.last_step) }),
        el("td", { class: "num", text: fmtUsd(r.spend_usd) }),
        el("td", { class: "updated", title: fmtTime(r.updated_ts), text: fmtAgo(r.updated_ts) }));
    });
    body.replaceChildren(...rows);
  }
  async function refresh(usage) {
    const [u, runs] = await Promise.all([usage ? usage : api("/v1/usage"), allRuns()]);
    renderSummary(u);
    renderRuns(runs);
    $("#refreshed").textContent = "Updated " + new Date().toLocaleTimeString("en-GB");
    if (selected) await loadDetail(selected, true);
  }
  function select(runId) {
    selected = runId;
    setRunInUrl(runId);
    for (const tr of document.querySelectorAll("#runs tbody tr")) {
      tr.classList.toggle("selected", tr.getAttribute("data-run-id") === runId);
    }
    loadDetail(runId, false).then(() => {
      $("#detail").scrollIntoView({ behavior: "smooth", block: "start" });
    });
  }

  // ---- run detail ---------------------------------------------------------------------
  async function loadDetail(runId, quiet) {
    const seq = ++loadSeq;
    const detail = $("#detail");
    detail.hidden = false;
    if (!quiet) {
      detail.removeAttribute("data-run-id");
      detail.replaceChildren(el("div", { class: "notice", text: "Loading " + runId + "…" }));
    }
    let run, charts, alerts;
    try {
      [run, charts, alerts] = await Promise.all([
        api(`/v1/runs/${encodeURIComponent(runId)}`),
        allCharts(runId),
        api(`/dashboard/api/runs/${encodeURIComponent(runId)}/alerts`),
      ]);
    } catch (e) {
      if (seq !== loadSeq) return;
      if (e.status === 401) return showSignin("Your API key is no longer valid.");
      detail.removeAttribute("data-run-id");
      detail.replaceChildren(e.status === 404
        ? el("div", { class: "notice" }, el("strong", { text: "Run not found" }),
          "There is no run with this id among your runs.")
        : el("div", { class: "notice" }, el("strong", { text: "Could not load the run" }), e.message));
      return;
    }
    if (seq !== loadSeq) return; // a newer selection won
    renderDetail(run, charts, alerts.items);
  }

  // ---- commands: resume / cancel (the trainer answers at its next step boundary) -------
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
  function runActions(run) {
    if (TERMINAL.has(run.state)) return null;
    const status = el("span", { class: "action-status muted", role: "status" });
    const buttons = [];
    if (run.state === "PAUSED_BY_GATE") {
      buttons.push(el("button", {
        type: "button", class: "btn primary", "data-action": "resume", text: "Resume",
        onclick: () => act(run.run_id, "resume", status, buttons),
      }));
    }
    const cancel = el("button", {
      type: "button", class: "btn danger", "data-action": "cancel", text: "Cancel run",
      onclick: () => {
        if (cancel.getAttribute("data-armed") !== "1") {  // a second click confirms
          cancel.setAttribute("data-armed", "1");
          cancel.textContent = "Confirm cancel";
          return;
        }
        act(run.run_id, "cancel", status, buttons);
      },
    });
    buttons.push(cancel);
    return el("div", { class: "actions" }, ...buttons, status);
  }
  async function act(runId, action, status, buttons) {
    for (const b of buttons) b.disabled = true;
    status.textContent = action === "resume" ? "Resume requested…" : "Cancel requested…";
    try {
      await apiPost(`/v1/runs/${encodeURIComponent(runId)}/${action}`, {});
    } catch (e) {
      if (e.status === 401) return showSignin("Your API key is no longer valid.");
      status.textContent = "Refused: " + (e.message || "HTTP " + e.status);
      for (const b of buttons) b.disabled = false;
      return;
    }
    status.textContent = action === "resume"
      ? "Resume requested: the run continues at its next step."
      : "Cancel requested: the run stops at its next step.";
    // follow the run closely until the trainer has answered (the state moves)
    const before = (await api(`/v1/runs/${encodeURIComponent(runId)}`)).state;
    for (let i = 0; i < 60 && selected === runId; i++) {
      await new Promise((r) => setTimeout(r, 1000));
      const now = (await api(`/v1/runs/${encodeURIComponent(runId)}`)).state;
      if (now !== before || i === 59) {
        await refresh();
        return;
      }
    }
  }

  function renderDetail(run, charts, alerts) {
    const detail = $("#detail");
    const u = run.usage || {};
    const head = el("div", { class: "head" },
      el("div", {},
        el("div", { class: "title" }, el("h2", { class: "mono", text: run.run_id }), stateBadge(run.state)),
        el("div", { class: "facts" },
          el("span", {}, "Algorithm ", el("b", { text: run.algorithm || "–" })),
          el("span", {}, "Step ", el("b", { text: run.last_step === null ? "–" : fmtInt(run.last_step) })),
          el("span", {}, "Spend so far ", el("b", { text: fmtUsd(run.spend_usd) })),
          el("span", {}, "Cost per step ", el("b", { text: u.cost_per_step_usd == null ? "–" : fmtUsd(u.cost_per_step_usd) })),
          u.tokens_trained ? el("span", {}, "Tokens trained ", el("b", { text: fmtCompact(u.tokens_trained) })) : null,
          el("span", { title: fmtTime(run.updated_ts) }, "Updated ", el("b", { text: fmtAgo(run.updated_ts) })))),
      el("button", { type: "button", class: "btn link", onclick: closeDetail, text: "Close" }));
    const why = el("div", { class: "why " + (run.state || "") },
      el("strong", { text: (STATE_LABEL[run.state] || "Submitted") + ": " }), run.reason || "no reason given");
    let failure = null;
    if (run.failure) {
      const f = run.failure;
      failure = el("div", { class: "failure" },
        el("h3", { text: "Failure class: " + (CLASS_LABEL[f.failure_class] || f.failure_class) }),
        el("p", { text: f.message }),
        f.examples.length ? el("div", { class: "muted", text: "Examples of failing inputs" }) : null,
        f.examples.length ? el("ul", {}, f.examples.map((x) => el("li", { text: x }))) : null);
    }
    const markers = alerts.filter((a) => a.fired_step !== null);
    // one step axis for all four charts, so a step lines up across them
    let x1 = run.last_step || 0;
    for (const c of CHARTS) for (const p of charts[c.key] || []) x1 = Math.max(x1, p.step);
    for (const m of markers) x1 = Math.max(x1, m.fired_step);
    const chartGrid = el("div", { class: "charts" },
      CHARTS.map((c) => chart(c, (charts[c.key] || []), markers, [0, x1])));
    const alertList = el("ul", { class: "alerts", id: "alerts" },
      alerts.length ? [...alerts].reverse().map(alertItem)
        : el("li", { class: "none", text: "No health alerts on this run." }));
    const history = el("ul", { class: "history" },
      (run.transitions || []).length ? [...run.transitions].reverse().map((t) => el("li", {},
        stateBadge(t.to_state),
        el("span", { class: "when", title: fmtTime(t.ts), text: (t.step !== null ? `step ${fmtInt(t.step)} · ` : "") + fmtTime(t.ts) }),
        t.reason ? el("div", { class: "reason", text: t.reason }) : null))
        : el("li", { class: "none", text: "No state changes yet." }));
    const activeCount = alerts.filter((a) => a.active).length;
    const sameText = failure && run.failure.message === run.reason;
    detail.replaceChildren(
      ...[head, runActions(run), sameText ? null : why, failure].filter(Boolean),
      el("div", { class: "section-title" }, el("h3", { text: "Training health" }),
        el("span", { class: "muted", text: "dashed lines mark the steps where alerts fired" })),
      chartGrid,
      el("div", { class: "lower" },
        el("div", {},
          el("div", { class: "section-title" }, el("h3", { text: "Alerts" }),
            el("span", { class: "muted", text: alerts.length ? `${alerts.length} total · ${activeCount} active` : "" })),
          alertList),
        el("div", {},
          el("div", { class: "section-title" }, el("h3", { text: "State history" })),
          history)));
    detail.setAttribute("data-run-id", run.run_id);
  }
  function alertItem(a) {
    const when = a.fired_step !== null ? `step ${fmtInt(a.fired_step)}` : "";
    const win = a.window_start !== null && a.window_end !== null ? ` (window ${a.window_start}–${a.window_end})` : "";
    return el("li", { "data-detector": a.detector, "data-severity": a.severity },
      el("div", { class: "row1" },
        el("span", { class: "sev " + a.severity, title: a.severity }),
        el("span", { class: "name", text: a.title }),
        el("span", { class: "status " + (a.active ? "active" : "resolved"), text: a.active ? "active" : "resolved" }),
        el("span", { class: "when", title: fmtTime(a.fired_ts), text: when + win })),
      el("div", { class: "reason", text: a.reason }),
      a.first_response ? el("div", { class: "advice", text: "What to check: " + a.first_response } ) : null,
      !a.active && a.resolved_reason ? el("div", { class: "advice", text: "Resolved: " + a.resolved_reason }) : null);
  }
  function closeDetail() {
    selected = null;
    loadSeq++;
    setRunInUrl(null);
    $("#detail").hidden = true;
    $("#detail").replaceChildren();
    for (const tr of document.querySelectorAll("#runs tbody tr.selected")) tr.classList.remove("selected");
  }

  // ---- SVG line chart -----------------------------------------------------------------
  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) {
      const pad = Math.abs(lo) * 0.1 || 1;
      lo -= pad;
      hi += pad;
    }
    const raw = (hi - lo) / Math.max(1, n);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const start = Math.floor(lo / step) * step;
    const end = Math.ceil(hi / step) * step;
    const ticks = [];
    for (let v = start; v <= end + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
    return { lo: start, hi: end, ticks };
  }
  /** Keep the shape of long series: min and max of each pixel column (in step order). */
  function thin(points, columns) {
    if (points.length <= columns * 2) return points;
    const out = [];
    const first = points[0].step;
    const span = points[points.length - 1].step - first || 1;
    let bucket = -1, lo = null, hi = null;
    const flush = () => {
      if (lo === null) return;
      if (lo === hi) out.push(lo);
      else if (lo.step < hi.step) out.push(lo, hi);
      else out.push(hi, lo);
    };
    for (const p of points) {
      const b = Math.floor(((p.step - first) / span) * columns);
      if (b !== bucket) {
        flush();
        bucket = b;
        lo = hi = p;
      } else {
        if (p.value < lo.value) lo = p;
        if (p.value > hi.value) hi = p;
      }
    }
    flush();
    return out;
  }
  function chart(spec, rawPoints, markers, domain) {
    const pts = rawPoints.filter((p) => p.value !== null && Number.isFinite(p.value));
    const last = pts.length ? pts[pts.length - 1] : null;
    const readout = el("span", { class: "readout" });
    const box = el("div", { class: "chart " + spec.metric, "data-metric": spec.metric, "data-points": String(pts.length) },
      el("div", { class: "chart-head" },
        el("h3", { text: spec.title }),
        readout,
        el("span", { class: "latest", title: last ? `latest, step ${last.step}` : "", text: last ? spec.fmt(last.value) : "–" })),
      el("div", { class: "sub", text: spec.sub }));
    if (!pts.length) {
      box.append(el("div", { class: "nodata", text: "No data reported yet." }));
      return box;
    }
    const W = 560, H = 190, L = 52, R = 12, T = 12, B = 26;
    const pw = W - L - R, ph = H - T - B;
    const x0 = Math.min(domain[0], pts[0].step);
    let x1 = Math.max(domain[1], last.step);
    if (x1 <= x0) x1 = x0 + 1;
    let vmin = Math.min(...pts.map((p) => p.value)), vmax = Math.max(...pts.map((p) => p.value));
    if (spec.zero) vmin = Math.min(0, vmin);
    const yt = niceTicks(vmin, vmax, 4);
    const xt = niceTicks(x0, x1, 6);
    const sx = (s) => L + ((s - x0) / (x1 - x0)) * pw;
    const sy = (v) => T + ph - ((v - yt.lo) / (yt.hi - yt.lo)) * ph;
    const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${spec.title} by training step` });
    for (const v of yt.ticks) {
      g.append(svg("line", { class: "gridline", x1: L, x2: W - R, y1: sy(v), y2: sy(v) }),
        svg("text", { x: L - 6, y: sy(v) + 3.5, "text-anchor": "end", text: spec.fmt(v) }));
    }
    for (const s of xt.ticks) {
      if (s < x0 || s > x1) continue;
      g.append(svg("line", { class: "axis", x1: sx(s), x2: sx(s), y1: T + ph, y2: T + ph + 4 }),
        svg("text", { x: sx(s), y: H - 8, "text-anchor": "middle", text: fmtInt(s) }));
    }
    g.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: T + ph, y2: T + ph }));
    const drawn = thin(pts, pw);
    const d = drawn.map((p, i) => `${i ? "L" : "M"}${sx(p.step).toFixed(1)},${sy(p.value).toFixed(1)}`).join("");
    if (spec.area) {
      g.append(svg("path", { class: "area", d: `${d}L${sx(last.step).toFixed(1)},${sy(yt.lo)}L${sx(pts[0].step).toFixed(1)},${sy(yt.lo)}Z` }));
    }
    g.append(svg("path", { class: "series", d }));
    if (spec.dots && pts.length <= 120) {
      for (const p of pts) g.append(svg("circle", { class: "dot", cx: sx(p.step), cy: sy(p.value), r: 2.6 }));
    }
    for (const m of markers) {
      const x = sx(m.fired_step);
      g.append(svg("g", { class: "alert-marker " + m.severity },
        svg("title", { text: `${m.title} at step ${m.fired_step}` }),
        svg("line", { x1: x, x2: x, y1: T, y2: T + ph }),
        svg("path", { d: `M${x - 4},${T - 6}L${x + 4},${T - 6}L${x},${T}Z` })));
    }
    // hover readout: nearest point to the cursor's step
    const guide = svg("line", { y1: T, y2: T + ph });
    const dot = svg("circle", { r: 3.5 });
    const hover = svg("g", { class: "hover", visibility: "hidden" }, guide, dot);
    g.append(hover);
    g.append(svg("rect", { x: L, y: T, width: pw, height: ph, fill: "transparent" }));
    g.addEventListener("mousemove", (e) => {
      const r = g.getBoundingClientRect();
      const step = x0 + (((e.clientX - r.left) * (W / r.width) - L) / pw) * (x1 - x0);
      let lo = 0, hi = pts.length - 1;
      while (hi - lo > 1) {
        const mid = (lo + hi) >> 1;
        if (pts[mid].step < step) lo = mid; else hi = mid;
      }
      const p = Math.abs(pts[lo].step - step) <= Math.abs(pts[hi].step - step) ? pts[lo] : pts[hi];
      const x = sx(p.step);
      guide.setAttribute("x1", x);
      guide.setAttribute("x2", x);
      dot.setAttribute("cx", x);
      dot.setAttribute("cy", sy(p.value));
      hover.setAttribute("visibility", "visible");
      readout.textContent = `step ${fmtInt(p.step)}: ${spec.fmt(p.value)}`;
    });
    g.addEventListener("mouseleave", () => {
      hover.setAttribute("visibility", "hidden");
      readout.textContent = "";
    });
    box.append(g);
    return box;
  }

  // ---- start --------------------------------------------------------------------------
  function start() {
    const run = readFragment();
    $("#signin form").addEventListener("submit", (e) => {
      e.preventDefault();
      const key = $("#signin input[name=key]").value.trim();
      if (!key) return showSignin("Enter your API key.");
      $("#signin input[name=key]").value = "";
      signIn(key, selected);
    });
    $("#signout").addEventListener("click", () => {
      closeDetail();
      showSignin("");
    });
    $("#refresh").addEventListener("click", () => refresh().catch((e) => {
      if (e.status === 401) showSignin("Your API key is no longer valid.");
    }));
    window.addEventListener("popstate", () => {
      const id = new URLSearchParams(location.hash.replace(/^#/, "")).get("run");
      if (!apiKey) return;
      if (id) select(id); else closeDetail();
    });
    const key = sessionStorage.getItem(KEY_STORE);
    selected = run;
    if (key) signIn(key, run);
    else showSignin("");
  }
  start();
})();
