"""The web UI's live charts page (`/llm/charts`): static HTML and JavaScript, no server data inside.

It loads plotly.js from `plotly.min.js` and polls `charts.json` every POLL_MS, both relative to its own URL, so it
works under `--web-base-path` and offline. Text from the server (the model name, a scrape's error) is set with
`textContent`, never as markup; the charts' own labels are numbers and fixed words only.
"""

POLL_MS = 2000

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>LLM live charts</title>
<link rel="icon" href="data:,">
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 12px 18px; color: #222; }
  h1 { font-size: 20px; margin: 0 0 4px 0; }
  #status { font-size: 13px; color: #555; margin-bottom: 8px; }
  #status span { margin-right: 14px; }
  #error { color: #b00020; }
  .grid { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
  .chart { height: 360px; border: 1px solid #e4e4e4; border-radius: 4px; }
  .note { font-size: 12px; color: #666; margin-top: 8px; }
  a { color: #1565c0; }
</style>
<script src="plotly.min.js"></script>
</head>
<body>
<h1>LLM live charts <a href="../" style="font-size: 13px; font-weight: normal">back to the web UI</a></h1>
<div id="status">
  <span>state: <b id="state">-</b></span><span>elapsed: <b id="elapsed">-</b></span>
  <span>model: <b id="model">-</b></span><span id="scrapes"></span><span id="error"></span>
</div>
<div class="grid">
  <div id="tok" class="chart"></div>
  <div id="kv" class="chart"></div>
  <div id="ttft" class="chart"></div>
  <div id="tpot" class="chart"></div>
</div>
<div class="note" id="notes"></div>
<div class="note">Refreshed every __POLL_S__ s from <a href="charts.json">charts.json</a>. Times are seconds since
the run's first step began; grey: a step's warm-up (left out of its numbers); red: a suspect step (an outlier or
unstable). Lines: p95 of the requests that finished in each time bin (warm-ups included; none below 20 requests);
dashes: each step's own p95 (its measured requests, as in steps.csv).</div>
<script>
"use strict";
const POLL_MS = __POLL_MS__;
const CONFIG = {displaylogo: false, responsive: true};
const MARGIN = {l: 60, r: 60, t: 40, b: 45};

function stepLabel(s) {
  return s.rate_rps !== null ? s.rate_rps + " r/s" : s.users + " u";
}

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

// Step boundaries, warm-ups and suspect steps on a time axis.
function stepShapes(steps, elapsed) {
  const shapes = [], annotations = [];
  for (const s of steps) {
    const end = s.end === null ? elapsed : s.end;
    shapes.push({type: "line", xref: "x", yref: "paper", x0: s.start, x1: s.start, y0: 0, y1: 1,
                 line: {color: "#999", width: 1, dash: "dot"}});
    if (s.measure_start > s.start) {
      shapes.push({type: "rect", xref: "x", yref: "paper", x0: s.start, x1: Math.min(s.measure_start, end),
                   y0: 0, y1: 1, fillcolor: "#888", opacity: 0.12, line: {width: 0}, layer: "below"});
    }
    if (s.suspect) {
      shapes.push({type: "rect", xref: "x", yref: "paper", x0: s.measure_start, x1: end, y0: 0, y1: 1,
                   fillcolor: "#e53935", opacity: 0.12, line: {width: 0}, layer: "below"});
    }
    annotations.push({x: s.start, y: 1, xref: "x", yref: "paper", xanchor: "left", yanchor: "bottom",
                      text: stepLabel(s) + (s.suspect ? " (suspect)" : ""), showarrow: false,
                      font: {size: 10, color: s.suspect ? "#c62828" : "#666"}});
  }
  return {shapes, annotations};
}

// One step's p95 as a horizontal dash over its measured window (of the steps with few samples or not); null
// separates the steps.
function stepDashes(steps, key, elapsed, few) {
  const x = [], y = [];
  for (const s of steps) {
    const v = s[key];
    if (v === null || s.few_samples !== few) continue;
    x.push(s.measure_start, s.end === null ? elapsed : s.end, null);
    y.push(v * 1000, v * 1000, null);
  }
  return {x, y};
}

// A batch kind's run (e.g. embeddings: d.items names it): no tokens out, no TTFT, no TPOT; its items/s and E2E
// are drawn instead.
function isBatch(d) {
  return d.items !== undefined && d.items !== null;
}

function drawTok(d) {
  const emb = isBatch(d);
  const steps = d.steps.map(s => emb ? Object.assign({}, s, {aggregate_tok_s: s.items_per_s,
                                                              ci_low: s.items_ci_low, ci_high: s.items_ci_high}) : s);
  const unit = emb ? d.items.unit : "tok/s";
  const x = steps.map(s => "step " + s.step + ": " + stepLabel(s));
  const y = steps.map(s => s.aggregate_tok_s);
  const withCi = steps.map(s => s.ci_low !== null && s.ci_high !== null && s.aggregate_tok_s !== null);
  const trace = {
    type: "scatter", mode: "lines+markers", name: emb ? d.items.unit : "aggregate tok/s", x, y,
    line: {color: "#1e88e5"},
    marker: {size: 11,
             color: steps.map(s => s.suspect ? "#e53935" : "#1e88e5"),
             symbol: steps.map(s => s.suspect ? "x" : (s.running ? "circle-open" : "circle")),
             line: {width: 2, color: steps.map(s => s.suspect ? "#e53935" : "#1e88e5")}},
    text: steps.map(s => (s.running ? "so far" : "") + (s.suspect ? " suspect: " + s.suspect_why.join(", ") : "")
                          + (s.requests !== null ? " (" + s.requests + " requests)" : "")),
    hovertemplate: "%{x}<br>%{y:.1f} " + unit + " %{text}<extra></extra>",
  };
  if (withCi.some(Boolean)) {
    trace.error_y = {type: "data", symmetric: false, visible: true, color: "#555", thickness: 1.5, width: 6,
                     array: steps.map((s, i) => withCi[i] ? s.ci_high - s.aggregate_tok_s : NaN),
                     arrayminus: steps.map((s, i) => withCi[i] ? s.aggregate_tok_s - s.ci_low : NaN)};
  }
  const annotations = steps.filter(s => s.suspect).map(s => ({
    x: "step " + s.step + ": " + stepLabel(s), y: s.aggregate_tok_s, text: s.suspect_why.join(", "),
    showarrow: true, arrowhead: 0, ay: -28, font: {size: 11, color: "#c62828"}}));
  Plotly.react("tok", [trace], {
    title: {text: (emb ? d.items.label : "Aggregate tok/s") + " per step" + (d.has_ci ? " (95 % interval)" : ""),
            font: {size: 15}},
    margin: MARGIN, xaxis: {type: "category", title: {text: "step"}},
    yaxis: {title: {text: emb ? d.items.unit : "tokens/s"}, rangemode: "tozero"}, showlegend: false, annotations,
  }, CONFIG);
}

function drawLatency(id, d, key, title) {
  const lat = d.latency, elapsed = d.elapsed_s || 0;
  const dashes = stepDashes(d.steps, key, elapsed, false), fewDashes = stepDashes(d.steps, key, elapsed, true);
  const {shapes, annotations} = stepShapes(d.steps, elapsed);
  const traces = [
    {type: "scatter", mode: "lines+markers", name: "p95 per " + lat.bin_s + " s", x: lat.t,
     y: lat[key].map(v => v === null ? null : v * 1000), customdata: lat.n,
     hovertemplate: "%{x:.0f} s: %{y:.1f} ms (%{customdata} requests)<extra></extra>",
     line: {color: "#43a047", width: 1.5}, marker: {size: 4}},
    {type: "scatter", mode: "lines", name: "step p95", x: dashes.x, y: dashes.y,
     line: {color: "#fb8c00", width: 3, dash: "dash"}, hovertemplate: "step p95 %{y:.1f} ms<extra></extra>"},
    {type: "scatter", mode: "lines", name: "step p95 (few samples)", x: fewDashes.x, y: fewDashes.y,
     line: {color: "#fb8c00", width: 2, dash: "dot"},
     hovertemplate: "step p95 %{y:.1f} ms: too few requests to be exact<extra></extra>"},
  ];
  Plotly.react(id, traces, {
    title: {text: title, font: {size: 15}}, margin: MARGIN, shapes, annotations,
    xaxis: {title: {text: "s since the run's start"}, range: [0, Math.max(elapsed, 1)]},
    yaxis: {title: {text: "ms"}, rangemode: "tozero"}, legend: {orientation: "h", y: -0.22},
  }, CONFIG);
}

function drawServer(d) {
  const srv = d.server, elapsed = d.elapsed_s || 0;
  const {shapes, annotations} = stepShapes(d.steps, elapsed);
  const traces = srv === null ? [] : [
    // Markers too: a scrape between two failed ones has no line to draw, and a gap stays a gap.
    {type: "scatter", mode: "lines+markers", name: "KV cache %", x: srv.t, marker: {size: 3},
     y: srv.kv_cache_usage.map(v => v === null ? null : v * 100), line: {color: "#8e24aa", width: 2}},
    {type: "scatter", mode: "lines+markers", name: "waiting", x: srv.t, y: srv.waiting, yaxis: "y2",
     marker: {size: 3}, line: {color: "#e53935", width: 2}},
    {type: "scatter", mode: "lines+markers", name: "running", x: srv.t, y: srv.running, yaxis: "y2",
     marker: {size: 2}, line: {color: "#757575", width: 1, dash: "dot"}},
  ];
  const counts = srv === null ? [] : srv.waiting.concat(srv.running).filter(v => v !== null);
  const most = counts.length ? Math.max(...counts) : 0;
  Plotly.react("kv", traces, {
    title: {text: "Server: KV-cache usage and requests" + (srv === null ? " (not scraped)" : ""),
            font: {size: 15}},
    margin: MARGIN, shapes, annotations,
    xaxis: {title: {text: "s since the run's start"}, range: [0, Math.max(elapsed, 1)]},
    yaxis: {title: {text: "KV cache %"}, range: [0, 105]},
    yaxis2: {title: {text: "requests"}, overlaying: "y", side: "right", rangemode: "tozero",
             dtick: most <= 8 ? 1 : null, range: most <= 8 ? [0, Math.max(most, 1) * 1.05] : null},
    legend: {orientation: "h", y: -0.22},
  }, CONFIG);
}

function draw(d) {
  setText("state", d.state);
  setText("elapsed", d.elapsed_s === null ? "-" : Math.round(d.elapsed_s) + " s");
  setText("model", d.model || "-");
  const srv = d.server;
  setText("scrapes", srv === null ? "server: not scraped" :
          "scrapes: " + srv.scrapes + (srv.gaps ? " (" + srv.gaps + " failed)" : "") +
          (srv.catching_up ? ", reading earlier scrapes..." : ""));
  setText("error", srv !== null && srv.last_error ? "last scrape error: " + srv.last_error : "");
  const notes = [];
  if (!d.steps.length) notes.push("No run yet: start one from the web UI.");
  if (d.steps.length && !d.has_ci) notes.push("No intervals in this version's step table: points without error bars.");
  setText("notes", notes.join(" "));
  drawTok(d);
  drawServer(d);
  if (isBatch(d) && d.latency.e2e_p95_s !== undefined) {
    drawLatency("ttft", d, "e2e_p95_s", "E2E p95 over time (" + d.items.kind + ": send to the body's last byte)");
    drawLatency("tpot", d, "tpot_p95_s", "TPOT p95 over time (does not apply: " + d.items.kind + " does not stream)");
  } else {
    drawLatency("ttft", d, "ttft_p95_s", "TTFT p95 over time");
    drawLatency("tpot", d, "tpot_p95_s", "TPOT p95 over time");
  }
}

async function refresh() {
  try {
    const response = await fetch("charts.json", {cache: "no-store", credentials: "same-origin"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    draw(await response.json());
    window.llmChartsRefreshed = (window.llmChartsRefreshed || 0) + 1;
  } catch (e) {
    setText("error", "cannot refresh: " + e.message);
  } finally {
    setTimeout(refresh, POLL_MS);
  }
}
refresh();
</script>
</body>
</html>
""".replace("__POLL_MS__", str(POLL_MS)).replace("__POLL_S__", str(POLL_MS // 1000))
