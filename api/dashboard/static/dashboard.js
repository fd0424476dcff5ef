/* overnight dashboard: the progress plot's tooltip and the live run panel (short polling). */
(function () {
  "use strict";

  function plotTooltip() {
    var wrap = document.getElementById("plot");
    var tip = document.getElementById("tip");
    if (!wrap || !tip) return;
    function show(ev) {
      var a = ev.target.closest && ev.target.closest("a.pt");
      if (!a) return;
      var title = a.querySelector("title");
      tip.textContent = title ? title.textContent : "";
      tip.hidden = false;
      var box = wrap.getBoundingClientRect();
      var r = a.getBoundingClientRect();
      var left = r.left - box.left + r.width / 2 + 10;
      if (left > box.width - 300) left = Math.max(4, left - 320);
      tip.style.left = left + "px";
      tip.style.top = Math.max(4, r.top - box.top - 10) + "px";
      a.classList.add("hl");
    }
    function hide(ev) {
      var a = ev.target.closest && ev.target.closest("a.pt");
      if (a) a.classList.remove("hl");
      tip.hidden = true;
    }
    wrap.addEventListener("mouseover", show);
    wrap.addEventListener("focusin", show);
    wrap.addEventListener("mouseout", hide);
    wrap.addEventListener("focusout", hide);
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function renderRun(run) {
    var art = el("article", "live");
    art.setAttribute("data-exp", run.id);
    var h = el("h3");
    var a = el("a", "", "#" + run.id);
    a.href = run.href;
    h.appendChild(a);
    h.appendChild(document.createTextNode(" "));
    h.appendChild(el("span", "live-desc", run.description));
    art.appendChild(h);
    if (run.of) {  // training seconds of a time budget, or steps of a budget of steps
      var bar = el("div", run.done > run.of ? "bar over" : "bar");
      bar.setAttribute("role", "progressbar");
      bar.setAttribute("aria-label", (run.unit === "steps" ? "steps" : "training time") +
        " versus budget");
      bar.setAttribute("aria-valuemin", "0");
      bar.setAttribute("aria-valuemax", String(run.of));
      bar.setAttribute("aria-valuenow", String(Math.min(run.done, run.of)));
      var fill = el("span");
      fill.style.width = Math.min(100, (run.done / run.of) * 100) + "%";
      bar.appendChild(fill);
      art.appendChild(bar);
    }
    var p = el("p", "small");
    if (run.unit === "steps") {
      p.appendChild(document.createTextNode("step "));
      p.appendChild(el("span", "live-done", String(run.done)));
      p.appendChild(document.createTextNode(" of " + run.of + " steps · "));
      p.appendChild(el("span", "live-training", String(run.training_s)));
      p.appendChild(document.createTextNode(" s trained · "));
    } else {
      p.appendChild(el("span", "live-training", String(run.training_s)));
      p.appendChild(document.createTextNode(run.unit === "tokens" ?
        " s trained of a " + run.budget + " budget · " : " s trained of " + run.of + " s budget · "));
    }
    p.appendChild(el("span", "live-elapsed", String(run.elapsed_s)));
    p.appendChild(document.createTextNode(" s since start, start-up included "));
    p.appendChild(el("span", "muted", "(hard limit " + run.timeout_s + " s)"));
    p.appendChild(document.createTextNode(" · last loss "));
    p.appendChild(el("span", "live-loss mono",
      run.last_loss === null ? "–" : Number(run.last_loss).toFixed(4)));
    if (run.slurm_job_id) {
      p.appendChild(document.createTextNode(" · Slurm job "));
      p.appendChild(el("span", "mono", run.slurm_job_id));
    }
    art.appendChild(p);
    var grid = el("div", "live-grid");
    var curve = el("div", "live-curve");
    curve.innerHTML = run.loss_svg; /* server-built SVG; every text in it is escaped */
    grid.appendChild(curve);
    var log = el("pre", "log live-log", run.log);
    log.tabIndex = 0;
    log.setAttribute("aria-label", "log tail");
    grid.appendChild(log);
    art.appendChild(grid);
    return art;
  }

  function livePanel() {
    var sec = document.getElementById("live");
    if (!sec) return;
    var url = sec.getAttribute("data-live-url");
    var single = sec.hasAttribute("data-single");
    var body = document.getElementById("live-body");
    var note = document.getElementById("live-note");
    var seen = {};
    Array.prototype.forEach.call(body.querySelectorAll("article[data-exp]"), function (a) {
      seen[a.getAttribute("data-exp")] = true;
    });
    var period = Number(sec.getAttribute("data-period-ms")) || 1000;
    var timer = null;

    function update(data) {
      var runs = single ? [data] : data.running;
      var now = {};
      runs.forEach(function (run) { if (!run.finished) now[run.id] = true; });
      Object.keys(seen).forEach(function (id) {
        if (!now[id]) {
          var reload = el("a", "", "Reload");
          reload.href = window.location.pathname + window.location.search;
          note.replaceChildren(document.createTextNode("Run #" + id + " finished" +
            (single ? " (" + data.status + ")" : "") + ". "), reload,
            document.createTextNode(single ? " to see its results." : " to see it in the plot and the table."));
          delete seen[id];
        }
      });
      Object.keys(now).forEach(function (id) { seen[id] = true; });
      body.replaceChildren();
      if (runs.length === 0) body.appendChild(el("p", "empty", "Nothing running."));
      runs.forEach(function (run) {
        var art = renderRun(run);
        body.appendChild(art);
        var log = art.querySelector(".live-log");
        log.scrollTop = log.scrollHeight;
      });
      if (single && data.finished) stop();
    }

    function tick() {
      fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
        .then(update)
        .catch(function (e) { note.textContent = "Live update failed (" + e.message + "); retrying."; });
    }
    function stop() { if (timer) { clearInterval(timer); timer = null; } }
    timer = setInterval(function () { if (!document.hidden) tick(); }, period);
  }

  document.addEventListener("DOMContentLoaded", function () {
    plotTooltip();
    livePanel();
  });
})();
