/* The right-sizing page (templates/sizing/suggestion_list.html).

   A button with data-toggle-detail="<id>" shows or hides the evidence row <id>; the first time
   a row opens, the chart in it ([data-suggestion-chart="<suggestion id>"]) is drawn with the
   vendored Plotly from the page's json_script "suggestion-charts":
     {"<id>": {vm, daily: [{date, fb_p95_mib, fb_peak_mib, util_gpu_p95_pct}], profile_fb_mib,
               suggested_fb_mib, high_pct, avg_high_pct}}
   Frame buffer is drawn in GiB against the profile and the 90% / 70% lines of NVIDIA's guidance.
   Each chart ends with data-state="ready", "empty" or "error". */
(function () {
  "use strict";

  const GIB = 1024;
  // Okabe-Ito, as the other charts of the dashboard.
  const P95 = "#0072B2";
  const PEAK = "#E69F00";
  const SUGGESTED = "#009E73";

  function charts() {
    const source = document.getElementById("suggestion-charts");
    if (!source) { return {}; }
    try { return JSON.parse(source.textContent) || {}; } catch (_) { return {}; }
  }

  function say(el, state, text) {
    el.dataset.state = state;
    const p = document.createElement("p");
    p.className = "chart-message muted";
    p.textContent = text;
    el.replaceChildren(p);
  }

  // A horizontal line labelled at the right (profile sizes) or at the left (the 90% / 70% rules),
  // so the labels of lines close together do not overlap.
  function line(y, color, dash, label, side) {
    const left = side === "left";
    return {
      shape: { type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: y, y1: y, line: { color: color, width: 1.5, dash: dash } },
      note: { xref: "paper", x: left ? 0 : 1, xanchor: left ? "left" : "right", yref: "y", y: y, yanchor: "bottom",
              text: label, showarrow: false, font: { color: color, size: 11 }, bgcolor: "rgba(255,255,255,0.7)" },
    };
  }

  function draw(el, chart) {
    if (!window.Plotly) { say(el, "error", "Charts are unavailable: the plotting library did not load."); return; }
    const days = (chart && chart.daily) || [];
    if (!days.length) { say(el, "empty", "No hourly data in the window: nothing to draw."); return; }
    const x = days.map((d) => d.date);
    const gib = (v) => (v === null || v === undefined ? null : v / GIB);
    const traces = [
      { type: "scatter", mode: "lines+markers", name: "Daily p95", x: x, y: days.map((d) => gib(d.fb_p95_mib)),
        line: { color: P95, width: 2 }, hovertemplate: "p95 %{y:.1f} GiB<extra></extra>" },
      { type: "scatter", mode: "lines+markers", name: "Daily peak", x: x, y: days.map((d) => gib(d.fb_peak_mib)),
        line: { color: PEAK, width: 2, dash: "dot" }, hovertemplate: "peak %{y:.1f} GiB<extra></extra>" },
    ];
    const marks = [];
    let top = 0;
    traces.forEach((t) => t.y.forEach((v) => { if (v !== null && v > top) { top = v; } }));
    const profile = gib(chart.profile_fb_mib);
    if (profile) {
      marks.push(line(profile, "#b0282f", "solid", `Profile ${profile.toFixed(profile % 1 ? 1 : 0)} GiB`));
      marks.push(line(profile * chart.high_pct / 100, "#8a5a00", "dash", `${chart.high_pct}% of the profile`, "left"));
      marks.push(line(profile * chart.avg_high_pct / 100, "#5d6677", "dot", `${chart.avg_high_pct}% (mean limit)`, "left"));
      top = Math.max(top, profile);
    }
    const suggested = gib(chart.suggested_fb_mib);
    if (suggested && suggested !== profile) {
      marks.push(line(suggested, SUGGESTED, "dashdot", `Suggested ${suggested.toFixed(suggested % 1 ? 1 : 0)} GiB`));
      top = Math.max(top, suggested);
    }
    el.replaceChildren();
    window.Plotly.newPlot(el, traces, {
      height: 260,
      margin: { l: 48, r: 16, t: 30, b: 36 },
      hovermode: "x unified",
      showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.02, xanchor: "left", yanchor: "bottom" },
      xaxis: { type: "date", fixedrange: true },
      yaxis: { title: { text: "GiB" }, range: [0, (top || 1) * 1.12], fixedrange: true, zeroline: true },
      shapes: marks.map((m) => m.shape),
      annotations: marks.map((m) => m.note),
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", size: 12 },
    }, { responsive: true, displaylogo: false, displayModeBar: false })
      .then(() => { el.dataset.state = "ready"; })
      .catch((error) => say(el, "error", `The chart could not be drawn: ${error}`));
  }

  function toggle(button, data) {
    const row = document.getElementById(button.getAttribute("data-toggle-detail"));
    if (!row) { return; }
    const open = row.hidden;
    row.hidden = !open;
    button.setAttribute("aria-expanded", String(open));
    const el = row.querySelector("[data-suggestion-chart]");
    if (open && el && !el.dataset.state) {
      draw(el, data[el.getAttribute("data-suggestion-chart")]);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const data = charts();
    document.querySelectorAll("[data-toggle-detail]").forEach((button) =>
      button.addEventListener("click", () => toggle(button, data)));
  });

  window.suggestionCharts = { draw: draw };
}());
