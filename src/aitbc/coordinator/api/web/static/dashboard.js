// The aitbc dashboard: polls the coordinator's public read-only JSON
// (/v1/dashboard/runs, /v1/dashboard/runs/{id}) and draws it. Everything shown is
// put in the page as text (textContent, attribute values), never parsed as markup:
// a worker id, a run's error or a job's end reason is data, whoever wrote it.
"use strict";

(() => {
  const POLL_MS = 1500;
  // The server's path prefix ("" or e.g. "/aitbc" behind a proxy), written by the server
  // into <html data-root>: the JSON, the run pages and their links live under it.
  const ROOT = document.documentElement.dataset.root || "";
  const API = `${ROOT}/v1/dashboard`;
  const $ = (id) => document.getElementById(id);

  // --- DOM helpers: text only ----------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "title") node.title = String(value);
      else if (key === "href") node.href = value;
      else node.setAttribute(key, String(value)); // data-*: an attribute value, not markup
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function fill(dl, pairs) {
    const items = [];
    for (const [name, value, title] of pairs) {
      items.push(el("div", {}, el("dt", {}, name), el("dd", { title }, value)));
    }
    dl.replaceChildren(...items);
  }

  // --- formats ---------------------------------------------------------------------------

  const num = (x, digits = 4) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
  const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);
  const ait = (micro) => `${(micro / 1e6).toFixed(6).replace(/\.?0+$/, "")} AIT`;
  const shortId = (id) => (id.length > 18 ? `${id.slice(0, 10)}…${id.slice(-6)}` : id);

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  const unitOf = (n) => Math.min(UNITS.length - 1, n >= 1 ? Math.floor(Math.log2(n) / 10) : 0);

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const i = unitOf(n);
    return `${(n / 1024 ** i).toFixed(i ? 1 : 0)} ${UNITS[i]}`;
  }

  // An axis's byte labels: all in the largest tick's unit, with as many decimals as keep
  // them apart (ticks 5.40, 5.42 and 5.44 MiB all read "5.4 MiB" at one decimal).
  function byteTicks(ticks) {
    const i = unitOf(Math.max(0, ...ticks.map(Math.abs)));
    for (let digits = i ? 1 : 0; ; digits += 1) {
      const labels = ticks.map((t) => `${(t / 1024 ** i).toFixed(digits)} ${UNITS[i]}`);
      if (new Set(labels).size === labels.length || digits >= 6) return labels;
    }
  }

  function ago(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    seconds = Math.max(0, seconds); // a heartbeat the coordinator counted after it read its clock
    return seconds < 60 ? `${seconds.toFixed(1)} s ago` : `${Math.round(seconds / 60)} min ago`;
  }

  function duration(run) {
    if (!run.started_at) return "–";
    const end = run.finished_at || run.time;
    return `${(end - run.started_at).toFixed(1)} s`;
  }

  // --- routing: / (the newest run) or /runs/{id} --------------------------------------------

  function wantedRun() {
    const path = window.location.pathname;
    const m = (path.startsWith(ROOT) ? path.slice(ROOT.length) : path).match(/^\/runs\/([^/]+)\/?$/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  let selected = wantedRun();

  function open(id) {
    selected = id;
    window.history.pushState({}, "", `${ROOT}/runs/${encodeURIComponent(id)}`);
    tick();
  }

  window.addEventListener("popstate", () => {
    selected = wantedRun();
    tick();
  });

  // --- the runs list ---------------------------------------------------------------------------

  function renderRuns(page, current) {
    $("runs-count").textContent = `(${page.count})`;
    $("runs-empty").hidden = page.count > 0;
    const items = page.data.map((r) => {
      const link = el(
        "a",
        { href: `${ROOT}/runs/${encodeURIComponent(r.training_id)}`, "data-run-id": r.training_id },
        el("span", { class: "run-id" }, r.training_id),
        el("span", { class: `badge ${r.status}` }, r.status),
        el("span", { class: "muted" }, `round ${r.round}/${r.rounds ?? "–"} · ${r.model_type}`),
      );
      link.addEventListener("click", (event) => {
        event.preventDefault();
        open(r.training_id);
      });
      return el("li", { class: r.training_id === current ? "current" : "" }, link);
    });
    $("runs").replaceChildren(...items);
  }

  // --- charts (uPlot, vendored) --------------------------------------------------------------

  const charts = {};
  let chartsOf = null;

  const COLORS = { val: "#2563eb", train: "#ea580c", acc: "#16a34a", up: "#9333ea", down: "#0891b2" };

  // A language model (it counts tokens) has no accuracy: its second chart is perplexity.
  const isLanguage = (run) => run.tokens_seen != null;

  function chartSpec(id, language) {
    const line = (label, stroke, fmt) => ({ label, stroke, width: 2, spanGaps: true, points: { size: 5 }, value: fmt });
    const round = { label: "round", value: (u, v) => (v === null ? "–" : v) };
    if (id === "chart-loss") {
      return [round, line("validation", COLORS.val, (u, v) => num(v)), line("training", COLORS.train, (u, v) => num(v))];
    }
    if (id === "chart-accuracy" && language) return [round, line("validation", COLORS.acc, (u, v) => num(v, 2))];
    if (id === "chart-accuracy") {
      return [round, line("validation", COLORS.acc, (u, v) => pct(v)), line("training", COLORS.train, (u, v) => pct(v))];
    }
    return [round, line("up", COLORS.up, (u, v) => bytes(v)), line("down", COLORS.down, (u, v) => bytes(v))];
  }

  function chartData(id, curves, language) {
    const x = curves.map((c) => c.round);
    if (id === "chart-accuracy" && language) return [x, curves.map((c) => c.val_perplexity)];
    if (id === "chart-loss") return [x, curves.map((c) => c.val_loss), curves.map((c) => c.train_loss)];
    if (id === "chart-accuracy") return [x, curves.map((c) => c.val_accuracy), curves.map((c) => c.train_accuracy)];
    return [x, curves.map((c) => c.bytes_up), curves.map((c) => c.bytes_down)];
  }

  window.aitbcFormats = Object.freeze({ bytes, byteTicks }); // for the browser test

  const ROUND_AXIS = { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], values: (u, ticks) => ticks.map(String) };

  function size(node) {
    return { width: Math.max(200, node.clientWidth), height: 170 };
  }

  function drawCharts(run) {
    const kind = `${run.training_id} ${isLanguage(run)}`; // a run's data names its task once uploaded
    if (chartsOf !== kind) {
      for (const u of Object.values(charts)) u.destroy();
      for (const key of Object.keys(charts)) delete charts[key];
      chartsOf = kind;
    }
    for (const id of ["chart-loss", "chart-accuracy", "chart-bytes"]) {
      const node = $(id);
      const data = chartData(id, run.curves, isLanguage(run));
      node.dataset.points = String(run.curves.length);
      if (typeof window.uPlot !== "function") continue; // the library failed to load: the numbers still show
      if (!charts[id]) {
        const y = id === "chart-bytes" ? { size: 84, values: (u, ticks) => byteTicks(ticks) } : { size: 48 };
        charts[id] = new window.uPlot(
          {
            ...size(node),
            series: chartSpec(id, isLanguage(run)),
            axes: [ROUND_AXIS, y],
            scales: { x: { time: false } },
            legend: { live: false },
          },
          data,
          node,
        );
      } else {
        charts[id].setData(data);
      }
    }
    $("points").textContent = String(run.curves.length);
    $("quality-caption").textContent = isLanguage(run) ? "Validation perplexity by round" : "Accuracy by round";
    // a long run's curves hold every n-th round (the coordinator bounds one poll's size)
    $("thinned").textContent =
      run.curve_every > 1 ? `: 1 in ${run.curve_every} of ${run.rounds_completed.toLocaleString("en")} closed` : "";
    $("bytes-total").textContent = `(total ${bytes(run.bytes_up)} up, ${bytes(run.bytes_down)} down)`;
  }

  window.addEventListener("resize", () => {
    for (const [id, u] of Object.entries(charts)) u.setSize(size($(id)));
  });

  // --- one run ---------------------------------------------------------------------------------

  function renderWorkers(workers) {
    $("workers-count").textContent = `(${workers.length})`;
    const rows = workers.map((w) => {
      const status = el("td", {}, el("span", { class: `badge ${w.status || ""}` }, w.status || "–"));
      if (!["working", w.status].includes(w.contract_status)) {
        status.append(" ", el("span", { class: "muted" }, w.contract_status));
      }
      if (w.end_reason) status.append(el("div", { class: "reason" }, w.end_reason));
      const progress = w.progress ?? 0;
      const bar = el("div", { class: "bar" }, el("span", { "data-progress": Math.round(progress) }));
      bar.firstChild.style.width = `${Math.min(100, Math.max(0, progress))}%`;
      const flags = el("td", { class: "flags" });
      for (const f of w.flags) flags.append(el("span", { class: "flag" }, f), " ");
      return el(
        "tr",
        { "data-worker-id": w.worker_id, class: w.flags.length ? "flagged" : "" },
        el("td", { class: "mono", title: w.worker_id }, shortId(w.worker_id)),
        el("td", {}, w.gpu_type || "–"),
        status,
        el("td", { class: "progress" }, bar, el("span", {}, `${progress.toFixed(0)}%`)),
        el("td", { class: "num" }, num(w.loss)),
        el("td", { class: "num" }, w.score === null ? "–" : num(w.score, 2)),
        el("td", { class: "num", title: `${w.rounds_accepted}/${w.rounds_scored} rounds accepted` }, ait(w.paid_micro)),
        flags,
        el("td", { class: "muted seen" }, ago(w.last_heartbeat_age)),
      );
    });
    $("workers").tBodies[0].replaceChildren(...rows);
  }

  // the size measured when the data was read; the owner's declaration only beside it
  function dataSize(run) {
    if (run.data_bytes === null) return `${run.dataset_size} declared`;
    const parts = [bytes(run.data_bytes)];
    const count = (n, what) => `${n.toLocaleString("en")} ${what}${n === 1 ? "" : "s"}`;
    if (run.data_documents !== null) parts.push(count(run.data_documents, "document"));
    if (run.data_tokens !== null) parts.push(count(run.data_tokens, "token"));
    return `${parts.join(" · ")} (declared ${run.dataset_size})`;
  }

  // an EVM run's settlement transactions: hash and confirmations (empty on the coordinator's own ledger)
  function renderChainTxs(txs) {
    $("chain-txs").hidden = txs.length === 0;
    const rows = txs.map((t) =>
      el(
        "tr",
        { "data-tx-hash": t.tx_hash || "" },
        el("td", {}, t.kind === "finalize" ? "finalize" : `round ${t.round}`),
        el("td", { class: "mono", title: t.tx_hash || "" }, t.tx_hash ? shortId(t.tx_hash) : "–"),
        el("td", {}, el("span", { class: `badge ${t.status}` }, t.status)),
        el("td", { class: "num" }, String(t.confirmations)),
      ),
    );
    $("chain-txs").tBodies[0].replaceChildren(...rows);
  }

  function renderRun(run) {
    $("notice").hidden = true;
    $("run").hidden = false;
    $("run-title").textContent = run.training_id;
    $("run-status").textContent = run.status;
    $("run-status").className = `badge ${run.status}`;
    $("run-round").textContent = `round ${run.round} of ${run.rounds ?? "–"} · ${run.rounds_completed} closed`;
    $("run-error").hidden = !run.error;
    $("run-error").textContent = run.error || "";
    fill($("run-facts"), [
      ["model", `${run.model_type}${run.parameters ? ` · ${run.parameters.toLocaleString("en")} parameters` : ""}`],
      ["dataset", dataSize(run)],
      ["workers", `${run.workers.length} hired / ${run.target_workers} wanted`],
      ["aggregator", run.aggregator || "–"],
      ["validation loss", `${num(run.initial_val_loss)} → ${num(run.val_loss)}`],
      // a language model's perplexity and tokens trained on; a classifier's accuracy
      ...(run.val_perplexity != null ? [["perplexity", num(run.val_perplexity)]] : []),
      ...(run.tokens_seen != null ? [["tokens seen", run.tokens_seen.toLocaleString("en")]] : []),
      ...(run.tokens_seen == null ? [["accuracy", pct(run.val_accuracy)]] : []),
      ["time", duration(run)],
      ["owner", shortId(run.owner), run.owner],
    ]);
    drawCharts(run);
    renderWorkers(run.workers);
    const p = run.payments;
    fill($("payments"), [
      ["escrowed", `${p.escrowed} AIT`],
      ["in escrow", `${p.escrow_balance} AIT`],
      ["paid", ait(p.paid_micro)],
      ["slashed", ait(p.slashed_micro)],
      ["settled", `round ${p.settled_round}${p.finalized ? " · finalized" : ""}`],
    ]);
    renderChainTxs(p.chain_txs || []);
    fill($("ledger"), [
      ["network", run.ledger.network],
      ["entries", String(run.ledger.entries)],
      ["head", run.ledger.head || "–", run.ledger.head],
    ]);
  }

  function notice(text) {
    $("run").hidden = true;
    $("notice").hidden = false;
    $("notice").textContent = text;
  }

  // --- polling -------------------------------------------------------------------------------

  // A coordinator that stops answering without closing the connection (a hung process, a
  // proxy, a dropped network) would leave a poll waiting forever and the page still saying
  // "live": each request gives up after REPLY_MS and the page says it is not updating.
  const REPLY_MS = 10000;

  async function getJson(path) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), REPLY_MS);
    try {
      const reply = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store", signal: abort.signal });
      let body = null;
      try {
        body = await reply.json();
      } catch {
        // not JSON (a proxy's error page): the status says enough
      }
      if (!reply.ok || body === null) {
        throw Object.assign(new Error((body && body.detail) || `HTTP ${reply.status}`), { status: reply.status });
      }
      return body;
    } catch (e) {
      if (e.name === "AbortError") throw new Error(`no reply in ${REPLY_MS / 1000} s`);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  let timer = null;
  let busy = false;
  let again = false;

  async function tick() {
    if (busy) {
      again = true; // a click while a poll is in flight: poll again once it is done
      return;
    }
    busy = true;
    clearTimeout(timer);
    try {
      const page = await getJson(`${API}/runs`);
      const id = selected || (page.data[0] && page.data[0].training_id);
      renderRuns(page, id);
      if (id) {
        try {
          renderRun(await getJson(`${API}/runs/${encodeURIComponent(id)}`));
        } catch (e) {
          if (e.status !== 404) throw e;
          notice(e.message);
        }
      } else {
        notice("No runs yet.");
      }
      $("live").textContent = `live · updated ${new Date().toLocaleTimeString("en-GB")}`;
      $("live").className = "live ok";
    } catch (e) {
      $("live").textContent = `not updating: ${e.message}`;
      $("live").className = "live down";
    }
    busy = false;
    timer = setTimeout(tick, again ? 0 : POLL_MS);
    again = false;
  }

  tick();
})();
