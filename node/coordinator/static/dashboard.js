// cnode dashboard: polls the coordinator's dashboard JSON and redraws the page.
// See specs/coordinator.md#dashboard. Everything peer-supplied (peer ids, usernames, ban
// reasons, figures, CIDs) is put into the page as text nodes or attribute values, never parsed
// as HTML: this file uses no innerHTML, no insertAdjacentHTML, no document.write.
// The chart is a few SVG elements drawn here rather than a charting library: one line of
// points needs ~40 lines, and nothing has to be vendored, audited or fetched from a CDN.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  let pollMs = 2000;
  let run = null;

  // An element with attributes and children; strings become text nodes (never markup).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" || typeof child === "number" ?
        document.createTextNode(String(child)) : child);
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function short(id) {
    const s = String(id || "");
    return s.length > 16 ? "…" + s.slice(-12) : s;
  }

  function peerCell(peer) {
    return el("span", { class: "cid", title: String(peer) }, short(peer));
  }

  function time(ms) {
    return ms ? new Date(ms).toISOString().slice(11, 19) : "–";
  }

  function secs(a, b) {
    return a && b ? ((b - a) / 1000).toFixed(1) + " s" : null;
  }

  function rows(id, items, make) {
    const body = document.querySelector("#" + id + " tbody");
    body.replaceChildren(...items.map(make));
    if (!items.length) {
      const cols = document.querySelectorAll("#" + id + " thead th").length;
      body.append(el("tr", { class: "empty" }, el("td", { colspan: cols, class: "muted" }, "none yet")));
    }
  }

  function num(v) {
    return typeof v === "number" && !Number.isInteger(v) ? v.toPrecision(6) : String(v);
  }

  // One figure of one round: a number, a text, or a map (a reputation ban's per-round score:
  // own and held-out losses before and after) shown as "key value" lines, never "[object ...]".
  function cell(v) {
    if (v !== null && typeof v === "object" && !Array.isArray(v)) {
      return Object.keys(v).map(k => el("div", { class: "figure" }, k + " " + num(v[k])));
    }
    return Array.isArray(v) ? v.map(num).join(", ") : num(v);
  }

  // Who decided a ban, in words, by its kind (specs/coordinator.md#bans); `by` is the peer id
  // whose request the ban acted on, named by its username when it has one.
  function decidedBy(b) {
    const who = b.by ? (b.by_username || short(b.by)) : "";
    switch (b.kind) {
      case "admin": return "an admin" + (who ? " (" + who + ")" : "");
      case "majority": return "a majority of the round's other members" +
        (b.others ? " (" + b.reports.length + " of " + b.others + ")" : "") +
        (who ? ", last report of " + who : "");
      case "checked": return "checked by the coordinator" + (who ? " (report of " + who + ")" : "");
      case "partition": return "the coordinator's recomputation of a partition" +
        (who ? " (evidence of " + who + ")" : "");
      default: return String(b.kind) + (who ? " (" + who + ")" : "");
    }
  }

  // Ban figures arrive as JSON text. Arrays as long as "rounds" become a table, one row per
  // round (the figures per round); anything else is one "key: value" line. Text only.
  function figures(text) {
    if (text === null || text === undefined) return null;
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch (e) {
      return el("pre", { class: "figures" }, String(text));
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      return el("pre", { class: "figures" }, JSON.stringify(parsed));
    }
    const rounds = Array.isArray(parsed.rounds) ? parsed.rounds : [];
    const perRound = Object.keys(parsed).filter(k => k !== "rounds" &&
      Array.isArray(parsed[k]) && rounds.length && parsed[k].length === rounds.length);
    const rest = Object.keys(parsed).filter(k => k !== "rounds" && !perRound.includes(k));
    const table = perRound.length ? el("table", { class: "figures" },
      el("thead", {}, el("tr", {}, el("th", {}, "round"), perRound.map(k => el("th", {}, k)))),
      el("tbody", {}, rounds.map((r, i) => el("tr", {}, el("td", {}, num(r)),
        perRound.map(k => el("td", { class: typeof parsed[k][i] === "string" ? "cid" : "" },
          cell(parsed[k][i]))))))) : null;
    return el("div", {}, table, rest.map(k =>
      el("div", { class: "muted" }, k + ": " + JSON.stringify(parsed[k]))));
  }

  // Honest members report identical evidence (aggregation is deterministic): shown once, with
  // every member who reported it.
  function evidenceGroups(reports) {
    const groups = new Map();
    for (const r of reports) {
      const key = JSON.stringify([r.round, r.reason, r.update_cid, r.figures]);
      if (!groups.has(key)) groups.set(key, { ...r, reporters: [] });
      groups.get(key).reporters.push(r.reporter);
    }
    return [...groups.values()];
  }

  function drawChart(points) {
    const chart = document.getElementById("loss-chart");
    chart.replaceChildren();
    const W = 640, H = 240, L = 56, R = 16, T = 14, B = 30;
    chart.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    chart.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
    if (!points.length) {
      chart.append(svg("text", { x: L + 10, y: H / 2 }, "no loss reported yet"));
      return;
    }
    const xs = points.map(p => p.round), ys = points.map(p => p.loss);
    const x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    const px = r => L + (x1 === x0 ? (W - L - R) / 2 : (r - x0) / (x1 - x0) * (W - L - R));
    const py = v => T + (y1 - v) / (y1 - y0) * (H - T - B);
    chart.append(svg("polyline", {
      class: "line", points: points.map(p => px(p.round) + "," + py(p.loss)).join(" "),
    }));
    for (const p of points) {
      const dot = svg("circle", { class: "loss-point", cx: px(p.round), cy: py(p.loss), r: 3.5,
        "data-round": p.round, "data-loss": p.loss });
      dot.append(svg("title", {}, "round " + p.round + ": " + p.loss.toFixed(4)));
      chart.append(dot);
    }
    chart.append(svg("text", { x: 4, y: T + 8 }, y1.toFixed(3)));
    chart.append(svg("text", { x: 4, y: H - B }, y0.toFixed(3)));
    chart.append(svg("text", { x: L, y: H - 8 }, "round " + x0));
    chart.append(svg("text", { x: W - R - 60, y: H - 8 }, "round " + x1));
  }

  function lossSource(p) {
    let text = p.source + ": " + p.reporters + " of " + p.members + " members signed it";
    if (p.checkpointer) text += " (the checkpointer among them)";
    if (p.dissent) text += "; " + p.dissent + " reported another value";
    return text;
  }

  function memberRow(m, excludedWhy) {
    // excludedWhy: why the round's agreed input set left this member's update out
    return el("tr", { class: "member state-row-" + m.status },
      el("td", {}, peerCell(m.peer)),
      el("td", {}, m.username || ""),
      el("td", {}, el("span", { class: "state state-" + m.status }, m.status)),
      el("td", { class: "reach" }, m.reachability || ""),
      el("td", { class: "muted" }, m.ready_at_ms ? "ready " + time(m.ready_at_ms) : ""),
      el("td", { class: "muted excluded" }, excludedWhy ? "left out: " + excludedWhy : ""));
  }

  function partitionList(r) {
    // A partitioned round: each partition's aggregator and the result recorded for it.
    if (!r.parts) return null;
    const done = r.partitions.filter(p => p.result).length;
    const shown = r.partitions.length < r.parts ? " (first " + r.partitions.length + " shown)" : "";
    return el("details", { class: "partitions" },
      el("summary", {}, r.parts + " partitions, " + done + " with a result" + shown),
      el("table", {}, el("tbody", {}, r.partitions.map(p => el("tr", { class: "partition" },
        el("td", {}, String(p.partition)),
        el("td", {}, peerCell(p.aggregator)),
        el("td", {}, !p.result ? "no result" :
          [p.result.peer !== p.aggregator ? "backup " : "", peerCell(p.result.peer), " ",
            el("span", { class: "cid" }, p.result.header)]),
        el("td", { class: "muted" }, p.result && p.result.replaced !== null ?
          ["wrong; recomputed ", el("span", { class: "cid" }, p.result.replaced || "(none)"),
            ", shown by ", peerCell(p.result.by || "")] : ""))))));
  }

  function roundRow(r) {
    const timing = [
      "opened " + time(r.opened_at_ms),
      r.closed_at_ms ? "closed " + time(r.closed_at_ms) : null,
      r.published_at_ms ? "published " + time(r.published_at_ms) +
        " (" + secs(r.opened_at_ms, r.published_at_ms) + ")" : null,
      r.deadline_ms && !r.published_at_ms ? "deadline " + time(r.deadline_ms) : null,
      r.agreed_at_ms ? "agreed " + time(r.agreed_at_ms) : null,
    ].filter(Boolean).join(", ");
    const excluded = r.excluded || {};
    const members = el("table", { class: "members" }, el("tbody", {}, r.members.map(m =>
      excluded[m.peer] ? memberRow(m, excluded[m.peer]) : memberRow(m))));
    const more = r.member_count > r.members.length ?
      el("p", { class: "muted" }, (r.member_count - r.members.length) + " more") : null;
    return el("tr", { class: "round", "data-round": r.round },
      el("td", {}, String(r.round)), el("td", {}, r.status), el("td", {}, String(r.epoch)),
      el("td", { class: "muted" }, timing), el("td", {}, members, more, partitionList(r)));
  }

  function banRow(b) {
    const groups = evidenceGroups(b.reports);
    const evidence = el("div", {},
      b.update_cid ? el("p", {}, "update ", el("span", { class: "cid" }, b.update_cid)) : null,
      groups.map(g => el("div", { class: "report" },
        el("p", {}, "round " + g.round + ": " + g.reason + "; reported by ",
          g.reporters.map(p => el("span", { class: "reporter" }, peerCell(p), " "))),
        g.update_cid && g.update_cid !== b.update_cid ?
          el("p", {}, "update ", el("span", { class: "cid" }, g.update_cid)) : null,
        figures(g.figures))),
      !groups.length && b.figures ? figures(b.figures) : null);
    return el("tr", { class: "ban" },
      el("td", {}, peerCell(b.peer), b.username ? el("div", { class: "username" }, b.username) : null),
      el("td", { class: "reason" }, b.reason),
      el("td", {}, b.round === null ? "–" : String(b.round)),
      el("td", { class: "by" }, el("span", { class: "kind kind-" + b.kind }, b.kind), " ",
        decidedBy(b) + " at " + time(b.at_ms)),
      el("td", {}, evidence));
  }

  function checkpointRow(c) {
    const hub = c.hf_repo ? c.hf_repo + " @ " + c.hf_revision : "not uploaded";
    return el("tr", { class: "checkpoint" },
      el("td", {}, String(c.round)),
      el("td", { class: "cid" }, c.manifest),
      el("td", {}, c.holders.length ? c.holders.map(h => el("div", {}, peerCell(h))) : "–"),
      el("td", {}, hub, el("div", { class: "muted" }, "submitted by " + short(c.submitter))));
  }

  function catchUpRow(c) {
    const holders = Object.entries(c.bytes_per_holder || {}).map(([peer, n]) =>
      el("div", {}, peerCell(peer), ": " + Number(n).toLocaleString("en") + " bytes"));
    return el("tr", { class: "catch-up" },
      el("td", {}, peerCell(c.peer)),
      el("td", {}, "round " + c.round + " (" + c.source + ")"),
      el("td", {}, Number(c.seconds).toFixed(2) + " s, " +
        Number(c.bytes).toLocaleString("en") + " bytes"),
      el("td", {}, holders));
  }

  function render(d) {
    document.getElementById("run").textContent = d.run;
    document.title = "cnode · " + d.run;
    let summary = "phase " + d.phase + " · round " + d.round + " · epoch " + d.epoch;
    if (d.waiting) summary += " · " + d.waiting;
    document.getElementById("summary").textContent = summary;
    drawChart(d.loss);
    rows("loss-table", d.loss.slice().reverse(), p => el("tr", { class: "loss-row" },
      el("td", {}, String(p.round)), el("td", {}, p.loss.toFixed(4)),
      el("td", { class: "muted" }, lossSource(p))));
    rows("rounds-table", d.rounds, roundRow);
    rows("bans-table", d.bans, banRow);
    rows("checkpoints-table", d.checkpoints, checkpointRow);
    rows("catch-ups-table", d.catch_ups, catchUpRow);
    rows("peers-table", d.peers, p => el("tr", { class: "peer" },
      el("td", { class: "cid" }, p.peer),
      el("td", { class: "username" }, p.username || "(peer id only)"),
      el("td", { class: "reach" }, p.reachability || ""),
      el("td", {}, time(p.joined_at_ms))));
    rows("allowlist-table", d.allowlist, a => el("tr", { class: "allow" },
      el("td", {}, a.kind), el("td", {}, a.value)));
  }

  function status(text, bad) {
    const node = document.getElementById("status");
    node.textContent = text;
    node.className = bad ? "error" : "muted";
  }

  async function poll() {
    try {
      if (run === null) {
        const health = await (await fetch("/v1/health", { cache: "no-store" })).json();
        run = health.run;
      }
      const answer = await fetch("/v1/runs/" + encodeURIComponent(run) + "/dashboard",
        { cache: "no-store" });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const data = await answer.json();
      pollMs = Math.max(500, 1000 * (data.poll_s || 2));
      render(data);
      status("updated " + new Date().toISOString().slice(11, 19) + " UTC (state version " +
        data.version + "); refreshes every " + pollMs / 1000 + " s", false);
      document.body.dataset.version = String(data.version);
    } catch (e) {
      status("coordinator unreachable: " + e.message + "; retrying", true);
    }
    setTimeout(poll, pollMs);
  }

  document.addEventListener("DOMContentLoaded", poll);
})();
