//! `aim explore --html`: one self-contained page (no network: styles, data and script are
//! inline) with the stages side by side. Every line has the colour of its first source node;
//! hovering a line highlights every line of the same nodes in every pane, clicking pins it.
//! A stage picker shows and hides panes, a search box marks matching lines, and a side panel
//! gives the hovered node's figures (FLOPs, bytes moved, measured time with a profile).

use super::{Exploration, STAGES};
use std::collections::BTreeMap;
use std::fmt::Write;

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            _ => o.push(c),
        }
    }
    o
}

/// Stages shown when the page opens (the others are a click away).
const SHOWN: [&str; 5] = ["onnx", "optimized", "scheduled", "clif", "asm"];

const STYLE: &str = r#"
body{margin:0;font:13px/1.35 system-ui,sans-serif;background:#fafafa;color:#222}
header{padding:6px 10px;background:#263238;color:#eceff1;display:flex;gap:14px;align-items:center;flex-wrap:wrap}
header h1{font-size:15px;margin:0}
header label{cursor:pointer}
#search{width:220px}
#wrap{display:flex;height:calc(100vh - 44px)}
#panes{display:flex;flex:1;overflow-x:auto;gap:4px;padding:4px}
.pane{flex:1 0 340px;display:flex;flex-direction:column;background:#fff;border:1px solid #ccc;min-width:0}
.pane h2{font-size:13px;margin:0;padding:4px 6px;background:#eceff1;border-bottom:1px solid #ccc}
.pane pre{margin:0;overflow:auto;flex:1;font:12px/1.3 ui-monospace,monospace}
.l{white-space:pre;padding:0 4px 0 6px;border-left:4px solid transparent;cursor:default}
.l.src{border-left-color:var(--c)}
.l.hl{background:#fff3b0}
.l.pin{background:#ffd54f}
.l.match{outline:1px solid #1e88e5}
.hidden{display:none!important}
aside{width:290px;overflow:auto;padding:8px;border-left:1px solid #ccc;background:#fff}
aside table{border-collapse:collapse;width:100%;font-size:12px}
aside td,aside th{border-bottom:1px solid #eee;padding:2px 4px;text-align:left}
aside td.n{text-align:right;font-variant-numeric:tabular-nums}
"#;

const SCRIPT: &str = r#"
(function(){
  const data = JSON.parse(document.getElementById('aim-data').textContent);
  const bySource = new Map();
  const lines = Array.from(document.querySelectorAll('.l'));
  for (const el of lines) {
    const s = el.dataset.s;
    if (!s) continue;
    for (const id of s.split(' ')) {
      if (!bySource.has(id)) bySource.set(id, []);
      bySource.get(id).push(el);
    }
  }
  let pinned = null;
  function mark(el, cls) {
    document.querySelectorAll('.l.' + cls).forEach(e => e.classList.remove(cls));
    if (!el || !el.dataset.s) return [];
    const ids = el.dataset.s.split(' ');
    const seen = new Set();
    for (const id of ids) for (const e of bySource.get(id) || []) { e.classList.add(cls); seen.add(e); }
    return ids;
  }
  function fmt(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + ' G';
    if (n >= 1e6) return (n / 1e6).toFixed(2) + ' M';
    if (n >= 1e3) return (n / 1e3).toFixed(1) + ' k';
    return String(n);
  }
  function info(ids) {
    const box = document.getElementById('info');
    if (!ids.length) { box.innerHTML = '<p>Hover a line to see where it came from and its figures; click to pin.</p>'; return; }
    const names = ids.map(i => data.sources[+i]);
    const rows = data.figures.filter(f => f.sources.some(s => names.includes(s)));
    let h = '<h3>' + names.map(esc).join(', ') + '</h3><table><tr><th>node</th><th>op</th><th>FLOPs</th><th>bytes</th><th>µs</th></tr>';
    for (const f of rows) h += '<tr><td>' + esc(f.node) + '</td><td>' + esc(f.op) + '</td><td class="n">' + fmt(f.flops) + '</td><td class="n">' + fmt(f.bytes) + '</td><td class="n">' + (f.time_us == null ? '–' : f.time_us.toFixed(1)) + '</td></tr>';
    h += '</table><p>' + rows.length + ' node(s) of the optimised graph; lines highlighted: ' + document.querySelectorAll('.l.hl,.l.pin').length + '</p>';
    box.innerHTML = h;
  }
  function esc(s) { return String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
  document.getElementById('panes').addEventListener('mouseover', ev => {
    const el = ev.target.closest('.l');
    if (pinned) return;
    info(mark(el, 'hl'));
  });
  document.getElementById('panes').addEventListener('click', ev => {
    const el = ev.target.closest('.l');
    if (pinned && (!el || el === pinned)) { pinned = null; mark(null, 'pin'); info([]); return; }
    pinned = el && el.dataset.s ? el : null;
    mark(null, 'hl');
    info(mark(pinned, 'pin'));
  });
  for (const cb of document.querySelectorAll('input[data-stage]')) {
    cb.addEventListener('change', () => {
      document.querySelector('.pane[data-stage="' + cb.dataset.stage + '"]').classList.toggle('hidden', !cb.checked);
    });
  }
  const search = document.getElementById('search');
  search.addEventListener('input', () => {
    const q = search.value.toLowerCase();
    let n = 0;
    for (const el of lines) {
      const m = q.length > 0 && el.textContent.toLowerCase().includes(q);
      el.classList.toggle('match', m);
      if (m) n++;
    }
    document.getElementById('count').textContent = q ? n + ' lines' : '';
    const first = document.querySelector('.pane:not(.hidden) .l.match');
    if (first) first.scrollIntoView({block: 'center'});
  });
  info([]);
})();
"#;

/// Renders the page.
pub fn render(e: &Exploration) -> String {
    // Every source node gets an index (its colour and its key in the data).
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &e.stages {
        for l in &s.lines {
            for src in &l.sources {
                let next = index.len();
                index.entry(src.as_str()).or_insert(next);
            }
        }
    }
    let mut names = vec![""; index.len()];
    for (name, &i) in &index {
        names[i] = name;
    }
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>aim explore: {}</title><style>{STYLE}",
        escape(&e.model)
    );
    // Colours by golden-angle hue steps, so neighbouring nodes differ.
    for i in 0..names.len() {
        let _ = write!(h, ".s{i}{{--c:hsl({:.0},65%,48%)}}", (i as f64 * 137.508) % 360.0);
    }
    h.push_str("</style></head><body>\n<header><h1>aim explore</h1><span>");
    h.push_str(&escape(&e.model));
    h.push_str("</span><span>");
    h.push_str(&escape(&e.target));
    h.push_str("</span><span>stages:");
    for s in STAGES.iter().filter(|k| e.stages.iter().any(|s| s.key == **k)) {
        let on = if SHOWN.contains(s) { " checked" } else { "" };
        let _ = write!(h, " <label><input type=\"checkbox\" data-stage=\"{s}\"{on}>{s}</label>");
    }
    h.push_str("</span><input id=\"search\" type=\"search\" placeholder=\"search all panes\"><span id=\"count\"></span></header>\n<div id=\"wrap\"><main id=\"panes\">\n");
    for s in &e.stages {
        let hidden = if SHOWN.contains(&s.key) { "" } else { " hidden" };
        let _ = write!(
            h,
            "<section class=\"pane{hidden}\" data-stage=\"{}\"><h2>{}: {}</h2><pre>",
            s.key,
            s.key,
            escape(s.title)
        );
        // No text between the line elements: inside <pre> it would render as blank lines.
        for l in &s.lines {
            if l.sources.is_empty() {
                let _ = write!(h, "<div class=\"l\">{}</div>", escape(&l.text));
            } else {
                let ids: Vec<String> = l.sources.iter().map(|s| index[s.as_str()].to_string()).collect();
                let _ = write!(
                    h,
                    "<div class=\"l src s{}\" data-s=\"{}\" title=\"from: {}\">{}</div>",
                    ids[0],
                    ids.join(" "),
                    escape(&l.sources.join(", ")),
                    escape(&l.text)
                );
            }
        }
        h.push_str("</pre></section>\n");
    }
    h.push_str("</main><aside id=\"info\"></aside></div>\n");
    let figures: Vec<serde_json::Value> = e
        .figures
        .iter()
        .map(|f| serde_json::json!({"node": f.node, "op": f.op, "sources": f.sources, "flops": f.flops, "bytes": f.bytes, "time_us": f.time_us}))
        .collect();
    let data = serde_json::json!({"sources": names, "figures": figures});
    // `</` cannot appear inside the script element's JSON: escape the slash.
    let json = data.to_string().replace("</", "<\\/");
    let _ = write!(h, "<script type=\"application/json\" id=\"aim-data\">{json}</script>\n<script>{SCRIPT}</script>\n</body></html>\n");
    h
}
