"use strict";
// The session travels as JSON in #session-data. Rows become DOM nodes with textContent only (never
// innerHTML), CHUNK at a time: the first chunk at once, the next when the reader nears the end.
(function () {
  const CHUNK = 150;
  const doc = JSON.parse(document.getElementById("session-data").textContent);
  const sessions = new Map();   // id -> session data (children nested in their parent's data)
  const parentCall = new Map(); // child id -> [parent id, row index of the call that started it]
  (function index(s) {
    sessions.set(s.id, s);
    (s.children || []).forEach(index);
    s.rows.forEach(function (r, i) {
      (r.children || []).forEach(function (c) { parentCall.set(c, [s.id, i]); });
      if (r.k === "child") parentCall.set(r.session, [s.id, i]);
    });
  })(doc);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function secs(s) { s = +s || 0; return s < 1 ? Math.round(s * 1000) + " ms" : s < 120 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min"; }
  function tokens(t) { return t ? "in " + t.input + " (cached " + t.cached + ") out " + t.output : ""; }
  function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : ""; }
  function pre(text, cls) { const p = el("pre", cls); p.textContent = text; return p; }
  function diff(text) {
    const p = el("pre", "diff");
    text.split("\n").forEach(function (line) {
      const c = line.startsWith("+++") || line.startsWith("---") ? "file" : line.startsWith("@@") ? "hunk"
        : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "ctx";
      p.appendChild(el("span", c, line));
    });
    return p;
  }

  const feeds = new Map(); // session id -> Feed
  function Feed(session, root) {
    this.s = session; this.root = root; this.cur = root; this.done = 0; this.nodes = [];
    this.sentinel = el("div", "sentinel");
    root.appendChild(this.sentinel);
    feeds.set(session.id, this);
    const self = this;
    if (session.missing) root.insertBefore(el("p", "meta", "This subagent's log is not in this store: " + session.missing), this.sentinel);
    this.observer = new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; })) self.more();
    }, { rootMargin: "800px" });
    this.more();
  }
  Feed.prototype.more = function () { this.until(this.done + CHUNK - 1); };
  Feed.prototype.until = function (last) {
    const rows = this.s.rows;
    last = Math.min(last, rows.length - 1);
    while (this.done <= last) {
      const i = this.done++;
      const node = this.row(rows[i]);
      this.nodes[i] = node;
      if (node && rows[i].k !== "turn") this.cur.appendChild(node);
    }
    if (this.done >= rows.length) { this.observer.disconnect(); this.sentinel.remove(); }
    else { this.root.appendChild(this.sentinel); this.observer.observe(this.sentinel); }
  };
  Feed.prototype.row = function (r) {
    switch (r.k) {
      case "turn": {
        const sec = el("section", "turn");
        sec.dataset.turn = r.n;
        const h = el("div", "turn-head", "Turn " + r.n + (r.autonomous ? " (started by the agent)" : ""));
        const bits = [when(r.start), secs(r.seconds), r.reason || "unfinished", tokens(r.tokens)];
        if (r.cost) bits.push(r.cost);
        h.appendChild(el("span", "meta", bits.filter(Boolean).join(" · ")));
        sec.appendChild(h);
        this.root.insertBefore(sec, this.sentinel);
        this.cur = sec;
        return sec;
      }
      case "prompt": {
        const d = el("div", "row");
        d.appendChild(el("div", "label", r.source === "user" ? "prompt" : "message (" + r.source + ")"));
        d.appendChild(el("div", "prompt", r.text));
        return d;
      }
      case "answer": {
        const d = el("div", "row");
        d.appendChild(el("div", "label", "answer"));
        d.appendChild(el("div", "answer", r.text));
        return d;
      }
      case "thought": {
        const d = el("details", "row thought");
        d.appendChild(el("summary", null, "thoughts"));
        d.appendChild(pre(r.text));
        return d;
      }
      case "model": {
        const bits = ["model call, step " + r.step, r.provider + "/" + r.model, secs(r.seconds), tokens(r.tokens), r.cost, r.finish];
        return el("div", "row model", bits.filter(Boolean).join(" · "));
      }
      case "call": return this.call(r);
      case "approval": return approval(r.approval);
      case "mark": {
        const d = el("div", "row mark " + r.kind);
        d.appendChild(el("b", null, r.kind + ": "));
        d.appendChild(document.createTextNode(r.text));
        if (r.summary) { const s = el("details"); s.appendChild(el("summary", null, "summary")); s.appendChild(pre(r.summary)); d.appendChild(s); }
        return d;
      }
      case "child": return child(r.session);
      default: return null;
    }
  };
  function approval(a) {
    const d = el("div", "row approval", "approval asked: " + a.reason + " → ");
    d.appendChild(el("b", a.outcome, a.outcome));
    if (a.by) d.appendChild(document.createTextNode(" by " + a.by));
    return d;
  }
  function child(id) {
    const s = sessions.get(id);
    const d = el("details", "row child");
    d.dataset.session = id;
    const t = s ? s.totals : null;
    d.appendChild(el("summary", null, "subagent session " + id + (s && s.title ? ": " + s.title : "")
      + (t ? " · " + t.toolCalls + " tool call(s) · " + tokens(t) + (t.cost ? " · " + t.cost : "") : "")));
    d.addEventListener("toggle", function () {
      if (d.open && s && !feeds.has(id)) new Feed(s, d.appendChild(el("div", "child-feed")));
    });
    return d;
  }
  Feed.prototype.call = function (r) {
    const d = el("details", "row call");
    d.open = true;
    d.dataset.call = r.id;
    const sum = el("summary");
    sum.appendChild(el("span", "name", r.name));
    sum.appendChild(el("span", "status " + r.status, r.status + (r.code ? " " + r.code : "")));
    sum.appendChild(el("span", "meta", " " + r.id));
    d.appendChild(sum);
    if (r.args) d.appendChild(pre(r.args, "args"));
    (r.approvals || []).forEach(function (a) { d.appendChild(approval(a)); });
    if (r.diff) {
      if (r.note) d.appendChild(el("div", "meta", r.note));
      d.appendChild(diff(r.diff));
    }
    (r.program || []).forEach(function (p) {
      const sub = el("details", "call program");
      const s2 = el("summary"); s2.appendChild(el("span", "name", p.name)); s2.appendChild(el("span", "status " + p.status, p.status));
      sub.appendChild(s2); sub.appendChild(pre(p.args, "args")); sub.appendChild(pre(p.result, "result"));
      d.appendChild(sub);
    });
    if (r.result !== null && r.result !== undefined) d.appendChild(pre(r.result, "result"));
    (r.children || []).forEach(function (c) { d.appendChild(child(c)); });
    return d;
  };

  new Feed(doc, document.getElementById("feed"));

  // ---------------------------------------------------------------- search (over the data, drawn or not)
  const haystack = [];
  sessions.forEach(function (s) {
    s.rows.forEach(function (r, i) {
      const parts = [r.text, r.name, r.args, r.result, r.diff, r.summary, r.approval && r.approval.reason];
      (r.approvals || []).forEach(function (a) { parts.push(a.reason); });
      (r.program || []).forEach(function (p) { parts.push(p.name, p.args, p.result); });
      const text = parts.filter(Boolean).join("\n").toLowerCase();
      if (text) haystack.push([s.id, i, text]);
    });
  });
  function reveal(sid, i) {
    if (!feeds.has(sid)) {
      const up = parentCall.get(sid);
      if (!up) return null;
      const host = reveal(up[0], up[1]);
      if (!host) return null;
      const box = host.matches("details.child") ? host : host.querySelector('details.child[data-session="' + CSS.escape(sid) + '"]');
      if (!box) return null;
      box.open = true;
      if (!feeds.has(sid)) new Feed(sessions.get(sid), box.appendChild(el("div", "child-feed")));
    }
    const f = feeds.get(sid);
    f.until(i);
    let node = f.nodes[i];
    for (let p = node && node.parentElement; p; p = p.parentElement) if (p.tagName === "DETAILS") p.open = true;
    return node;
  }
  const q = document.getElementById("q"), hits = document.getElementById("hits");
  let found = [], at = -1, shown = null;
  function go() {
    if (shown) shown.classList.remove("hit");
    shown = null;
    if (!found.length) return;
    const [sid, i] = found[at];
    const node = reveal(sid, i);
    if (node) { node.classList.add("hit"); node.scrollIntoView({ block: "center" }); shown = node; }
    hits.textContent = (at + 1) + " of " + found.length;
  }
  let timer = 0;
  q.addEventListener("input", function () {
    clearTimeout(timer);
    timer = setTimeout(function () {
      const needle = q.value.trim().toLowerCase();
      found = needle ? haystack.filter(function (h) { return h[2].includes(needle); }) : [];
      at = 0;
      hits.textContent = needle ? (found.length ? "" : "no match") : "";
      go();
    }, 120);
  });
  q.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && found.length) { e.preventDefault(); at = (at + (e.shiftKey ? found.length - 1 : 1)) % found.length; go(); }
  });
  document.documentElement.dataset.ready = "1";
})();
