// The budget dashboard: fetches GET /v1/dashboard with the owner's token and draws SVG charts.
// No libraries, no network access beyond this server. Every label is set with textContent.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const PARTS = ["consumed", "allocated", "unlocked", "locked"];
  const COLORS = {consumed: "var(--consumed)", allocated: "var(--allocated)",
                  unlocked: "var(--unlocked)", locked: "var(--locked)",
                  untouched: "var(--untouched)"};
  const refreshMs = Math.max(500, parseInt(document.body.dataset.refreshMs, 10) || 2000);
  const storageKey = "chorus-owner-token";
  let timer = null;
  let lastData = null;

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    const node = el("text", Object.assign({x: x, y: y}, attrs || {}), parent);
    node.textContent = content;
    return node;
  }

  function fmt(x) {
    if (x === null || x === undefined || !isFinite(x)) return "-";
    if (x === 0) return "0";
    const a = Math.abs(x);
    if (a >= 1000) return x.toFixed(0);
    if (a >= 0.001) return String(Number(x.toPrecision(4)));
    return x.toExponential(2);
  }

  function niceMax(x) {
    if (!(x > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }

  function svgFor(container, width, height, label) {
    container.replaceChildren();
    return el("svg", {viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label},
              container);
  }

  function yAxis(svg, left, top, plotH, width, max, ticks) {
    const grid = el("g", {class: "grid"}, svg);
    for (let i = 0; i <= ticks; i++) {
      const v = max * i / ticks;
      const y = top + plotH - plotH * i / ticks;
      el("line", {x1: left, x2: width - 10, y1: y, y2: y}, grid);
      text(svg, left - 6, y + 4, fmt(v), {"text-anchor": "end"});
    }
  }

  function legend(id, entries) {
    const box = document.getElementById(id);
    box.replaceChildren();
    for (const [name, color] of entries) {
      const span = document.createElement("span");
      span.style.setProperty("--swatch", color);
      span.textContent = name;
      box.appendChild(span);
    }
  }

  function drawBlocks(data) {
    const blocks = data.blocks;
    const width = 1200, height = 320, left = 56, top = 10, bottom = 70;
    const plotW = width - left - 10, plotH = height - top - bottom;
    const svg = svgFor(document.getElementById("blocks-chart"), width, height,
                       `Epsilon per block, ${blocks.length} blocks`);
    const zoom = document.getElementById("zoom").checked;
    const spentMax = Math.max(0, ...blocks.map(b => (b.consumed || 0) + (b.allocated || 0)));
    const max = zoom && spentMax > 0 ? niceMax(spentMax * 1.1) :
      niceMax(Math.max(data.epsilon_per_block, ...blocks.map(b => b.total || 0)));
    const parts = zoom && spentMax > 0 ? ["consumed", "allocated"] : PARTS;
    yAxis(svg, left, top, plotH, width, max, 4);
    text(svg, 12, top + plotH / 2, "epsilon", {transform: `rotate(-90 12 ${top + plotH / 2})`,
                                               "text-anchor": "middle"});
    const step = blocks.length ? plotW / blocks.length : plotW;
    const barW = Math.max(1, step * 0.8);
    const labelEvery = Math.max(1, Math.ceil(blocks.length / 20));
    const bars = el("g", {class: "bars"}, svg);
    blocks.forEach((b, i) => {
      const x = left + i * step + (step - barW) / 2;
      const g = el("g", {class: "block-bar" + (b.untouched ? " is-untouched" : ""),
                         "data-block": b.block, "data-consumed": b.consumed}, bars);
      const title = el("title", {}, g);
      let y = top + plotH;
      if (b.untouched && parts === PARTS) {
        const h = plotH * (b.total || 0) / max;
        el("rect", {class: "untouched", x: x, y: y - h, width: barW, height: h}, g);
        title.textContent = `${b.block}: not read by any query yet (full budget ${fmt(b.total)})`;
      } else if (b.untouched) {
        title.textContent = `${b.block}: not read by any query yet`;
      } else {
        for (const part of parts) {
          const h = plotH * (b[part] || 0) / max;
          if (h <= 0) continue;
          y -= h;
          el("rect", {class: part, x: x, y: y, width: barW, height: h}, g);
        }
        title.textContent = `${b.block}: consumed ${fmt(b.consumed)}, allocated ` +
          `${fmt(b.allocated)}, unlocked ${fmt(b.unlocked)}, locked ${fmt(b.locked)} ` +
          `of ${fmt(b.total)}`;
      }
      if (i % labelEvery === 0) {
        const lx = left + i * step + step / 2, ly = top + plotH + 12;
        const label = b.block.includes("/") ? b.block.slice(b.block.indexOf("/") + 1) : b.block;
        text(svg, lx, ly, label, {"text-anchor": "end",
                                  transform: `rotate(-45 ${lx} ${ly})`});
      }
    });
    legend("blocks-legend", PARTS.map(p => [p, COLORS[p]]).concat(
      [["not read yet (full budget)", COLORS.untouched]]));
    const hint = document.getElementById("blocks-hint");
    hint.textContent = `${blocks.length} block(s), epsilon ${fmt(data.epsilon_per_block)} ` +
      `and delta ${data.delta_per_block} each; accounting ${data.accounting}, ` +
      `scheduler ${data.scheduler}` +
      (data.untouched_not_shown ? `; ${data.untouched_not_shown} unread blocks not shown` : "");
  }

  function drawHistory(data) {
    const points = data.history;
    const width = 800, height = 240, left = 56, top = 10, bottom = 30;
    const plotW = width - left - 10, plotH = height - top - bottom;
    const svg = svgFor(document.getElementById("history-chart"), width, height,
                       "Total epsilon consumed over time");
    const max = niceMax(Math.max(0, ...points.map(p => Math.max(p.consumed, p.allocated))));
    yAxis(svg, left, top, plotH, width, max, 4);
    if (!points.length) return;
    const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1);
    const xOf = t => left + plotW * (t - t0) / (t1 - t0);
    const yOf = v => top + plotH - plotH * v / max;
    for (const key of ["consumed", "allocated"]) {
      const d = points.map((p, i) => `${i ? "L" : "M"}${xOf(p.t).toFixed(1)},` +
                           `${yOf(p[key]).toFixed(1)}`).join(" ");
      el("path", {class: `line-${key}`, d: d, "data-series": key}, svg);
    }
    const when = t => new Date(t * 1000).toLocaleTimeString();
    text(svg, left, height - 8, when(t0), {"text-anchor": "start"});
    text(svg, width - 10, height - 8, when(t1), {"text-anchor": "end"});
    legend("history-legend", [["consumed (sum over blocks)", COLORS.consumed],
                              ["allocated", COLORS.allocated]]);
  }

  function hbars(containerId, rows, label) {
    const rowH = 26, left = 120, width = 640;
    const height = Math.max(1, rows.length) * rowH + 10;
    const svg = svgFor(document.getElementById(containerId), width, height, label);
    const max = niceMax(Math.max(0, ...rows.map(r => r.value)));
    rows.forEach((r, i) => {
      const y = 5 + i * rowH;
      const g = el("g", {class: "hbar", "data-name": r.name, "data-value": r.value}, svg);
      text(g, left - 8, y + 16, r.name, {"text-anchor": "end"});
      const w = (width - left - 190) * r.value / max;
      el("rect", {class: r.cls, x: left, y: y + 4, width: Math.max(0, w), height: rowH - 8}, g);
      text(g, left + w + 6, y + 16, r.text, {class: "value"});
    });
  }

  function drawClaims(data) {
    const c = data.claims;
    hbars("claims-chart", [
      {name: "granted", value: c.granted, text: String(c.granted), cls: "granted"},
      {name: "waiting", value: c.waiting, text: String(c.waiting), cls: "waiting"},
      {name: "refused", value: c.refused, text: String(c.refused), cls: "refused"},
      {name: "released", value: c.released, text: String(c.released), cls: "released"},
    ], "Claims by outcome");
  }

  function drawAnalysts(data) {
    hbars("analysts-chart", data.analysts.map(a => ({
      name: a.analyst, value: a.epsilon, cls: "spent",
      text: `epsilon ${fmt(a.epsilon)} in ${a.queries} quer${a.queries === 1 ? "y" : "ies"}`,
    })), "Epsilon spent per analyst");
  }

  function setStatus(message, isError) {
    const status = document.getElementById("status");
    status.textContent = message;
    status.classList.toggle("error", Boolean(isError));
  }

  function draw(data) {
    lastData = data;
    document.getElementById("main").hidden = false;
    document.getElementById("login").hidden = true;
    const consumed = data.blocks.reduce((s, b) => s + (b.consumed || 0), 0);
    document.getElementById("card-blocks").textContent = String(data.blocks.length);
    document.getElementById("card-consumed").textContent = fmt(consumed);
    document.getElementById("card-granted").textContent = String(data.claims.granted);
    document.getElementById("card-waiting").textContent = String(data.claims.waiting);
    document.getElementById("card-refused").textContent = String(data.claims.refused);
    drawBlocks(data);
    drawHistory(data);
    drawClaims(data);
    drawAnalysts(data);
    document.body.dataset.generatedAt = String(data.generated_at);
    setStatus(`updated ${new Date(data.generated_at * 1000).toLocaleTimeString()}, ` +
              `refreshing every ${refreshMs / 1000} s`, false);
  }

  function showLogin(message) {
    document.getElementById("login").hidden = false;
    setStatus(message, true);
  }

  async function refresh() {
    const token = sessionStorage.getItem(storageKey);
    if (!token) {
      showLogin("enter the data owner's token");
      return;
    }
    try {
      const response = await fetch("/v1/dashboard", {
        headers: {Authorization: `Bearer ${token}`, Accept: "application/json"},
        cache: "no-store",
      });
      if (response.status === 401 || response.status === 403) {
        const problem = await response.json().catch(() => ({}));
        sessionStorage.removeItem(storageKey);
        showLogin(problem.detail || "this token is not the data owner's");
        return;
      }
      if (!response.ok) {
        setStatus(`the proxy answered ${response.status}; retrying`, true);
      } else {
        draw(await response.json());
      }
    } catch (err) {
      setStatus(`cannot reach the proxy (${err.message}); retrying`, true);
    }
    timer = setTimeout(refresh, refreshMs);
  }

  function start() {
    // A token may arrive in the fragment (/dashboard#token=...), which is never sent to servers.
    const match = /(?:^|[#&])token=([^&]+)/.exec(window.location.hash);
    if (match) {
      sessionStorage.setItem(storageKey, decodeURIComponent(match[1]));
      history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    document.getElementById("zoom").addEventListener("change", () => {
      if (lastData) drawBlocks(lastData);
    });
    document.getElementById("login").addEventListener("submit", event => {
      event.preventDefault();
      const input = document.getElementById("token");
      sessionStorage.setItem(storageKey, input.value);
      input.value = "";
      if (timer) clearTimeout(timer);
      refresh();
    });
    refresh();
  }

  start();
})();
