// covey's dashboard page (server/dashboard/). Reads the run's state embedded in the page
// (a report) or streamed from /events (a live run) and draws it. Every value from the
// run is written as text (textContent, canvas fillText), never parsed as markup: a board
// id such as "<img onerror=...>" shows as those characters.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const charts = {};
  window.coveyCharts = charts;
  // whether the page follows the boards now: not in a report, not once the run is over,
  // not while the connection to the coordinator is down (then online is not known)
  let following = false;

  function text(el, value) {
    el.textContent = value === null || value === undefined ? "–" : String(value);
  }

  function cell(row, value) {
    const td = document.createElement("td");
    text(td, value);
    row.appendChild(td);
    return td;
  }

  function pct(v) {
    return typeof v === "number" ? (100 * v).toFixed(2) + " %" : "–";
  }

  function renderFleet(fleet) {
    const body = $("fleet").tBodies[0];
    body.replaceChildren();
    let online = 0;
    for (const b of fleet) {
      const row = document.createElement("tr");
      row.dataset.board = b.id;
      cell(row, b.id);
      cell(row, b.machine || "–");
      cell(row, b.backend || "–");
      const known = following && b.online !== null;
      const on = cell(row, known ? (b.online ? "online" : "offline") : "–");
      on.className = known ? (b.online ? "good" : "bad") : "";
      const seen = cell(row, "–");
      if (b.last_seen_at !== null) {
        seen.dataset.seenAt = String(b.last_seen_at);
        seen.className = "seen";
      }
      cell(row, b.train_s === null ? "–" : b.train_s.toFixed(1));
      cell(row, b.peak_rss_mb === null ? "–" : b.peak_rss_mb.toFixed(0));
      cell(row, b.cpu_temp_c === null ? "–" : b.cpu_temp_c.toFixed(1));
      cell(row, b.throttled === null ? "–" : b.throttled ? "yes (0x" + b.throttled.toString(16) + ")" : "no");
      const refused = cell(row, b.refusals);
      if (b.refusals > 0) refused.className = "bad";
      if (known && b.online) online += 1;
      body.appendChild(row);
    }
    text($("device-count"), fleet.length);
    // a report, or a run that is over, does not know who is online now
    text($("online-count"), following && fleet.some((b) => b.online !== null) ? online : "–");
  }

  function ageSeen() {
    // "N s ago" from the page's clock: the state carries when, not how long ago
    for (const td of document.querySelectorAll("td.seen")) {
      const at = Number(td.dataset.seenAt);
      const ago = Math.max(0, Date.now() / 1000 - at);
      // once the page stops following, "N s ago" would keep growing: show the time instead
      text(td, following ? ago.toFixed(0) + " s ago" : "at " + new Date(at * 1000).toLocaleTimeString());
    }
  }
  window.setInterval(ageSeen, 1000);

  function renderRound(state) {
    const run = state.run;
    text($("round"), run.round_in_progress || run.rounds_done);
    text($("rounds-planned"), run.rounds_planned);
    const last = state.rounds[state.rounds.length - 1];
    const parts = [];
    if (last) {
      parts.push("round " + last.round + ": " + last.n_groups + " group(s), " + last.trained + " trained, " +
        last.skipped + " skipped");
      const hand = Object.entries(state.handoff || {}).map(([k, v]) => v + " " + k).join(", ");
      if (hand) parts.push("hand-offs " + hand);
      if (last.resends) parts.push(last.resends + " resend(s)");
    }
    text($("round-detail"), parts.join("; ") || "no round recorded yet");
    const now = $("progress");
    now.replaceChildren();
    const offline = new Set(state.fleet.filter((b) => b.online === false).map((b) => b.id));
    for (const g of state.progress || []) {
      // a chain trains one member at a time: its first waiting member is the one at work
      // (or, offline, the one the chain waits for until its deadline)
      let first = g.mode === "chain";
      const parts = g.members.map(([device, st]) => {
        let shown = st;
        if (st === "waiting" && (first || g.mode !== "chain")) {
          shown = offline.has(device) ? "awaited (offline)" : "training";
        }
        if (st === "waiting" && g.mode === "chain") first = false;
        return device + " " + shown;
      });
      const li = document.createElement("li");
      const due = g.deadline_in_s === null ? "" : "; deadline in " + g.deadline_in_s + " s";
      text(li, "now, group " + g.group + " (" + g.mode + "): " + parts.join(", ") + (g.done ? "; done" : due));
      now.appendChild(li);
    }
    renderPlan(state.plan || [], state.groups);
  }

  function renderPlan(plan, groups) {
    // a chain in its training order (a → b → c), a parallel group as a set ({a, b});
    // all of a round's groups run side by side
    const list = $("plan");
    list.replaceChildren();
    for (const g of plan) {
      const li = document.createElement("li");
      li.dataset.mode = g.mode;
      const members = g.mode === "chain" ? g.members.join(" → ") : "{" + g.members.join(", ") + "}";
      text(li, "group " + g.group + ", " + (g.mode || "?") + " of " + g.members.length + ": " + members);
      list.appendChild(li);
    }
    // the strategy's own groups (clusters), where they are not the plan's groups
    const key = (sets) => sets.map((m) => m.slice().sort().join(" ")).sort().join("|");
    const same = key(groups) === key(plan.map((g) => g.members));
    $("strategy-groups").hidden = same || !groups.length;
    const list2 = $("groups");
    list2.replaceChildren();
    for (const g of same ? [] : groups) {
      const li = document.createElement("li");
      text(li, g.join(", "));
      list2.appendChild(li);
    }
  }

  function series(rows, key) {
    return rows.map((r) => (r[key] === null ? null : r[key]));
  }

  function chart(name, el, title, labels, data, scale) {
    const width = Math.max(320, Math.min(720, el.clientWidth || 640));
    const key = title + "|" + labels.join("|");
    if (charts[name] && charts[name].coveyKey !== key) {
      charts[name].destroy(); // the series changed (modelled bytes became wire bytes): draw it anew
      delete charts[name];
    }
    if (!charts[name]) {
      const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
        "#bcbd22", "#17becf"];
      const opts = {
        title: title,
        width: width,
        height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500] }, { label: scale, size: 70 }],
        series: [{ label: "round" }].concat(labels.map((l, i) => ({
          label: l, stroke: colours[i % colours.length], width: i < 2 ? 2 : 1, dash: i < 2 ? undefined : [4, 3],
        }))),
      };
      charts[name] = new uPlot(opts, data, el);
      charts[name].coveyKey = key;
    } else {
      charts[name].setData(data);
    }
  }

  const MAX_GROUP_CURVES = 8;

  function renderLearning(rows) {
    const last = rows[rows.length - 1] || {};
    text($("last-server-accuracy"), pct(last.server_accuracy));
    text($("last-federated-accuracy"), pct(last.federated_accuracy));
    const scored = rows.filter((r) => r.group_accuracy && Object.keys(r.group_accuracy).length).pop();
    text($("group-accuracy"), scored ? "by group model, round " + scored.round + ": " +
      Object.entries(scored.group_accuracy).map(([g, a]) => "group " + g + " " + pct(a)).join(", ") : "");
    if (!rows.length || typeof uPlot === "undefined") return;
    const x = rows.map((r) => r.round);
    // each group model's accuracy over its clients, dashed, where the strategy has group
    // models (the first MAX_GROUP_CURVES groups: a chart of fifty lines says nothing)
    const groups = [...new Set(rows.flatMap((r) => Object.keys(r.group_accuracy || {})))]
      .sort((a, b) => Number(a) - Number(b)).slice(0, MAX_GROUP_CURVES);
    chart("accuracy", $("accuracy-chart"), "accuracy", ["server", "federated"].concat(groups.map((g) => "group " + g)),
      [x, series(rows, "server_accuracy"), series(rows, "federated_accuracy")].concat(
        groups.map((g) => rows.map((r) => (r.group_accuracy && typeof r.group_accuracy[g] === "number"
          ? r.group_accuracy[g] : null)))), "accuracy");
    chart("loss", $("loss-chart"), "loss", ["server", "training"],
      [x, series(rows, "server_loss"), series(rows, "train_loss")], "loss");
    const wire = rows.some((r) => r.wire_bytes_down !== null || r.wire_bytes_up !== null);
    const mb = (key) => rows.map((r) => (r[key] === null ? null : r[key] / 1e6));
    const server = rows.some((r) => r.server_bytes_sent !== null || r.server_bytes_received !== null);
    const codec = " (" + window.coveyState.run.codec + ")";
    if (wire) {
      chart("bytes", $("bytes-chart"), "model frames per round on the wire" + codec,
        ["to boards", "from boards"], [x, mb("wire_bytes_down"), mb("wire_bytes_up")], "MB");
    } else if (server) {
      // what boards' runs count: the coordinator's own link (direct hand-offs bypass it)
      chart("bytes", $("bytes-chart"), "model payloads per round on the coordinator's link" + codec,
        ["sent", "received"], [x, mb("server_bytes_sent"), mb("server_bytes_received")], "MB");
    } else {
      // a record with neither count: the cost model's bytes (FedGSP Eq. 15-17) stand in
      chart("bytes", $("bytes-chart"), "model bytes per round, modelled (FedGSP Eq. 15-17)", ["bytes"],
        [x, mb("bytes")], "MB");
    }
  }

  const LABEL = 64; // px of the heatmaps' left and top margins, for board ids

  function heat(canvas, caption, unit, matrix, sources, ids, order, groupOf) {
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    canvas.coveyCell = null;
    if (!matrix || !ids.length) return;
    const n = ids.length;
    const size = (Math.min(canvas.width, canvas.height) - LABEL - 4) / n;
    let lo = Infinity;
    let hi = -Infinity;
    for (const row of matrix) {
      for (const v of row || []) {
        if (typeof v === "number") {
          lo = Math.min(lo, v);
          hi = Math.max(hi, v);
        }
      }
    }
    if (lo > hi) return; // nothing measured
    text(caption, lo.toFixed(1) + " " + unit + " (blue) to " + hi.toFixed(1) + " " + unit + " (red)");
    order.forEach((i, r) => {
      order.forEach((j, c) => {
        const v = matrix[i] ? matrix[i][j] : null;
        if (typeof v === "number") {
          const t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
          ctx.fillStyle = "hsl(" + (240 - 240 * t).toFixed(0) + ", 70%, 55%)";
        } else {
          ctx.fillStyle = "#ddd";
        }
        ctx.fillRect(LABEL + c * size, LABEL + r * size, size, size);
        const src = sources && sources[i] ? String(sources[i][j]) : "";
        if (size >= 12 && src && src !== "measured" && src !== "self" && src !== "transfer") {
          ctx.fillStyle = "#000";
          ctx.font = Math.floor(size * 0.6) + "px sans-serif";
          ctx.fillText("·", LABEL + c * size + size * 0.4, LABEL + r * size + size * 0.7);
        }
      });
    });
    // board ids along both axes (drawn as text: an id is never markup), where they fit
    if (size >= 7) {
      ctx.fillStyle = "#333";
      ctx.font = Math.min(11, Math.floor(size * 0.9)) + "px sans-serif";
      ctx.textBaseline = "middle";
      const short = (id) => (id.length > 9 ? id.slice(0, 8) + "…" : id);
      order.forEach((i, k) => {
        ctx.textAlign = "right";
        ctx.fillText(short(ids[i]), LABEL - 3, LABEL + (k + 0.5) * size);
        ctx.save();
        ctx.translate(LABEL + (k + 0.5) * size, LABEL - 3);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left";
        ctx.fillText(short(ids[i]), 0, 0);
        ctx.restore();
      });
      ctx.textAlign = "left";
      ctx.textBaseline = "alphabetic";
    }
    // the groups drawn over the matrix: a line where one group ends and the next begins
    ctx.strokeStyle = "#000";
    ctx.lineWidth = 1.5;
    for (let k = 1; k < n; k++) {
      if (groupOf[ids[order[k]]] !== groupOf[ids[order[k - 1]]]) {
        const at = LABEL + k * size;
        ctx.beginPath();
        ctx.moveTo(at, LABEL);
        ctx.lineTo(at, LABEL + n * size);
        ctx.moveTo(LABEL, at);
        ctx.lineTo(LABEL + n * size, at);
        ctx.stroke();
      }
    }
    canvas.coveyCell = { label: LABEL, size: size, n: n, order: order, ids: ids, matrix: matrix, sources: sources,
      unit: unit };
  }

  function hover(canvas, readout) {
    // the entry under the pointer, in words: "a-01 → b-02: 12.3 dB (measured)"
    canvas.addEventListener("mousemove", (event) => {
      const cellInfo = canvas.coveyCell;
      if (!cellInfo) return;
      const box = canvas.getBoundingClientRect();
      const scale = canvas.width / box.width;
      const c = Math.floor(((event.clientX - box.left) * scale - LABEL) / cellInfo.size);
      const r = Math.floor(((event.clientY - box.top) * scale - LABEL) / cellInfo.size);
      if (r < 0 || c < 0 || r >= cellInfo.n || c >= cellInfo.n) return;
      const i = cellInfo.order[r];
      const j = cellInfo.order[c];
      const v = cellInfo.matrix[i] ? cellInfo.matrix[i][j] : null;
      const src = cellInfo.sources && cellInfo.sources[i] ? cellInfo.sources[i][j] : null;
      const pair = i === j ? cellInfo.ids[i] + " ↔ server" : cellInfo.ids[i] + " → " + cellInfo.ids[j];
      text(readout, pair + ": " + (typeof v === "number" ? v.toFixed(1) + " " + cellInfo.unit : "–") +
        (src ? " (" + src + ")" : ""));
    });
  }
  hover($("snr-map"), $("snr-hover"));
  hover($("rtt-map"), $("rtt-hover"));

  function renderLinks(state) {
    const links = state.links;
    if (!links) {
      text($("links-note"), "no link matrices yet");
      return;
    }
    const ids = links.ids;
    const groupOf = {};
    state.groups.forEach((g, k) => g.forEach((m) => (groupOf[m] = k)));
    const order = ids.map((_, i) => i).sort((a, b) => {
      const ga = groupOf[ids[a]] === undefined ? 1e9 : groupOf[ids[a]];
      const gb = groupOf[ids[b]] === undefined ? 1e9 : groupOf[ids[b]];
      return ga - gb || a - b;
    });
    text($("links-note"), ids.length + " boards, ordered by the last round's groups (lines part them); a dot " +
      "marks a filled entry (not measured on that path); point at an entry to read it");
    heat($("snr-map"), $("snr-caption"), "dB", links.snr_db, links.snr_source, ids, order, groupOf);
    heat($("rtt-map"), $("rtt-caption"), "ms", links.rtt_ms, links.rtt_source, ids, order, groupOf);
  }

  function renderEvents(events) {
    const list = $("events");
    list.replaceChildren();
    for (const e of events.slice().reverse()) {
      const li = document.createElement("li");
      text(li, "round " + e.round + ": " + e.kind + (e.device ? " (" + e.device + ")" : "") + ": " + e.detail);
      list.appendChild(li);
    }
    if (!events.length) text(list, "none");
  }

  const embedded = $("covey-state");

  function render(state) {
    window.coveyState = state;
    const title = $("page-title") ? $("page-title").textContent : "covey";
    text($("title"), title);
    const run = state.run;
    const over = run.status === "finished" || run.status === "stopped";
    if (over) following = false;
    text($("status"), (run.strategy || "a run") + ": " + run.status + ", " + run.rounds_done + " round(s) recorded, " +
      run.codec + " models" + (over && !embedded ? "; the page shows the run as it ended" : ""));
    renderFleet(state.fleet);
    ageSeen();
    renderRound(state);
    renderLearning(state.rounds);
    renderLinks(state);
    renderEvents(state.events);
    if (document.body.dataset.rounds !== String(run.rounds_done)) {
      // when each round first showed (bench/dashboard.py reads it: epoch milliseconds)
      window.coveyShownAt = window.coveyShownAt || {};
      window.coveyShownAt[run.rounds_done] = Date.now();
    }
    document.body.dataset.rounds = String(run.rounds_done);
  }

  if (embedded) {
    render(JSON.parse(embedded.textContent));
  } else {
    const stream = new EventSource("/events" + window.location.search);
    stream.onmessage = (event) => {
      const state = JSON.parse(event.data);
      following = true; // render() stops following a run that is over
      render(state);
      if (!following) stream.close(); // the coordinator is done
    };
    stream.onerror = () => {
      // the coordinator went away (its run ended, or it failed): who is online is no longer known
      following = false;
      if (window.coveyState) render(window.coveyState);
      text($("status"), "connection to the coordinator lost; retrying (the page shows the run as it last was)");
    };
  }
})();
