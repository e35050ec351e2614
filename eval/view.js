// stepgap view: draws the embedded JSON (eval/view.py). Every piece of data reaches the page
// through textContent or a title attribute, never as markup: evidence is untrusted text.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("stepgap-data").textContent);
  var app = document.getElementById("app");
  var LABELS = DATA.summary.labels;
  var NAMES = DATA.checkers;
  var state = { page: 0, label: "", disagree: false, wrong: false, query: "" };
  var searchText = new WeakMap();

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      parent.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return parent;
  }
  function pct(x) { return x === null || x === undefined ? "n/a" : (100 * x).toFixed(1); }
  function num(x, d) { return x === null || x === undefined ? "n/a" : Number(x).toFixed(d); }
  function signed(x) { return (x >= 0 ? "+" : "") + Number(x).toFixed(2); }
  function labelKey(v) { return v === null ? "missing" : (v.label || "error"); }
  function badge(label, extra) {
    return el("span", "badge " + label + (extra ? " " + extra : ""), label);
  }

  // ---------------------------------------------------------------- summary
  function distBar(counts, total) {
    var bar = el("span", "distbar");
    LABELS.concat(["error", "missing"]).forEach(function (lab) {
      var n = counts[lab] || 0;
      if (!n) return;
      var part = el("span", lab);
      part.style.width = (100 * n / total) + "%";
      part.title = lab + ": " + n;
      bar.appendChild(part);
    });
    return bar;
  }

  function summary() {
    var s = DATA.summary;
    var box = el("section", "summary");
    add(box, el("h1", null, DATA.title));
    add(box, el("p", "muted", s.traces + " traces, " + s.steps + " steps; " + s.wrong_answers +
      " wrong final answers (EM 0)" + (NAMES.length > 1 || DATA.has_gold ?
        "; " + s.disagreeing_steps + " steps where " + (NAMES.length > 1 ? "the checkers" : "") +
        (NAMES.length > 1 && DATA.has_gold ? " and gold" : DATA.has_gold ? "checker and gold" : "") +
        " disagree" : "")));
    add(box, el("h3", null, "Label distribution (steps)"));
    var t = el("table", "figures distribution");
    var head = add(el("tr"), el("th", null, "checker"), el("th", null, "steps"));
    LABELS.concat(["failed", "missing", ""]).forEach(function (h) { add(head, el("th", null, h)); });
    add(t, head);
    NAMES.forEach(function (name) {
      var c = s.distribution[name];
      var total = 0;
      Object.keys(c).forEach(function (k) { total += c[k]; });
      var row = add(el("tr"), el("td", "checker-name", name), el("td", null, total));
      LABELS.concat(["error", "missing"]).forEach(function (lab) {
        var n = c[lab] || 0;
        add(row, el("td", "count-" + lab, n + (total ? " (" + pct(n / total) + "%)" : "")));
      });
      add(row, add(el("td"), distBar(c, total || 1)));
      add(t, row);
    });
    add(box, t);
    var legend = el("p", "legend");
    LABELS.forEach(function (lab) { add(legend, badge(lab)); });
    add(legend, el("span", "muted", "card colour = label; a red bar on the left marks a disagreement"));
    add(box, legend);
    var named = Object.keys(s.sources || {});
    if (named.length) {  // replayed answers and stand-in models measure no real checker
      var where = el("div", "sources");
      add(where, el("h3", null, "Where the verdicts come from: not a real checker"));
      var list = el("ul");
      named.forEach(function (name) {
        s.sources[name].forEach(function (note) {
          add(list, add(el("li"), el("span", "checker-name", name), el("span", null, ": " + note)));
        });
      });
      add(box, add(where, list));
    }
    if (s.report) box.appendChild(figures(s.report));
    return box;
  }

  function figures(report) {
    var wrap = el("div", "report");
    add(wrap, el("h3", null, "Against gold (" + report.n_steps + " gold steps in " +
      report.n_traces + " traces; 95% bootstrap CI over " + report.bootstrap.resamples + ")"));
    var t = el("table", "figures report-figures");
    var cols = [["sP", "sP"], ["sR", "sR"], ["sF1", "sF1"], ["BA", "BA"], ["QF1", "Q-F1"]];
    var head = add(el("tr"), el("th", null, "checker"));
    cols.forEach(function (c) { add(head, el("th", null, c[1])); });
    ["flag-all Q-F1", "kappa", "scored", "missing", "failed", "healthy"].forEach(function (h) {
      add(head, el("th", null, h));
    });
    add(t, head);
    Object.keys(report.checkers).forEach(function (name) {
      var c = report.checkers[name];
      var row = add(el("tr"), el("td", "checker-name", name));
      cols.forEach(function (col) {
        var cell = el("td", "fig-" + col[0], pct(c[col[0]]));
        var ci = c.ci && c.ci[col[0]];
        if (ci && ci[0] !== null) add(cell, " ", el("span", "ci", "[" + pct(ci[0]) + ", " + pct(ci[1]) + "]"));
        add(row, cell);
      });
      add(row, el("td", null, pct(c.QF1_flag_everything)), el("td", null, num(c.kappa, 3)),
        el("td", null, c.n_scored), el("td", null, c.missing_steps), el("td", null, c.error_steps),
        el("td", null, c.healthy === null || c.healthy === undefined ? "n/a" : c.healthy ? "yes" : "no"));
      add(t, row);
    });
    add(wrap, t);
    add(wrap, el("p", "muted", "Percentages. Read Q-F1 next to the flag-everything reference " +
      "2w/(1+w): near it, with low sF1 or BA, it is the Q-F1 trap."));
    return wrap;
  }

  // ---------------------------------------------------------------- one card
  function highlighted(cls, text, hit) {
    var span = el("span", cls);
    if (!hit) { span.textContent = text; return span; }
    add(span, text.slice(0, hit.start), el("mark", "quote-hit", text.slice(hit.start, hit.end)),
      text.slice(hit.end));
    return span;
  }

  function snippetView(snippet, hit, fromStep) {
    var box = el("div", "snippet");
    if (fromStep !== null) add(box, el("span", "from", "from step " + fromStep + ":"));
    var title = hit && hit.field === "title" ? hit : null;
    var body = hit && hit.field === "text" ? hit : null;
    if (snippet.title) add(box, highlighted("title", snippet.title, title));
    add(box, highlighted("text", snippet.text, body));
    return box;
  }

  function pathChips(v) {
    var box = el("div", "path");
    v.path.forEach(function (token, i) {
      var m = /^stage([A-E]):(.*)$/.exec(token);
      var last = i === v.path.length - 1 && v.label;
      var chip = el("span", "chip" + (last ? " decided " + v.label : ""));
      chip.title = token;
      chip.dataset.stage = m ? m[1] : "?";
      add(chip, el("span", "stage", m ? m[1] : "?"), m ? m[2] : token);
      box.appendChild(chip);
    });
    return box;
  }

  function nliCall(call) {
    var row = el("div", "nli-call");
    row.dataset.stage = call.stage;
    var bar = el("span", "nli-bar");
    ["e", "n", "c"].forEach(function (k, i) {
      var part = el("span", k);
      part.style.width = (100 * call.probs[i]) + "%";
      bar.appendChild(part);
    });
    bar.title = "entailment " + num(call.probs[0], 3) + ", neutral " + num(call.probs[1], 3) +
      ", contradiction " + num(call.probs[2], 3);
    add(row, el("b", null, call.stage), bar, el("span", "nli-label",
      call.label + "  e " + num(call.probs[0], 2) + " · n " + num(call.probs[1], 2) + " · c " +
      num(call.probs[2], 2)));
    add(row, el("span", "premise", (call.stage === "E" ? "premise: " : "quote: ") + call.premise));
    return row;
  }

  function card(trace, step, position, name, v) {
    var key = labelKey(v);
    var box = el("div", "card label-" + key);
    box.dataset.label = key;
    box.dataset.checker = name;
    var head = add(el("div", "card-head"), el("span", "checker-name", name), badge(key));
    box.appendChild(head);
    if (v === null) {
      add(box, el("div", "muted", "no verdict for this step"));
      return box;
    }
    if (v.repair) add(head, el("span", "repair", "repair: " + v.repair));
    add(head, el("span", "confidence", "confidence " + num(v.confidence, 2)));
    if (v.error) add(box, el("div", "error-text", "check failed: " + v.error));
    if (v.path.length) box.appendChild(pathChips(v));
    var q = v.quote;
    var hits = q ? q.hits : [];
    if (q && q.found) {
      var line = add(el("div", "quote"), "quote: ", el("q", null, q.text), " ");
      add(line, q.verbatim ? el("span", "verbatim", "✓ verbatim")
        : el("span", "not-verbatim", "✗ not verbatim: not in the evidence"));
      box.appendChild(line);
    } else if (q) {
      add(box, el("div", "quote muted", "no quote"));
    }
    var ev = el("div", "evidence");
    if (!step.evidence.length) add(ev, el("div", "muted", "no evidence in this step"));
    step.evidence.forEach(function (snippet, j) {
      var hit = hits.filter(function (h) { return h.step === position && h.doc === j; })[0];
      ev.appendChild(snippetView(snippet, hit || null, null));
    });
    hits.forEach(function (h) {  // the quote sits in an earlier step's evidence
      if (h.step !== position) {
        var earlier = trace.steps[h.step];
        ev.appendChild(snippetView(earlier.evidence[h.doc], h, earlier.index));
      }
    });
    box.appendChild(ev);
    if (v.nli.length) {
      var nli = el("div", "nli");
      var d = v.nli.filter(function (c) { return c.stage === "D"; });
      var e = v.nli.filter(function (c) { return c.stage === "E"; });
      if (d.length) add(nli, el("div", "muted", "stage D: NLI(quote ⇒ hypothesis)"));
      d.forEach(function (c) { nli.appendChild(nliCall(c)); });
      if (e.length) add(nli, el("div", "muted", "stage E premises (" + e.length +
        " entity-matched earlier snippets)"));
      e.forEach(function (c) { nli.appendChild(nliCall(c)); });
      add(nli, el("div", "muted hypothesis", "hypothesis: " + v.nli[0].hypothesis));
      box.appendChild(nli);
    }
    var why = el("details", "reasoning");
    add(why, el("summary", null, "judge reasoning"));
    var dl = el("dl");
    Object.keys(v.reasoning).forEach(function (k) {
      add(dl, el("dt", null, "stage " + k), el("dd", null, v.reasoning[k]));
    });
    if (v.rationale) add(dl, el("dt", null, "rationale"), el("dd", null, v.rationale));
    why.appendChild(dl);
    box.appendChild(why);
    return box;
  }

  // ---------------------------------------------------------------- one trace
  function traceView(trace) {
    var sec = el("section", "trace");
    sec.dataset.traceId = trace.id;
    var head = add(el("div", "trace-head"), el("h2", null, trace.id));
    add(head, el("span", "em em-" + (trace.em ? 1 : 0), "EM " + trace.em));
    if (trace.disagree) add(head, el("span", "disagree-mark", "≠ " + trace.disagree + " disagreeing step(s)"));
    sec.appendChild(head);
    add(sec, el("div", "question", trace.question));
    var facts = el("div", "facts");
    add(facts, add(el("span", "golden"), el("b", null, "gold answers: "), trace.golden.join(" | ") || "none"));
    add(facts, add(el("span", "final-answer"), el("b", null, "final answer: "),
      trace.answer === null ? "none" : trace.answer));
    if (trace.gold_correct !== null && trace.gold_correct !== undefined) {
      add(facts, add(el("span"), el("b", null, "gold: "), trace.gold_correct ? "correct" : "wrong"));
    }
    if (trace.reward) {
      var r = trace.reward;
      var sum = 0;
      trace.steps.forEach(function (s) { if (s.reward) sum += s.reward.bracket; });
      add(facts, add(el("span", "reward-total"), el("b", null, "reward (" + r.variant + "): "),
        r.total === null ? "no reward: " + r.unavailable :
        "R = EM " + num(r.em, 0) + " + " + num(r.lam, 2) + " × " + num(sum, 2) + " = " + num(r.total, 2)));
      if (r.note) add(facts, el("span", "reward-note muted", r.note));
    }
    sec.appendChild(facts);
    trace.steps.forEach(function (step, position) {
      var row = el("div", "step-row" + (step.disagree ? " disagree" : ""));
      row.dataset.step = step.index;
      var sh = add(el("div", "step-head"), el("b", null, "step " + step.index), el("span", "muted", step.type));
      if (step.gold) add(sh, add(el("span", "gold-label"), "gold ", badge(step.gold, "gold")));
      if (step.reward) {
        add(sh, el("span", "reward", "base " + signed(step.reward.base) + " + shape " +
          signed(step.reward.shape) + " = " + signed(step.reward.bracket)));
      }
      if (step.disagree) add(sh, el("span", "disagree-mark", "≠ disagreement"));
      add(sh, el("div", "claim", step.claim || "(no claim text)"));
      if (step.query !== null) add(sh, add(el("div", "query"), el("b", null, "search: "), step.query));
      if (step.answer !== null) add(sh, add(el("div", "answer"), el("b", null, "answer: "), step.answer));
      row.appendChild(sh);
      var cards = el("div", "cards");
      cards.style.gridTemplateColumns = "repeat(" + NAMES.length + ", minmax(0, 1fr))";
      NAMES.forEach(function (name, i) {
        cards.appendChild(card(trace, step, position, name, step.verdicts[i]));
      });
      row.appendChild(cards);
      sec.appendChild(row);
    });
    if (!trace.steps.length) add(sec, el("div", "muted", "no steps"));
    return sec;
  }

  // ---------------------------------------------------------------- filters and pages
  function haystack(trace) {
    var text = searchText.get(trace);
    if (text === undefined) {
      var parts = [trace.id, trace.question, trace.golden.join(" "), trace.answer || ""];
      trace.steps.forEach(function (s) {
        parts.push(s.claim, s.query || "", s.answer || "");
        s.evidence.forEach(function (e) { parts.push(e.title, e.text); });
      });
      text = parts.join("\n").toLowerCase();
      searchText.set(trace, text);
    }
    return text;
  }

  function matches(trace) {
    if (state.label && trace.labels.indexOf(state.label) < 0) return false;
    if (state.disagree && !trace.disagree) return false;
    if (state.wrong && trace.em) return false;
    if (state.query && haystack(trace).indexOf(state.query) < 0) return false;
    return true;
  }

  var list = el("div", "traces");
  var pagers = [];
  var shown = [];

  function pager() {  // one above the traces, one below: prev, where we are, next
    var p = { text: el("span", "pager-text"), prev: el("button", "prev", "‹ prev"),
      next: el("button", "next", "next ›") };
    p.prev.addEventListener("click", function () { state.page -= 1; draw(); window.scrollTo(0, 0); });
    p.next.addEventListener("click", function () { state.page += 1; draw(); window.scrollTo(0, 0); });
    pagers.push(p);
    return add(el("span", "pager"), p.prev, p.text, p.next);
  }

  function draw() {
    shown = DATA.traces.filter(matches);
    var size = DATA.page_size;
    var pages = Math.max(1, Math.ceil(shown.length / size));
    state.page = Math.min(state.page, pages - 1);
    var first = state.page * size;
    var slice = shown.slice(first, first + size);
    list.replaceChildren.apply(list, slice.map(traceView));
    if (!slice.length) list.appendChild(el("div", "empty", "no trace matches the filters"));
    var where = "page " + (state.page + 1) + " of " + pages + " · traces " +
      (slice.length ? first + 1 : 0) + "–" + (first + slice.length) + " of " + shown.length +
      (shown.length !== DATA.traces.length ? " matching (" + DATA.traces.length + " in all)" : "");
    pagers.forEach(function (p) {
      p.text.textContent = where;
      p.prev.disabled = state.page === 0;
      p.next.disabled = state.page >= pages - 1;
    });
  }

  function controls() {
    var box = el("section", "controls");
    var label = el("select", "filter-label");
    [["", "any label"]].concat(LABELS.map(function (l) { return [l, l]; }),
      [["error", "failed check"], ["missing", "no verdict"]]).forEach(function (o) {
      var opt = el("option", null, o[1]);
      opt.value = o[0];
      label.appendChild(opt);
    });
    label.addEventListener("change", function () { state.label = label.value; state.page = 0; draw(); });
    add(box, add(el("label"), "steps labelled ", label));
    var dis = el("input", "filter-disagree");
    dis.type = "checkbox";
    dis.disabled = NAMES.length < 2 && !DATA.has_gold;
    dis.addEventListener("change", function () { state.disagree = dis.checked; state.page = 0; draw(); });
    add(box, add(el("label"), dis, " disagreements only"));
    var wrong = el("input", "filter-wrong");
    wrong.type = "checkbox";
    wrong.addEventListener("change", function () { state.wrong = wrong.checked; state.page = 0; draw(); });
    add(box, add(el("label"), wrong, " wrong answers only"));
    var search = el("input", "search");
    search.type = "search";
    search.placeholder = "search ids, questions, claims, evidence";
    var timer = null;
    search.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        state.query = search.value.trim().toLowerCase();
        state.page = 0;
        draw();
      }, 150);
    });
    add(box, search);
    add(box, pager());
    return box;
  }

  add(app, summary(), controls(), list, add(el("section", "controls bottom"), pager()));
  draw();
  var footer = el("footer");
  app.appendChild(footer);
  // Time from navigation start to the first page drawn: what `stepgap view` promises to keep
  // usable for 5,000 traces (tests/eval/test_view_browser.py reads it).
  var ms = Math.round(performance.now());
  document.body.dataset.loadMs = String(ms);
  footer.textContent = "drawn in " + ms + " ms · " + DATA.page_size + " traces a page · stepgap view";
})();
