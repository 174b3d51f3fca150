/* The heatmap page (/heatmap/, dashboard/views/heatmap.py).

   The server validates the controls and renders the resolved parameters into data-* attributes
   of #heatmap; this script fetches /api/v1/heatmap/ with them and draws the answer with Plotly,
   or shows why there is nothing to draw (the <template>s of the page). When done, #heatmap
   carries data-state="ready" | "empty" | "error" and data-rows / data-columns, which the
   browser tests read. The controls work without this script; it only hides the custom range
   inputs unless "Custom" is picked and offers a metric's own statistics.

   The matrix comes in the API's typed encoding (one byte a cell in base64, gzipped on the wire:
   a tenth of the json form) and is decoded here into one Float64Array a row, NaN where there is
   no data, which Plotly draws as a gap. Past ROWS_MAX rows the API groups consecutive rows
   (each cell the hottest of its rows), so the page stays responsive at 10,000 GPUs; a click on
   a group draws that group's rows (a window of the same sorted rows), and "All ..." goes back.
   data-grouped="true" and data-total-rows tell the browser tests which is drawn. */
(function () {
  "use strict";

  const ROW_PX = 20;
  const MIN_HEIGHT_PX = 300;
  const FRAME_PX = 110; // the x axis, its labels and the margins around the rows
  const ROWS_MAX = 200; // about what a screen shows at ROW_PX; more are grouped
  const STEPS = {300: "5 minutes", 600: "10 minutes", 900: "15 minutes", 1800: "30 minutes", 3600: "1 hour"};

  function stepText(seconds) {
    if (STEPS[seconds]) return STEPS[seconds];
    if (seconds % 86400 === 0) return seconds === 86400 ? "1 day" : seconds / 86400 + " days";
    return seconds / 3600 + " hours";
  }

  function valueText(value, unit) {
    return value === null || value === undefined ? "no data" : value.toFixed(1) + " " + unit;
  }

  /* A group's figure: exact, or read from the codes and then within +/- precision. */
  function groupValueText(value, unit, precision) {
    const text = valueText(value, unit);
    return precision > 0 && value !== null ? text + " ± " + precision.toFixed(decimals(precision)) : text;
  }

  function setupControls(form) {
    const range = form.querySelector("#hm-range");
    const showCustom = () => {
      for (const box of form.querySelectorAll(".custom-range")) {
        box.hidden = range.value !== "custom";
        // Disabled inputs are not submitted: a preset's URL stays short and shareable.
        box.querySelector("input").disabled = box.hidden;
      }
    };
    range.addEventListener("change", showCustom);
    showCustom();

    const metric = form.querySelector("#hm-metric");
    const stat = form.querySelector("#hm-stat");
    const offerStats = () => {
      const stats = metric.selectedOptions[0].dataset.stats.split(" ");
      for (const option of stat.options) option.disabled = !stats.includes(option.value);
      if (!stats.includes(stat.value)) stat.value = stats[0];
    };
    metric.addEventListener("change", offerStats);
    offerStats();
  }

  /* The chart's query; `drill` = {start, count} reads a group's rows instead of the groups. */
  function apiUrl(data, drill) {
    const query = new URLSearchParams({
      group: data.group, metric: data.metric, stat: data.stat, start: data.start, end: data.end,
      sort: data.sort, fold: data.fold, encoding: "typed",
    });
    if (data.host) query.set("host", data.host);
    if (drill) {
      query.set("row_start", drill.start);
      query.set("row_count", drill.count);
    } else {
      query.set("rows_max", ROWS_MAX);
    }
    return data.apiUrl + "?" + query;
  }

  /* The typed `z` ({dtype: "u1", bdata, shape, offset, step, null}) as one Float64Array a row,
     NaN for "no data". */
  function decodeRows(z) {
    if (z.dtype !== "u1") throw new Error("Unknown matrix encoding " + z.dtype + ".");
    const [rows, columns] = z.shape.split(",").map((part) => parseInt(part, 10));
    const text = atob(z.bdata);
    const values = new Float64Array(256);
    for (let code = 0; code < 256; code++) values[code] = code === z.null ? NaN : z.offset + code * z.step;
    const out = [];
    for (let i = 0; i < rows; i++) {
      const row = new Float64Array(columns);
      for (let j = 0; j < columns; j++) row[j] = values[text.charCodeAt(i * columns + j)];
      out.push(row);
    }
    return out;
  }

  function hasData(rows) {
    return rows.some((row) => row.some((value) => !Number.isNaN(value)));
  }

  /* Decimals that show a value quantised to +/- precision without false digits. */
  function decimals(precision) {
    return precision >= 0.5 ? 0 : precision >= 0.05 ? 1 : 2;
  }

  function show(chart, state, templateId, message) {
    chart.replaceChildren(document.getElementById(templateId).content.cloneNode(true));
    if (message) chart.querySelector("[data-message]").textContent = message;
    chart.dataset.state = state;
  }

  /* DRF's errors: {"param": ["message"]} or {"detail": "message"}. */
  function errorText(body, status) {
    const parts = Object.entries(body || {}).map(([name, value]) => {
      const text = Array.isArray(value) ? value.join(" ") : String(value);
      return name === "detail" ? text : name + ": " + text;
    });
    return parts.length ? parts.join(" ") : "The server answered HTTP " + status + ".";
  }

  /* Lines between hosts when rows are grouped by host (a host row is its own group). */
  function hostSeparators(body) {
    const shapes = [];
    if (body.sort !== "host" || body.group === "host") return shapes;
    for (let i = 1; i < body.rows.length; i++) {
      if (body.rows[i].host_id !== body.rows[i - 1].host_id) {
        shapes.push({
          type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: i - 0.5, y1: i - 0.5,
          line: {color: "#ffffff", width: 2},
        });
      }
    }
    return shapes;
  }

  function figure(body, data, z) {
    const folded = body.fold === "hour_of_week";
    const grouped = body.groups !== null;
    const noun = data.rowNoun || "rows";
    // One array a row, shared by its cells: hover shows the row's subtitle, peak and mean
    // (a row's exact figures: they travel as numbers, not as codes; a group's may be read from
    // the codes, and then say within what).
    const details = grouped
      ? body.groups.map((group) => [
        group.row_count + " " + noun + " on " + group.hosts + " host" + (group.hosts === 1 ? "" : "s") +
          ": each cell the highest of them; click to show them",
        groupValueText(group.peak, body.unit, group.precision),
        groupValueText(group.mean, body.unit, group.precision)])
      : body.rows.map((row) => [row.subtitle || "", valueText(row.peak, body.unit), valueText(row.mean, body.unit)]);
    const customdata = details.map((info) => body.x.map(() => info));
    const when = folded ? "%{x} (" + data.tz + ")" : "%{x|%Y-%m-%d %H:%M} UTC";
    const places = decimals(body.z.precision);
    const within = " ± " + body.z.precision.toFixed(places) + " " + body.unit;
    const trace = {
      type: "heatmap", x: body.x, y: body.y, z: z, zmin: body.zmin, zmax: body.zmax,
      colorscale: "Viridis", hoverongaps: false, customdata: customdata,
      colorbar: {title: {text: body.unit}},
      hovertemplate: "<b>%{y}</b><br>%{customdata[0]}<br>" + when + "<br>" +
        data.metricLabel + " (" + data.statLabel + "): %{z:." + places + "f} " + body.unit + within +
        "<br>" + (grouped ? "Group" : "Row") + " peak %{customdata[1]} · mean %{customdata[2]}<extra></extra>",
    };
    const layout = {
      height: Math.max(MIN_HEIGHT_PX, body.y.length * ROW_PX + FRAME_PX),
      margin: {l: 10, r: 10, t: 10, b: 60},
      xaxis: folded
        ? {type: "category", tickvals: body.x.filter((label, j) => j % 6 === 0), tickangle: -45}
        : {type: "date", title: {text: "UTC"}},
      yaxis: {type: "category", autorange: "reversed", automargin: true, tickfont: {size: 11}},
      shapes: hostSeparators(body),
    };
    return {data: [trace], layout: layout};
  }

  function openCell(chart, body, event) {
    const point = event.points && event.points[0];
    if (!point) return;
    const [i, j] = point.pointNumber; // heatmaps number points [row, column]
    if (body.groups !== null) {
      const group = body.groups[i];
      if (group) drawRows(chart, {start: group.row_start, count: group.row_count, label: group.label});
      return;
    }
    const row = body.rows[i];
    if (!row || !row.detail_url) return;
    const folded = body.fold === "hour_of_week";
    window.location.assign(folded ? row.detail_url : row.detail_url + "?at=" + encodeURIComponent(body.x[j]));
  }

  /* The "All rows" bar above a group's rows. */
  function drillBar(chart, drill, total) {
    const bar = document.createElement("p");
    bar.className = "heatmap-drill";
    const back = document.createElement("button");
    back.type = "button";
    back.textContent = "← All " + total.toLocaleString() + " " + (chart.dataset.rowNoun || "rows");
    back.addEventListener("click", () => drawRows(chart, null));
    const what = document.createElement("span");
    what.textContent = "Showing " + drill.label;
    bar.append(back, what);
    return bar;
  }

  function drawRows(chart, drill) {
    chart.dataset.state = "";
    draw(chart, drill).catch((error) => show(chart, "error", "heatmap-error", error.message));
  }

  async function draw(chart, drill) {
    const data = chart.dataset;
    let response;
    try {
      response = await fetch(apiUrl(data, drill), {headers: {Accept: "application/json"}, credentials: "same-origin"});
    } catch (error) {
      show(chart, "error", "heatmap-error", "No answer from the server (" + error.message + ").");
      return;
    }
    const body = await response.json().catch(() => null);
    if (!response.ok || body === null) {
      show(chart, "error", "heatmap-error", errorText(body, response.status));
      return;
    }
    chart.dataset.rows = body.y.length;
    chart.dataset.columns = body.x.length;
    chart.dataset.totalRows = body.total_rows;
    chart.dataset.grouped = String(body.groups !== null);
    chart.dataset.rowStart = body.row_start;
    for (const span of document.querySelectorAll("[data-step]")) span.textContent = stepText(body.step);
    if (body.y.length === 0) {
      show(chart, "empty", "heatmap-no-rows");
      return;
    }
    const z = decodeRows(body.z);
    if (!hasData(z)) {
      show(chart, "empty", "heatmap-no-data");
      return;
    }
    const {data: traces, layout} = figure(body, data, z);
    window.Plotly.purge(chart); // a redraw (drill-down and back) starts afresh, listeners included
    chart.replaceChildren();
    const bar = chart.parentElement.querySelector(".heatmap-drill");
    if (bar) bar.remove();
    if (drill) chart.before(drillBar(chart, drill, body.total_rows));
    chart.heatmapRows = body.groups === null ? body.rows : null;
    chart.heatmapGroups = body.groups;
    await window.Plotly.newPlot(chart, traces, layout, {responsive: true, displaylogo: false});
    chart.on("plotly_click", (event) => openCell(chart, body, event));
    chart.dataset.state = "ready";
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.getElementById("heatmap-controls");
    if (form) setupControls(form);
    const chart = document.getElementById("heatmap");
    // A chart the server already settled (no agents yet) has its state; there is nothing to fetch.
    if (chart && !chart.dataset.state) {
      draw(chart, null).catch((error) => show(chart, "error", "heatmap-error", error.message));
    }
  });
})();
