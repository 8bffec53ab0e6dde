// keel serve's chat page (GET /). Self-contained: no network besides this
// server's own API. Model output is never parsed as HTML: the Markdown
// renderer below builds DOM nodes and sets only textContent, and links
// keep only http(s) addresses.
'use strict';

const $ = (id) => document.getElementById(id);
const store = {
  get(k, d) { try { const v = localStorage.getItem('keel.' + k); return v === null ? d : JSON.parse(v); } catch (e) { return d; } },
  set(k, v) { try { localStorage.setItem('keel.' + k, JSON.stringify(v)); } catch (e) { status('browser storage is full: ' + e.message); } },
};

let chats = store.get('chats', []);
let current = store.get('current', null);
let busy = null; // {ctl: AbortController} while an answer streams

function status(t) { $('status').textContent = t; }
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function headers() {
  const h = { 'Content-Type': 'application/json' };
  const k = $('apikey').value.trim();
  if (k) h.Authorization = 'Bearer ' + k;
  return h;
}
function chat() { return chats.find((c) => c.id === current) || null; }
function save() { store.set('chats', chats); store.set('current', current); }

// ---- Markdown to DOM (a safe subset) ------------------------------------

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|\[([^\]]+)\]\(([^)\s]+)\)/g;

function inline(text, parent) {
  let last = 0;
  const re = new RegExp(INLINE); // its own lastIndex: bold and italics recurse
  for (let m; (m = re.exec(text));) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    if (m[1]) parent.appendChild(el('code', null, m[2]));
    else if (m[3] || m[4]) inline(m[3] || m[4], parent.appendChild(el('strong')));
    else if (m[5]) inline(m[5], parent.appendChild(el('em')));
    else {
      const url = m[7];
      if (/^https?:\/\//i.test(url)) {
        const a = el('a', null, m[6]);
        a.href = url;
        a.rel = 'noopener noreferrer';
        a.target = '_blank';
        parent.appendChild(a);
      } else {
        parent.appendChild(document.createTextNode(m[0]));
      }
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function markdown(text, parent) {
  const lines = text.split('\n');
  let para = null, list = null;
  const close = () => { para = null; list = null; };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+-]*)/);
    if (fence) {
      close();
      const pre = el('pre'), code = el('code');
      if (fence[2]) code.dataset.lang = fence[2];
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) body.push(lines[i]);
      code.textContent = body.join('\n');
      pre.appendChild(code);
      parent.appendChild(pre);
      continue;
    }
    if (!line.trim()) { close(); continue; }
    const h = line.match(/^(#{1,6})\s+(.*)$/);
    if (h) { close(); inline(h[2], parent.appendChild(el('h' + Math.min(6, h[1].length + 2)))); continue; }
    const li = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (li) {
      const ordered = /\d/.test(li[1]);
      if (!list || list.ordered !== ordered) {
        para = null;
        list = parent.appendChild(el(ordered ? 'ol' : 'ul'));
        list.ordered = ordered;
      }
      inline(li[2], list.appendChild(el('li')));
      continue;
    }
    const q = line.match(/^>\s?(.*)$/);
    if (q) { close(); inline(q[1], parent.appendChild(el('blockquote'))); continue; }
    list = null;
    if (!para) para = parent.appendChild(el('p'));
    else para.appendChild(el('br'));
    inline(line, para);
  }
}

// ---- conversations -------------------------------------------------------

function newChat() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', messages: [] };
  chats.unshift(c);
  current = c.id;
  save();
  renderList();
  renderLog();
}

function renderList() {
  const ul = $('convs');
  ul.replaceChildren();
  for (const c of chats) {
    const li = el('li', c.id === current ? 'active' : '');
    li.appendChild(el('span', null, c.title));
    const del = el('button', null, '×');
    del.type = 'button';
    del.title = 'Delete';
    del.onclick = (ev) => {
      ev.stopPropagation();
      if (busy) return;
      chats = chats.filter((x) => x.id !== c.id);
      if (current === c.id) current = chats.length ? chats[0].id : null;
      save();
      renderList();
      renderLog();
    };
    li.appendChild(del);
    li.onclick = () => { if (busy) return; current = c.id; save(); renderList(); renderLog(); };
    ul.appendChild(li);
  }
}

function renderMessage(m, node) {
  node = node || el('div');
  node.className = 'msg ' + (m.error ? 'error' : m.role);
  node.replaceChildren();
  if (m.role === 'user') { node.textContent = m.content; return node; }
  if (m.error) { node.textContent = m.error; return node; }
  if (m.progress) node.appendChild(el('div', 'progress', m.progress));
  if (m.reasoning) {
    const d = el('details');
    d.open = !!m.streaming && !m.content;
    d.appendChild(el('summary', null, 'Reasoning'));
    d.appendChild(el('div', 'reasoning', m.reasoning));
    node.appendChild(d);
  }
  const body = el('div', 'content');
  markdown(m.content || '', body);
  node.appendChild(body);
  for (const t of m.tool_calls || []) node.appendChild(el('div', 'tool', '→ ' + t.function.name + '(' + t.function.arguments + ')'));
  if (m.stats) {
    const s = el('div', 'stats', m.stats.text);
    s.dataset.cached = String(m.stats.cached);
    s.dataset.tps = String(m.stats.tps);
    node.appendChild(s);
  }
  return node;
}

function renderLog() {
  const log = $('log');
  log.replaceChildren();
  const c = chat();
  if (!c) return;
  for (const m of c.messages) log.appendChild(renderMessage(m));
  log.scrollTop = log.scrollHeight;
}

// ---- streaming -----------------------------------------------------------

async function readSSE(resp, onData) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onData(JSON.parse(data));
      }
    }
  }
}

function apiMessages(c) {
  const out = [];
  const sys = $('system').value.trim();
  if (sys) out.push({ role: 'system', content: sys });
  for (const m of c.messages) {
    if (m.error) continue;
    const x = { role: m.role, content: m.content || '' };
    if (m.tool_calls && m.tool_calls.length) x.tool_calls = m.tool_calls;
    out.push(x);
  }
  return out;
}

async function send(text) {
  if (!current) newChat();
  const c = chat();
  c.messages.push({ role: 'user', content: text });
  if (c.title === 'New chat') c.title = text.slice(0, 40);
  const m = { role: 'assistant', content: '', reasoning: '', tool_calls: [], streaming: true };
  c.messages.push(m);
  save();
  renderList();
  renderLog();
  const node = $('log').lastChild;
  const ctl = new AbortController();
  busy = { ctl };
  $('send').disabled = true;
  $('stop').disabled = false;
  const body = { messages: apiMessages({ messages: c.messages.slice(0, -1) }), stream: true,
    stream_options: { include_usage: true }, return_progress: true, temperature: Number($('temp').value) || 0 };
  const mt = parseInt($('maxtok').value, 10);
  if (mt > 0) body.max_tokens = mt;
  let pending = false;
  const paint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; renderMessage(m, node); $('log').scrollTop = $('log').scrollHeight; });
  };
  const t0 = performance.now();
  let usage = null, timings = null, finish = null;
  try {
    const resp = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify(body), signal: ctl.signal });
    if (!resp.ok) {
      let msg = resp.status + ' ' + resp.statusText;
      try { const j = await resp.json(); if (j.error && j.error.message) msg = j.error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    await readSSE(resp, (j) => {
      if (j.error) throw new Error(j.error.message || 'error');
      if (j.usage) usage = j.usage;
      if (j.timings) timings = j.timings;
      const p = j.prompt_progress;
      if (p) {
        const left = p.total - p.cache, done = p.processed - p.cache;
        m.progress = left > 0 && done < left ? 'reading the prompt: ' + done + ' / ' + left + ' tokens' : '';
      }
      const ch = j.choices && j.choices[0];
      if (!ch) return;
      const d = ch.delta || {};
      if (d.content) { m.content += d.content; m.progress = ''; }
      if (d.reasoning_content) { m.reasoning += d.reasoning_content; m.progress = ''; }
      for (const t of d.tool_calls || []) {
        const k = t.index || 0;
        if (!m.tool_calls[k]) m.tool_calls[k] = { id: t.id || '', type: 'function', function: { name: '', arguments: '' } };
        if (t.function && t.function.name) m.tool_calls[k].function.name += t.function.name;
        if (t.function && t.function.arguments) m.tool_calls[k].function.arguments += t.function.arguments;
      }
      if (ch.finish_reason) finish = ch.finish_reason;
      paint();
    });
  } catch (e) {
    if (e.name !== 'AbortError') { m.error = 'Error: ' + e.message; }
    else finish = 'stopped';
  }
  m.streaming = false;
  m.progress = '';
  const secs = (performance.now() - t0) / 1000;
  const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
  const gen = usage ? usage.completion_tokens : 0;
  const tps = timings && timings.predicted_per_second ? timings.predicted_per_second : (gen && secs > 0 ? gen / secs : 0);
  if (!m.error) {
    const parts = [];
    if (usage) parts.push(usage.prompt_tokens + ' prompt tokens (' + cached + ' cached)', gen + ' tokens');
    parts.push(tps.toFixed(1) + ' tok/s');
    if (timings && timings.prompt_per_second) parts.push('prompt ' + timings.prompt_per_second.toFixed(1) + ' tok/s');
    if (finish && finish !== 'stop') parts.push(finish);
    m.stats = { text: parts.join(' · '), cached, tps: Number(tps.toFixed(2)) };
  }
  if (!m.tool_calls.length) delete m.tool_calls;
  busy = null;
  $('send').disabled = false;
  $('stop').disabled = true;
  save();
  renderMessage(m, node);
  refreshMemory();
}

// ---- the server's memory -------------------------------------------------

function row(tab, name, value) {
  const tr = tab.insertRow();
  tr.insertCell().textContent = name;
  const td = tr.insertCell();
  td.className = 'n';
  td.textContent = value;
  return tr;
}
function fmtBytes(b) {
  if (!(b >= 0)) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-z_]+)(\{[^}]*\})?\s+(\S+)$/);
    if (!m) continue;
    const v = Number(m[3]);
    (out[m[1]] = out[m[1]] || []).push({ labels: m[2] || '', v });
  }
  return out;
}
const sum = (arr) => (arr || []).reduce((a, x) => a + x.v, 0);

async function refreshMemory() {
  const memtab = $('memtab'), slottab = $('slottab');
  try {
    const [sr, mr] = await Promise.all([fetch('/slots', { headers: headers() }), fetch('/metrics', { headers: headers() })]);
    memtab.replaceChildren();
    slottab.replaceChildren();
    let cachedAll = 0, entries = 0;
    if (sr.ok) {
      const slots = await sr.json();
      for (const s of slots) {
        const p = s.prompt_progress || {};
        const prog = s.state === 'prefill' && p.total ? ' ' + p.processed + '/' + p.total : '';
        const tr = row(slottab, 'slot ' + s.id + ' ' + s.state + prog, s.cached_tokens + ' tok · ' + s.cells + ' cells' + (s.compactions ? ' · ' + s.compactions + ' compactions' : ''));
        tr.dataset.cached = String(s.cached_tokens);
        cachedAll += s.cached_tokens;
        if (s.cached_tokens > 0) entries++;
      }
    } else {
      row(slottab, '/slots', sr.status === 501 ? 'off (--no-slots)' : 'HTTP ' + sr.status);
    }
    row(memtab, 'cached tokens', String(cachedAll)).id = 'mem-cached';
    row(memtab, 'prompt-cache entries', String(entries));
    if (mr.ok) {
      const m = parseMetrics(await mr.text());
      row(memtab, 'KV cells used', sum(m.keel_kv_cells_used) + ' / ' + sum(m.keel_kv_cells_capacity));
      row(memtab, 'KV bytes', fmtBytes(sum(m.keel_kv_bytes_used)) + ' / ' + fmtBytes(sum(m.keel_kv_bytes_total)));
      row(memtab, 'compactions', String(sum(m.keel_kv_compactions_total)));
      row(memtab, 'prompt tokens reused', String(sum(m.keel_prompt_tokens_cached_total)) + ' of ' + sum(m.keel_prompt_tokens_total));
      if (m.keel_spec_drafted_tokens_total) row(memtab, 'drafts accepted', sum(m.keel_spec_accepted_tokens_total) + ' / ' + sum(m.keel_spec_drafted_tokens_total));
      row(memtab, 'planned memory', fmtBytes(sum(m.keel_plan_total_bytes)));
      row(memtab, 'resident memory', fmtBytes(sum(m.keel_rss_bytes)));
    } else {
      row(memtab, '/metrics', mr.status === 501 ? 'off (start with --metrics)' : 'HTTP ' + mr.status);
    }
    memtab.dataset.cached = String(cachedAll);
    status('updated ' + new Date().toLocaleTimeString());
  } catch (e) {
    status('server: ' + e.message);
  }
}

async function loadModel() {
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    const j = await r.json();
    const m = j.data && j.data[0];
    if (m) $('model').textContent = m.id + (m.meta ? ' · ' + m.meta.arch + ' · ctx ' + m.meta.n_ctx : '');
  } catch (e) { status('server: ' + e.message); }
}

// ---- wiring --------------------------------------------------------------

$('system').value = store.get('system', '');
$('apikey').value = store.get('apikey', '');
$('temp').value = store.get('temp', '0.7');
$('maxtok').value = store.get('maxtok', '');
for (const k of ['system', 'apikey', 'temp', 'maxtok']) $(k).addEventListener('change', () => store.set(k, $(k).value));
$('new').onclick = () => { if (!busy) newChat(); };
$('stop').onclick = () => { if (busy) busy.ctl.abort(); };
$('form').onsubmit = (ev) => {
  ev.preventDefault();
  const t = $('input').value;
  if (!t.trim() || busy) return;
  $('input').value = '';
  send(t);
};
$('input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $('form').requestSubmit(); }
});
if (!chat()) current = chats.length ? chats[0].id : null;
renderList();
renderLog();
loadModel();
refreshMemory();
setInterval(() => { if (!document.hidden) refreshMemory(); }, 3000);
