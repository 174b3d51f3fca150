/* Time series charts of the detail pages (host, GPU, VM, my workstation), drawn with the
   vendored Plotly from the metrics API (/api/v1/gpus/<id>/metrics/, /api/v1/vms/<id>/metrics/).

   An element with data-series-url is a chart:
     data-series-url     the API URL with start, end, step (and metric); several URLs separated by
                         spaces draw one line each (named by data-series-labels, a JSON list)
     data-lines          JSON list of {metric, stat, name}: which series of the response to draw
     data-unit           y axis unit; data-scale divides every value (1024: MiB -> GiB);
                         data-ymax fixes the top of the axis (100 for percentages)
     data-limit          a horizontal line (e.g. the profile's frame buffer), labelled data-limit-label
     data-at             a moment to mark with a vertical line (a heatmap click-through)
     data-start/-end     the range asked for, named in the "no data" message
     data-empty-hint     what to check when there is no data (+ data-empty-link, data-empty-link-label)
   Each chart ends with data-state="ready", "empty" (every value null: a message in the chart box)
   or "error" (the API's message). Charts asking for the same URL share one request.

   An element with data-fb-split names a json_script element holding {segments: [{name, mib}],
   free_mib, total_mib}: the frame buffer split of a GPU, drawn as one stacked bar.

   Times are UTC: Plotly drops the "Z" of the API's ISO times and shows them as they are. */
(function () {
  "use strict";

  // Okabe-Ito: distinguishable with every common colour vision deficiency.
  const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
  const DASHES = ["solid", "dash", "dot", "dashdot"];
  const STAT_DASHES = { p95: "dash", max: "dot" };
  const requests = new Map();

  function fetchJson(url) {
    if (!requests.has(url)) {
      requests.set(url, fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(async (response) => {
          let body = null;
          try { body = await response.json(); } catch (_) { body = null; }
          if (!response.ok) { throw new Error(errorMessage(body, response)); }
          return body;
        }));
    }
    return requests.get(url);
  }

  function errorMessage(body, response) {
    if (body && typeof body === "object") {
      if (typeof body.detail === "string") { return body.detail; }
      const parts = Object.entries(body).map(([name, messages]) =>
        `${name}: ${Array.isArray(messages) ? messages.join(" ") : messages}`);
      if (parts.length) { return parts.join("; "); }
    }
    return `The server answered ${response.status} ${response.statusText}.`.trim();
  }

  function readable(iso) {
    return iso ? `${iso.replace("T", " ").slice(0, 16)} UTC` : "";
  }

  function json(value, fallback) {
    if (!value) { return fallback; }
    try { return JSON.parse(value); } catch (_) { return fallback; }
  }

  function message(el, state, title, detail, link) {
    el.replaceChildren();
    const box = document.createElement("div");
    box.className = `chart-message ${state}`;
    box.setAttribute("role", state === "error" ? "alert" : "status");
    const head = document.createElement("p");
    head.className = "chart-message-title";
    head.textContent = title;
    box.appendChild(head);
    if (detail) {
      const text = document.createElement("p");
      text.textContent = detail;
      if (link && link.url) {
        const a = document.createElement("a");
        a.href = link.url;
        a.textContent = link.label || link.url;
        text.append(" ", a);
      }
      box.appendChild(text);
    }
    el.appendChild(box);
    el.dataset.state = state;
  }

  function traceOf(body, line, name, scale, index) {
    const series = (body.series || {})[line.metric] || {};
    const t = series.t || [];
    const values = series[line.stat] || [];
    return {
      type: "scatter",
      mode: "lines",
      name: name,
      x: t,
      y: values.map((v) => (v === null || v === undefined ? null : v / scale)),
      connectgaps: false,
      // Colour and dash both tell lines apart: a p95 or peak drawn over the average stays readable.
      line: { color: COLOURS[index % COLOURS.length], width: line.stat === "avg" ? 2 : 1.5,
              dash: STAT_DASHES[line.stat] || DASHES[Math.floor(index / COLOURS.length) % DASHES.length] },
    };
  }

  function layoutOf(el, traces, at) {
    const unit = el.dataset.unit || "";
    const limit = el.dataset.limit ? parseFloat(el.dataset.limit) : null;
    const ymax = el.dataset.ymax ? parseFloat(el.dataset.ymax) : null;
    const shapes = [];
    const annotations = [];
    let top = 0;
    traces.forEach((trace) => trace.y.forEach((v) => { if (v !== null && v > top) { top = v; } }));
    if (limit !== null && !Number.isNaN(limit)) {
      shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: limit, y1: limit,
                    line: { color: "#b0282f", width: 2, dash: "dash" } });
      annotations.push({ xref: "paper", x: 0, xanchor: "left", yref: "y", y: limit, yanchor: "bottom",
                         text: el.dataset.limitLabel || `Limit ${limit}`, showarrow: false,
                         font: { color: "#b0282f", size: 11 } });
      top = Math.max(top, limit);
    }
    if (at) {
      shapes.push({ type: "line", xref: "x", x0: at, x1: at, yref: "paper", y0: 0, y1: 1,
                    line: { color: "#1d2330", width: 1.5, dash: "dot" } });
      annotations.push({ xref: "x", x: at, yref: "paper", y: 1, yanchor: "top", xanchor: "left", showarrow: false,
                         text: ` around ${readable(at).slice(11)}`, font: { size: 11 } });
    }
    const yaxis = { title: { text: unit }, rangemode: "tozero", zeroline: true, fixedrange: true };
    if (ymax !== null && top <= ymax) {
      yaxis.range = [0, ymax];
    } else if (top > 0) {
      yaxis.range = [0, top * 1.1];
    }
    const xaxis = { type: "date", title: { text: "UTC" } };
    if (el.dataset.start && el.dataset.end) { xaxis.range = [el.dataset.start, el.dataset.end]; }
    return {
      margin: { l: 56, r: 16, t: 40, b: 48 },
      hovermode: "x unified",
      showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.02, xanchor: "left", yanchor: "bottom" },
      xaxis: xaxis,
      yaxis: yaxis,
      shapes: shapes,
      annotations: annotations,
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 },
    };
  }

  function drawSeries(el) {
    const urls = (el.dataset.seriesUrl || "").trim().split(/\s+/).filter(Boolean);
    const labels = json(el.dataset.seriesLabels, []);
    const lines = json(el.dataset.lines, []);
    const scale = parseFloat(el.dataset.scale || "1") || 1;
    const at = el.dataset.at || "";
    el.dataset.state = "loading";
    if (!urls.length || !lines.length) {
      message(el, "error", "This chart is not set up: it names no series.", "");
      return Promise.resolve();
    }
    return Promise.all(urls.map(fetchJson)).then((bodies) => {
      const traces = [];
      bodies.forEach((body, i) => lines.forEach((line) => {
        const name = urls.length > 1
          ? `${labels[i] || `series ${i + 1}`}${lines.length > 1 ? ` ${line.name}` : ""}` : line.name;
        traces.push(traceOf(body, line, name, scale, traces.length));
      }));
      const hasData = traces.some((trace) => trace.y.some((v) => v !== null));
      if (!hasData) {
        const start = el.dataset.start || (bodies[0] && bodies[0].start);
        const end = el.dataset.end || (bodies[0] && bodies[0].end);
        message(el, "empty", `No data between ${readable(start)} and ${readable(end)}.`,
                el.dataset.emptyHint || "Check that the agent serving this host is running.",
                { url: el.dataset.emptyLink, label: el.dataset.emptyLinkLabel });
        return;
      }
      el.replaceChildren();
      return window.Plotly.newPlot(el, traces, layoutOf(el, traces, at),
                                   { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] })
        .then(() => { el.dataset.state = "ready"; });
    }).catch((error) => {
      message(el, "error", "The chart could not be loaded.", error && error.message ? error.message : String(error));
    });
  }

  function drawSplit(el) {
    const source = document.getElementById(el.dataset.fbSplit);
    const split = source ? json(source.textContent, null) : null;
    if (!split) {
      message(el, "error", "The frame buffer split could not be read.", "");
      return Promise.resolve();
    }
    const traces = split.segments.map((segment, i) => ({
      type: "bar", orientation: "h", name: segment.name, x: [segment.mib / 1024], y: ["Frame buffer"],
      marker: { color: COLOURS[i % COLOURS.length] },
      hovertemplate: `${segment.name}: %{x:.1f} GiB<extra></extra>`,
    }));
    if (split.free_mib > 0) {
      traces.push({ type: "bar", orientation: "h", name: "Free", x: [split.free_mib / 1024], y: ["Frame buffer"],
                    marker: { color: "#dfe3ea" }, hovertemplate: "Free: %{x:.1f} GiB<extra></extra>" });
    }
    el.replaceChildren();
    return window.Plotly.newPlot(el, traces, {
      barmode: "stack",
      margin: { l: 16, r: 16, t: 64, b: 40 },
      height: 220,
      showlegend: true,
      legend: { orientation: "h", traceorder: "normal", x: 0, y: 1.02, xanchor: "left", yanchor: "bottom" },
      xaxis: { title: { text: "GiB" }, range: [0, split.total_mib / 1024], fixedrange: true },
      yaxis: { visible: false, fixedrange: true },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 },
    }, { responsive: true, displaylogo: false, displayModeBar: false })
      .then(() => { el.dataset.state = "ready"; })
      .catch((error) => message(el, "error", "The frame buffer split could not be drawn.", String(error)));
  }

  function drawAll(root) {
    const scope = root || document;
    if (!window.Plotly) {
      scope.querySelectorAll("[data-series-url], [data-fb-split]").forEach((el) =>
        message(el, "error", "Charts are unavailable: the plotting library did not load.", ""));
      return Promise.resolve();
    }
    const work = [];
    scope.querySelectorAll("[data-series-url]").forEach((el) => work.push(drawSeries(el)));
    scope.querySelectorAll("[data-fb-split]").forEach((el) => work.push(drawSplit(el)));
    return Promise.all(work);
  }

  window.fleetCharts = { drawAll: drawAll };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => drawAll());
  } else {
    drawAll();
  }
})();
