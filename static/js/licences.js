/* The licence page's chart: concurrent licences in use and vGPUs unlicensed per edition over
   time, with the pool's size as a dashed line, from the json_script element "licence-data"
   ({editions: [{label, owned, x, in_use, unlicensed}]}). Times are UTC. */
(function () {
  "use strict";
  const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"];

  function draw() {
    const box = document.getElementById("licence-chart");
    const source = document.getElementById("licence-data");
    if (!box || !source || typeof Plotly === "undefined") { return; }
    const data = JSON.parse(source.textContent);
    const traces = [];
    data.editions.forEach((e, i) => {
      const colour = COLOURS[i % COLOURS.length];
      traces.push({ x: e.x, y: e.in_use, name: `${e.label}: in use`, mode: "lines", line: { color: colour } });
      traces.push({ x: e.x, y: e.unlicensed, name: `${e.label}: unlicensed`, mode: "lines",
                    line: { color: colour, dash: "dot" } });
      if (e.owned !== null && e.x.length) {
        traces.push({ x: [e.x[0], e.x[e.x.length - 1]], y: [e.owned, e.owned], name: `${e.label}: owned`,
                      mode: "lines", line: { color: colour, dash: "dash", width: 1 } });
      }
    });
    box.textContent = "";
    Plotly.newPlot(box, traces, {
      margin: { t: 10, r: 10, b: 70, l: 40 }, height: 340, yaxis: { rangemode: "tozero", title: "vGPUs" },
      legend: { orientation: "h" },
    }, { displaylogo: false, responsive: true });
    box.dataset.state = "ready";
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
