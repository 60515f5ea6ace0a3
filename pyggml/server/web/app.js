/* pyggml's web page: Chat, Model (where every byte of the model lives), Live.
 * Plain JavaScript, no libraries; it talks to the server that served it and nothing else
 * (the server also sends a Content-Security-Policy that says so). JSON endpoints: docs/server.md.
 */
'use strict';
(function () {
  // ---- small helpers --------------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);
  const SVGNS = 'http://www.w3.org/2000/svg';

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false)
      el.append(k instanceof Node ? k : String(k));
    return el;
  }
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    setAttrs(el, attrs);
    for (const k of kids.flat()) if (k !== null && k !== undefined)
      el.append(k instanceof Node ? k : String(k));
    return el;
  }
  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.setAttribute('class', v);
      else if (k === 'text') el.textContent = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : v);
    }
  }
  function fmtBytes(n) {
    if (n === null || n === undefined) return '–';
    const a = Math.abs(n);
    if (a >= 1024 ** 3) return (n / 1024 ** 3).toFixed(2) + ' GiB';
    if (a >= 1024 ** 2) return (n / 1024 ** 2).toFixed(2) + ' MiB';
    if (a >= 1024) return (n / 1024).toFixed(1) + ' KiB';
    return n + ' B';
  }
  const fmtNum = (x, d = 1) => (x === null || x === undefined || !isFinite(x)) ? '–' : x.toFixed(d);
  const store = {
    get(k, dflt) {
      try { const v = localStorage.getItem('pyggml.' + k); return v === null ? dflt : JSON.parse(v); }
      catch (e) { return dflt; }
    },
    set(k, v) { try { localStorage.setItem('pyggml.' + k, JSON.stringify(v)); } catch (e) { /* full */ } },
    del(k) { try { localStorage.removeItem('pyggml.' + k); } catch (e) { /* none */ } },
  };

  // ---- the server: requests, API key, "server gone" ---------------------------------------------
  class Offline extends Error {}
  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  let keyPrompt = null;            // the pending "ask for the key" promise (asked once at a time)

  function headers(extra) {
    const hd = Object.assign({}, extra || {});
    const key = store.get('apiKey', '');
    if (key) hd.Authorization = 'Bearer ' + key;
    return hd;
  }

  /** fetch with the key; a 401 asks for the key (again, saying it was refused) and retries;
   * no answer: Offline. */
  async function api(path, opts) {
    opts = opts || {};
    let resp;
    try {
      resp = await fetch(path, Object.assign({}, opts, { headers: headers(opts.headers), cache: 'no-store' }));
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      serverGone();
      throw new Offline('the server does not answer');
    }
    serverBack();
    if (resp.status === 401) {
      await askKey(store.get('apiKey', '') ? 'The key was refused. Try again:' : null);
      return api(path, opts);
    }
    if (!resp.ok) {
      let msg = resp.status + ' ' + resp.statusText;
      try { const j = await resp.json(); if (j.error && j.error.message) msg = j.error.message; } catch (e) { /* text */ }
      throw new HttpError(resp.status, msg);
    }
    return resp;
  }
  const getJSON = async (path, opts) => (await api(path, opts)).json();

  function askKey(message) {
    const dlg = $('key-dialog');
    if (keyPrompt) {                        // asked already (the dialog may have been closed)
      if (!dlg.open) dlg.showModal();
      return keyPrompt;
    }
    $('key-message').textContent = message ||
      'It was started with --api-key. The key is kept in this browser\'s local storage and sent as "Authorization: Bearer …".';
    $('key-input').value = '';
    $('key-button').classList.remove('hidden');
    keyPrompt = new Promise((resolve) => {
      const done = (ev) => {
        ev.preventDefault();
        const v = $('key-input').value.trim();
        if (!v) return;
        store.set('apiKey', v);
        $('key-form').removeEventListener('submit', done);
        dlg.close();
        keyPrompt = null;
        resolve();
      };
      $('key-form').addEventListener('submit', done);
    });
    if (!dlg.open) dlg.showModal();
    $('key-input').focus();
    return keyPrompt;
  }

  let gone = false, heartbeat = null;
  function serverGone() {
    const b = $('banner');
    b.textContent = 'The server at ' + location.host + ' does not answer: it may have been stopped ' +
      '(start it again with pyggml serve). Retrying every 2 s…';
    b.classList.remove('hidden');
    $('conn').textContent = 'server gone';
    $('conn').className = 'conn bad';
    if (!gone) { gone = true; clearInterval(heartbeat); heartbeat = setInterval(beat, 2000); }
  }
  function serverBack() {
    if (!gone) { $('conn').textContent = 'connected'; $('conn').className = 'conn ok'; return; }
    gone = false;
    $('banner').classList.add('hidden');
    $('conn').textContent = 'connected';
    $('conn').className = 'conn ok';
    clearInterval(heartbeat); heartbeat = setInterval(beat, 5000);
  }
  async function beat() {
    try { const r = await fetch('/health', { cache: 'no-store' }); if (r.ok) serverBack(); else serverGone(); }
    catch (e) { serverGone(); }
  }

  // ---- markdown (a small subset, escaped by construction: text goes in as text nodes) -----------
  function inline(text) {
    const out = [];
    // code spans first, then links, bold, italics; everything else is plain text
    const re = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\[([^\]]+)\]\(([^)\s]+)\)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_/g;
    let last = 0, m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) out.push(text.slice(last, m.index));
      if (m[1]) out.push(h('code', {}, m[2].trim()));
      else if (m[3]) {
        const url = m[4];
        // links are shown, never fetched; only http(s) and in-page ones are clickable
        if (/^(https?:|#)/i.test(url)) out.push(h('a', { href: url, target: '_blank', rel: 'noopener noreferrer' }, m[3]));
        else out.push(m[3]);
      } else if (m[5] || m[6]) out.push(h('strong', {}, inline(m[5] || m[6])));
      else out.push(h('em', {}, inline(m[7] || m[8])));
      last = re.lastIndex;
    }
    if (last < text.length) out.push(text.slice(last));
    return out;
  }

  function codeBlock(lang, code) {
    const copy = h('button', { class: 'copy', type: 'button', title: 'copy' }, 'copy');
    copy.addEventListener('click', () => {
      if (navigator.clipboard) navigator.clipboard.writeText(code).then(() => { copy.textContent = 'copied'; });
    });
    return h('div', { class: 'code' },
      h('div', { class: 'code-head' }, h('span', {}, lang || 'code'), copy),
      h('pre', {}, h('code', { class: lang ? 'lang-' + lang : null }, code)));
  }

  /** Markdown text -> a DocumentFragment: fenced code (also unterminated, while streaming),
   * headings, lists, block quotes, rules, paragraphs with inline code, links, bold, italics. */
  function markdown(src) {
    const frag = document.createDocumentFragment();
    const lines = src.replace(/\r\n?/g, '\n').split('\n');
    let i = 0, para = [];
    const flush = () => {
      if (para.length) {
        const p = h('p');
        para.forEach((l, k) => { if (k) p.append(h('br')); p.append(...inline(l)); });
        frag.append(p);
        para = [];
      }
    };
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
      if (fence) {
        flush();
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i++;
        frag.append(codeBlock(fence[2], body.join('\n')));
        continue;
      }
      const hd = line.match(/^(#{1,6})\s+(.*)$/);
      if (hd) { flush(); frag.append(h('h' + Math.min(6, hd[1].length + 2), {}, inline(hd[2]))); i++; continue; }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); frag.append(h('hr')); i++; continue; }
      if (/^\s*>/.test(line)) {
        flush();
        const q = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) q.push(lines[i++].replace(/^\s*>\s?/, ''));
        frag.append(h('blockquote', {}, markdown(q.join('\n'))));
        continue;
      }
      const li = line.match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
      if (li) {
        flush();
        const ordered = /\d/.test(li[2]);
        const list = h(ordered ? 'ol' : 'ul');
        while (i < lines.length) {
          const m = lines[i].match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
          if (m && /\d/.test(m[2]) === ordered) { list.append(h('li', {}, inline(m[3]))); i++; }
          else if (m === null && /^\s{2,}\S/.test(lines[i]) && list.lastChild) { list.lastChild.append(' ', ...inline(lines[i].trim())); i++; }
          else break;
        }
        frag.append(list);
        continue;
      }
      if (!line.trim()) { flush(); i++; continue; }
      para.push(line);
      i++;
    }
    flush();
    return frag;
  }

  // ---- chat -------------------------------------------------------------------------------------
  const chat = {
    convs: store.get('conversations', []),
    current: store.get('current', null),
    controller: null,
    modelId: 'pyggml',
  };

  function saveConvs() { store.set('conversations', chat.convs); store.set('current', chat.current); }
  function conv() {
    let c = chat.convs.find((x) => x.id === chat.current);
    if (!c) {
      c = { id: 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', messages: [], created: Date.now() };
      chat.convs.unshift(c);
      chat.current = c.id;
      saveConvs();
    }
    return c;
  }

  function renderConvList() {
    const ul = $('conv-list');
    ul.replaceChildren();
    for (const c of chat.convs) {
      const del = h('button', { class: 'ghost tiny', type: 'button', title: 'delete this conversation' }, '×');
      del.addEventListener('click', (ev) => {
        ev.stopPropagation();
        if (chat.controller && c.id === chat.current) return;
        chat.convs = chat.convs.filter((x) => x.id !== c.id);
        if (chat.current === c.id) chat.current = chat.convs.length ? chat.convs[0].id : null;
        saveConvs(); renderChat();
      });
      const li = h('li', { class: c.id === chat.current ? 'active' : null, 'data-id': c.id },
        h('span', { class: 'conv-title' }, c.title), del);
      li.addEventListener('click', () => {
        if (chat.controller) return;
        chat.current = c.id; saveConvs(); renderChat(); showPanel(null);
      });
      ul.append(li);
    }
  }

  function statsText(st) {
    if (!st) return '';
    const parts = [];
    if (st.completion_tokens !== undefined) parts.push(st.completion_tokens + ' tokens');
    if (st.tps !== undefined && st.tps !== null) parts.push(fmtNum(st.tps) + ' tokens/s');
    if (st.prompt_tokens !== undefined) parts.push('prompt ' + st.prompt_tokens + (st.cached ? ' (' + st.cached + ' cached)' : ''));
    if (st.ttft_ms !== undefined) parts.push('first token ' + Math.round(st.ttft_ms) + ' ms');
    if (st.finish) parts.push(st.finish === 'stopped' ? 'stopped' : 'finish: ' + st.finish);
    return parts.join(' · ');
  }

  function messageEl(m) {
    const body = h('div', { class: 'body' });
    if (m.role === 'assistant') body.append(markdown(m.content)); else body.textContent = m.content;
    const el = h('div', { class: 'msg ' + m.role, 'data-state': m.state || 'done' },
      h('div', { class: 'who' }, m.role === 'user' ? 'You' : 'Model'), body,
      m.role === 'assistant' ? h('div', { class: 'stats' }, m.error ? '' : statsText(m.stats)) : null);
    if (m.error) el.append(h('div', { class: 'msg-error' }, m.error));
    return el;
  }

  function renderChat() {
    renderConvList();
    const box = $('messages');
    box.replaceChildren();
    const c = chat.convs.find((x) => x.id === chat.current);
    if (!c || !c.messages.length) {
      box.append(h('div', { class: 'empty' }, h('h2', {}, 'Chat with ' + chat.modelId),
        h('p', {}, 'Replies stream from this server\'s /v1/chat/completions. Conversations stay in this browser.')));
      return;
    }
    for (const m of c.messages) box.append(messageEl(m));
    box.scrollTop = box.scrollHeight;
  }

  function settings() {
    const num = (id, d) => { const v = parseFloat($(id).value); return isFinite(v) ? v : d; };
    return { system: $('system').value, temperature: num('temperature', 0.8), top_p: num('top-p', 0.95),
      max_tokens: Math.max(1, Math.round(num('max-tokens', 512))) };
  }
  function saveSettings() { store.set('settings', settings()); }
  function loadSettings() {
    const st = store.get('settings', null);
    if (!st) return;
    $('system').value = st.system || '';
    $('temperature').value = st.temperature;
    $('top-p').value = st.top_p;
    $('max-tokens').value = st.max_tokens;
  }

  function setBusy(busy) {
    $('send').classList.toggle('hidden', busy);
    $('stop').classList.toggle('hidden', !busy);
    $('send').disabled = busy;
  }

  /** Parses server-sent events from a fetch body; calls onData(obj) per `data:` JSON line. */
  async function readSSE(resp, onData) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k); buf = buf.slice(k + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') return;
          onData(JSON.parse(data));
        }
      }
    }
  }

  async function send(text) {
    const c = conv();
    const st = settings();
    saveSettings();
    if (c.messages.length === 0) c.title = text.slice(0, 48);
    c.messages.push({ role: 'user', content: text });
    const reply = { role: 'assistant', content: '', state: 'streaming', stats: null };
    c.messages.push(reply);
    saveConvs();
    renderChat();
    const el = $('messages').lastChild;
    const body = el.querySelector('.body');
    const statsEl = el.querySelector('.stats');
    const history = c.messages.slice(0, -1).filter((m) => !m.error).map((m) => ({ role: m.role, content: m.content }));
    const messages = (st.system.trim() ? [{ role: 'system', content: st.system }] : []).concat(history);
    const controller = new AbortController();
    chat.controller = controller;
    setBusy(true);
    const t0 = performance.now();
    let tFirst = null, chunks = 0, usage = null, finish = null, pending = false;
    const paint = () => {
      pending = false;
      body.replaceChildren(markdown(reply.content));
      el.setAttribute('data-chunks', String(chunks));
      const box = $('messages');
      box.scrollTop = box.scrollHeight;
    };
    try {
      const resp = await api('/v1/chat/completions', {
        method: 'POST', signal: controller.signal, headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: chat.modelId, messages, stream: true, temperature: st.temperature,
          top_p: st.top_p, max_tokens: st.max_tokens, stream_options: { include_usage: true } }),
      });
      await readSSE(resp, (obj) => {
        if (obj.error) throw new HttpError(obj.error.code || 500, obj.error.message);
        if (obj.usage) usage = obj.usage;
        const ch = obj.choices && obj.choices[0];
        if (!ch) return;
        if (ch.finish_reason) finish = ch.finish_reason;
        const piece = ch.delta && ch.delta.content;
        if (piece) {
          if (tFirst === null) tFirst = performance.now();
          reply.content += piece;
          chunks++;
          if (!pending) { pending = true; requestAnimationFrame(paint); }
        }
      });
      reply.state = 'done';
    } catch (e) {
      if (e.name === 'AbortError') { reply.state = 'stopped'; finish = 'stopped'; }
      else if (e instanceof TypeError) {         // the connection broke while reading
        serverGone();
        reply.state = 'error';
        reply.error = 'The connection to the server broke off (stopped?). The text so far is kept.';
      } else {
        reply.state = 'error';
        reply.error = e instanceof Offline ? 'The server does not answer (stopped?). Nothing was lost: send again when it is back.'
          : 'Error: ' + e.message;
      }
    }
    const tEnd = performance.now();
    paint();
    const n = usage ? usage.completion_tokens : chunks;
    reply.stats = { completion_tokens: n, finish: finish || reply.state,
      prompt_tokens: usage ? usage.prompt_tokens : undefined,
      cached: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0,
      ttft_ms: tFirst !== null ? tFirst - t0 : undefined,
      // decode rate: tokens after the first over the time after it
      tps: tFirst !== null && n > 1 && tEnd > tFirst ? (n - 1) / ((tEnd - tFirst) / 1000) : null };
    statsEl.textContent = reply.error ? '' : statsText(reply.stats);
    if (reply.error) el.append(h('div', { class: 'msg-error' }, reply.error));
    el.setAttribute('data-state', reply.state);
    chat.controller = null;
    setBusy(false);
    saveConvs();
  }

  function initChat() {
    loadSettings();
    for (const id of ['system', 'temperature', 'top-p', 'max-tokens']) $(id).addEventListener('change', saveSettings);
    $('composer').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const text = $('input').value;
      if (!text.trim() || chat.controller) return;
      $('input').value = '';
      send(text);
    });
    $('input').addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $('composer').requestSubmit(); }
    });
    $('stop').addEventListener('click', () => { if (chat.controller) chat.controller.abort(); });
    $('new-chat').addEventListener('click', () => {
      if (chat.controller) return;
      chat.current = null; conv(); renderChat(); showPanel(null); $('input').focus();
    });
    // narrow screens: the conversations and the settings are panels over the chat
    $('show-convs').addEventListener('click', () => showPanel('convs'));
    $('show-settings').addEventListener('click', () => showPanel('settings'));
    renderChat();
  }

  // which side panel is open over the chat on a narrow screen (null: none); a second click closes
  function showPanel(name) {
    const view = $('view-chat');
    const open = name !== null && !view.classList.contains('show-' + name);
    view.classList.remove('show-convs', 'show-settings');
    if (open) view.classList.add('show-' + name);
  }

  // ---- model: the plan --------------------------------------------------------------------------
  // devices get colours of their own; the parts of a device's memory (PART) others
  const PALETTE = ['#7b5cd6', '#12a4a4', '#d0529b', '#b8860b', '#4b8bbe', '#8e44ad', '#5d8c3a', '#c0392b'];
  const MIX = ['#2f6fdf', '#d9822b', '#2e9e6b', '#9b59b6', '#16a2b8', '#c0392b', '#7f8c8d', '#b8860b'];
  const deviceColor = {};
  const colorOf = (dev) => {
    if (!(dev in deviceColor)) deviceColor[dev] = dev === 'CPU' ? '#6b7785' : PALETTE[Object.keys(deviceColor).length % PALETTE.length];
    return deviceColor[dev];
  };
  const PART = { weights: '#2f6fdf', kv: '#2e9e6b', compute: '#d9822b', staging: '#9b59b6', free: '#e6e9ee', over: '#c0392b' };

  const model = { running: null, shown: null };

  function facts(p) {
    const m = p.model, mem = p.mem.plan;
    const row = (k, v) => h('div', { class: 'fact' }, h('span', { class: 'k' }, k), h('span', { class: 'v' }, v));
    const mix = Object.entries(m.quant_mix).map(([t, q]) => [t, q.bytes, q.tensors]);
    const total = mix.reduce((a, [, n]) => a + n, 0) || 1;
    const bar = h('div', { class: 'mix-bar' });
    const legend = h('div', { class: 'legend' });
    mix.forEach(([t, n, nt], k) => {
      const seg = h('span', { class: 'seg', title: `${t}: ${fmtBytes(n)} in ${nt} tensors` });
      seg.style.width = (100 * n / total) + '%';
      seg.style.background = MIX[k % MIX.length];
      bar.append(seg);
      const sw = h('span', { class: 'swatch' }); sw.style.background = MIX[k % MIX.length];
      legend.append(h('span', { class: 'item' }, sw, `${t} ${fmtBytes(n)} (${(100 * n / total).toFixed(1)} %, ${nt} tensors)`));
    });
    return h('div', { class: 'card' }, h('h3', {}, 'Model'),
      h('div', { class: 'facts' },
        m.name ? row('name', m.name) : null, row('file', m.file), row('architecture', m.arch),
        row('parameters', fmtNum(m.n_params / 1e6) + ' M'), row('layers', m.n_layer),
        row('embedding', m.n_embd), row('vocabulary', m.n_vocab),
        row('weights', fmtBytes(m.weight_bytes) + ' in ' + m.n_tensors + ' tensors'),
        row('trained context', m.n_ctx_train),
        row('context', mem.n_ctx + ' cells, ubatch ' + mem.n_ubatch + ', ' + mem.n_seq_max + ' sequence(s)'),
        row('KV types', mem.type_k + ' / ' + mem.type_v + (mem.flash_attn ? ', flash attention' : '')),
        m.sliding_window ? row('sliding window', m.sliding_window) : null,
        m.n_expert ? row('experts', m.n_expert_used + ' of ' + m.n_expert) : null),
      h('h4', {}, 'Quant mix (bytes per tensor type, as in the file)'), bar, legend);
  }

  function deviceBars(devs) {
    const W = 1100, rowH = 34, left = 150, right = 10, top = 18, gap = 32;
    const svg = s('svg', { viewBox: `0 0 ${W} ${top + devs.length * (rowH + gap) + 10}`, class: 'bars', role: 'img',
      'aria-label': 'memory per device' });
    devs.forEach((d, k) => {
      const y = top + k * (rowH + gap);
      const used = d.weights + d.kv + d.compute;
      const free = d.memory ? d.memory[0] : null;
      const cap = free !== null ? Math.max(free, used) : used || 1;
      const scale = (W - left - right) / cap;
      svg.append(s('text', { x: 0, y: y + rowH / 2 + 5, class: 'dev-label' }, d.device));
      svg.append(s('text', { x: 0, y: y + rowH / 2 + 19, class: 'dev-kind' }, d.kind + (d.uma && d.device !== 'CPU' ? ' (system RAM)' : '')));
      let x = left;
      for (const part of ['weights', 'kv', 'compute']) {
        const w = d[part] * scale;
        if (w > 0) svg.append(s('rect', { x, y, width: Math.max(w, 1), height: rowH, fill: PART[part] },
          s('title', {}, `${d.device} ${part === 'kv' ? 'KV cache' : part}: ${fmtBytes(d[part])}`)));
        x += w;
      }
      if (free !== null) {
        const rest = free - used;
        if (rest > 0) svg.append(s('rect', { x, y, width: rest * scale, height: rowH, fill: PART.free },
          s('title', {}, `${d.device} left of free memory: ${fmtBytes(rest)}`)));
        else {                      // past the line: what does not fit
          const xf = left + free * scale;
          svg.append(s('line', { x1: xf, x2: xf, y1: y - 4, y2: y + rowH + 4, stroke: PART.over, 'stroke-width': 3 },
            s('title', {}, `${d.device} free memory: ${fmtBytes(free)}; over by ${fmtBytes(-rest)}`)));
          svg.append(s('text', { x: xf + 5, y: y - 5, class: 'bar-note bad' }, 'free memory ends here'));
        }
      }
      const note = fmtBytes(used) + (free !== null ? ' of ' + fmtBytes(free) + ' free' + (used > free ? ' — does NOT fit' : '') : ' (memory unknown)');
      svg.append(s('text', { x: left, y: y + rowH + 13, class: used > (free ?? Infinity) ? 'bar-note bad' : 'bar-note' }, note));
    });
    const ly = top + devs.length * (rowH + gap) - 2;
    let lx = left;
    for (const [part, label] of [['weights', 'weights'], ['kv', 'KV cache'], ['compute', 'compute buffer'], ['free', 'free memory left']]) {
      svg.append(s('rect', { x: lx, y: ly - 9, width: 12, height: 12, fill: PART[part] }));
      svg.append(s('text', { x: lx + 16, y: ly + 1, class: 'legend-text' }, label));
      lx += 30 + label.length * 7;
    }
    return svg;
  }

  function deviceTable(devs, mem) {
    const cell = (d, field, v) => h('td', { 'data-field': field, 'data-bytes': v === null || v === undefined ? '' : String(v), class: 'num' }, fmtBytes(v));
    const tbody = h('tbody');
    for (const d of devs) {
      const free = d.memory ? d.memory[0] : null;
      const fits = free === null ? '?' : d.total <= free ? 'yes' : 'NO';
      tbody.append(h('tr', { 'data-device': d.device },
        h('td', {}, h('span', { class: 'swatch' }), d.device, d.virtual ? h('span', { class: 'hint' }, ' (planning only)') : null),
        h('td', { title: d.uma || '' }, d.kind + (d.uma && d.device !== 'CPU' ? ' · UMA (system RAM)' : '') + (d.software ? ' · software' : '')),
        cell(d, 'weights', d.weights), cell(d, 'kv', d.kv), cell(d, 'compute', d.compute),
        cell(d, 'staging', d.staging), cell(d, 'total', d.total), cell(d, 'free', free),
        h('td', { 'data-field': 'fits', class: fits === 'NO' ? 'bad' : '' }, fits)));
      tbody.lastChild.querySelector('.swatch').style.background = colorOf(d.device);
    }
    const t = h('table', { id: 'device-table', class: 'grid' },
      h('thead', {}, h('tr', {}, ['device', 'kind', 'weights', 'KV cache', 'compute', 'host staging', 'total', 'free', 'fits'].map((x) => h('th', {}, x)))),
      tbody);
    return h('div', {}, t, h('p', { class: 'hint' },
      `System RAM for buffers: ${fmtBytes(mem.plan.system_ram)} (the CPU's buffers, host staging and every UMA device's). ` +
      'Compute: the allocator\'s planned peak for the worst-case ubatch. Free: as the device reports it now (a virtual device: its declared memory).'));
  }

  function timeline(tl) {
    const out = h('div');
    for (const [phase, t] of Object.entries(tl)) {
      for (const b of t.buffers) {
        const W = 1100, H = 240, L = 64, R = 10, T = 10, B = 24;
        const n = b.live_bytes.length;
        const ymax = Math.max(b.peak, ...b.live_bytes) || 1;
        const X = (i) => L + (W - L - R) * i / Math.max(1, n - 1);
        const Y = (v) => T + (H - T - B) * (1 - v / ymax);
        let d = `M ${X(0)} ${Y(0)}`;
        b.live_bytes.forEach((v, i) => { d += ` L ${X(i)} ${Y(v)}`; if (i + 1 < n) d += ` L ${X(i + 1)} ${Y(v)}`; });
        const area = d + ` L ${X(n - 1)} ${Y(0)} Z`;
        const col = colorOf(b.name);
        const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'timeline', role: 'img', 'aria-label': `${b.name} compute buffer over the graph` },
          s('path', { d: area, fill: col, 'fill-opacity': 0.18, stroke: col, 'stroke-width': 1 }),
          s('line', { x1: L, x2: W - R, y1: Y(b.peak), y2: Y(b.peak), class: 'peak-line' }),
          s('text', { x: W - R - 4, y: Y(b.peak) + 13, class: 'axis', 'text-anchor': 'end' }, 'planned ' + fmtBytes(b.peak)),
          s('line', { x1: X(b.peak_node + 1), x2: X(b.peak_node + 1), y1: T, y2: H - B, class: 'peak-node' }),
          s('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis-line' }),
          s('text', { x: L - 4, y: Y(0) + 4, class: 'axis', 'text-anchor': 'end' }, '0'),
          s('text', { x: L - 4, y: Y(ymax) + 8, class: 'axis', 'text-anchor': 'end' }, fmtBytes(ymax)),
          s('text', { x: L, y: H - 6, class: 'axis' }, 'node 0'),
          s('text', { x: W - R, y: H - 6, class: 'axis', 'text-anchor': 'end' }, 'node ' + (t.n_nodes - 1)));
        const tip = s('text', { x: L + 6, y: T + 12, class: 'tip' }, '');
        svg.append(tip);
        svg.addEventListener('mousemove', (ev) => {
          const r = svg.getBoundingClientRect();
          const x = (ev.clientX - r.left) * W / r.width;
          const i = Math.max(0, Math.min(n - 1, Math.round((x - L) / (W - L - R) * (n - 1))));
          const name = i > 0 ? (t.node_names[i - 1] || 'node ' + (i - 1)) : 'before the first node';
          tip.textContent = `#${i - 1} ${name}: ${fmtBytes(b.live_bytes[i])} alive`;
        });
        const peakName = b.peak_node_name ? ` (${b.peak_node_name})` : '';
        const frag = b.peak - b.max_live;
        const explain = h('div', { class: 'explain' },
          h('p', {}, h('strong', {}, `${b.name}, ${phase}: `),
            `the planned buffer is ${fmtBytes(b.peak)}. Bytes alive peak at node #${b.peak_node}${peakName}: ` +
            `${b.at_peak_n} tensors, ${fmtBytes(b.at_peak_bytes)}. No placement can do with less than that lower bound ` +
            `(${fmtBytes(b.max_live)})` + (frag > 0 ? `; the remaining ${fmtBytes(frag)} is fragmentation.` : '; the plan reaches it.') +
            ` Without any reuse the intermediates would take ${fmtBytes(b.naive)} (${fmtNum(b.naive / b.peak)}×)` +
            (b.peak_no_inplace ? `, without in-place ops ${fmtBytes(b.peak_no_inplace)}.` : '.')),
          h('table', { class: 'grid small' }, h('thead', {}, h('tr', {}, ['alive at the peak', 'op', 'bytes', 'lifetime (nodes)'].map((x) => h('th', {}, x)))),
            h('tbody', {}, b.at_peak.map((r) => h('tr', {}, h('td', { class: 'mono' }, r.tensor), h('td', {}, r.op),
              h('td', { class: 'num' }, fmtBytes(r.size)), h('td', { class: 'num' }, `${r.first} … ${r.last === null ? 'end' : r.last}`))))));
        out.append(h('div', { class: 'tl-item', 'data-buffer': b.name, 'data-phase': phase }, svg, explain));
      }
    }
    return out;
  }

  function layerName(l, nLayer) { return l < 0 ? 'embedding' : l >= nLayer ? 'output' : 'blk.' + l; }

  function layersTable(p) {
    const nLayer = p.model.n_layer;
    const sig = (r) => JSON.stringify([r.weights.map((w) => [w.device, w.rule, w.tensors]),
      r.kv && [r.kv.device, r.kv.rule, r.kv.sliding], r.ops]);
    // consecutive layers placed alike become one row (as `pyggml plan` prints them)
    const runs = [];
    for (const r of p.layers) {
      const last = runs[runs.length - 1];
      if (last && last.sig === sig(r) && r.layer >= 0 && r.layer < nLayer && last.to === r.layer - 1) {
        last.to = r.layer; last.rows.push(r);
      } else runs.push({ from: r.layer, to: r.layer, sig: sig(r), rows: [r] });
    }
    const chip = (dev, text) => {
      const c = h('span', { class: 'chip' }, h('span', { class: 'swatch' }), text);
      c.firstChild.style.background = colorOf(dev);
      return c;
    };
    const tbody = h('tbody');
    for (const run of runs) {
      const r = run.rows[0], k = run.rows.length;
      const name = run.from === run.to ? layerName(run.from, nLayer) : `blk.${run.from}–${run.to}`;
      const wcell = h('td', {}, r.weights.map((w) => h('div', {}, chip(w.device, w.device),
        ` ${fmtBytes(w.bytes * k)} `, h('span', { class: 'rule' }, w.rule), h('div', { class: 'tensors' }, w.tensors.join(' ')))));
      const kvcell = h('td', {}, r.kv ? h('div', {}, chip(r.kv.device, r.kv.device), ` ${fmtBytes(r.kv.bytes * k)} `,
        h('span', { class: 'rule' }, r.kv.rule), r.kv.sliding ? h('span', { class: 'hint' }, ' sliding window') : null) : '–');
      const ocell = h('td', {}, Object.entries(r.ops).map(([ph, ops]) => h('div', {},
        Object.keys(r.ops).length > 1 ? h('span', { class: 'hint' }, ph + ': ') : null,
        ops.map((o) => h('span', { class: 'cause', title: 'scheduler cause ' + o.cause }, chip(o.device, `${o.cause} ×${o.n}`))))));
      tbody.append(h('tr', { 'data-layers': `${run.from}-${run.to}` }, h('td', { class: 'mono' }, name), wcell, kvcell, ocell));
    }
    return h('div', {},
      h('table', { class: 'grid layers' }, h('thead', {}, h('tr', {}, ['layers', 'weights: device, bytes, rule', 'KV cache: device, bytes, rule', 'ops per layer: device and scheduler cause'].map((x) => h('th', {}, x)))), tbody),
      h('p', { class: 'hint' }, 'Rules come from the offload config or flags (-ngl, -ot, YAML rule names). Scheduler causes: 1.wgt = runs where its weight is, ' +
        '1.off = moved to a GPU although its weight is in host memory (op offload), 1.dst = its output is already in a buffer, 2.gd/2.gu/2.rd/2.ru = spread from a neighbour, ' +
        '3.upg = upgraded to a higher-priority device, 4.* = fallbacks (see pyggml/sched.py). Views are not counted.'));
  }

  function layerStrip(p) {
    const n = p.layers.length, W = 1100, cw = Math.min(24, (W - 90) / n), H = 3 * 16 + 8;
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'strip', role: 'img', 'aria-label': 'device per layer' });
    const rows = [['weights', (r) => r.weights.length ? r.weights.reduce((a, b) => (a.bytes >= b.bytes ? a : b)).device : null],
      ['KV cache', (r) => r.kv && r.kv.device],
      ['ops', (r) => { const ops = r.ops.prefill || Object.values(r.ops)[0]; return ops && ops.length ? ops[0].device : null; }]];
    rows.forEach(([label, pick], j) => {
      svg.append(s('text', { x: 0, y: 4 + j * 16 + 11, class: 'axis' }, label));
      p.layers.forEach((r, i) => {
        const dev = pick(r);
        if (dev) svg.append(s('rect', { x: 90 + i * cw, y: 4 + j * 16, width: cw - 1, height: 14, fill: colorOf(dev) },
          s('title', {}, `${layerName(r.layer, p.model.n_layer)} ${label}: ${dev}`)));
      });
    });
    return svg;
  }

  /** Devices that do not fit, and the changes that fit (pyggml plan --check-fit's), each a
   * button that plans again with its --set items added to the flags. */
  function fitBox(p) {
    if (!p.not_fitting || !p.not_fitting.length) return null;
    const box = h('div', { id: 'fit-box', class: 'fit-box' },
      h('strong', {}, p.not_fitting.join(', ') + (p.not_fitting.length > 1 ? ' do' : ' does') + ' not fit. '));
    const changes = p.fit_changes || [];
    if (!changes.length) {
      box.append(p.fit_changes ? 'No single change tried (KV cache on the CPU, fewer gpu_layers, a smaller n_ctx or n_ubatch) makes it fit.' : '');
      return box;
    }
    box.append('Changes that fit, smallest move first:');
    const ul = h('ul');
    for (const c of changes) {
      const flags = c.sets.map((x) => '--set ' + x).join(' ');
      const btn = h('button', { class: 'small', type: 'button', 'data-sets': c.sets.join(' ') }, 'plan with ' + flags);
      btn.addEventListener('click', () => {
        const args = ((p.source.args || []).join(' ') + ' ' + flags).trim();
        $('plan-args').value = args;
        $('plan-config').value = p.source.config || '';
        $('plan-run').click();
      });
      ul.append(h('li', {}, `${c.what}: moves ${fmtBytes(c.moved)} off ${p.not_fitting.join(', ')} `, btn));
    }
    box.append(ul);
    return box;
  }

  function renderPlan(p) {
    const mem = p.mem, devs = mem.plan.devices;
    devs.forEach((d) => colorOf(d.device));
    const src = p.source.kind === 'running' ? 'The plan of the run being served (its offload plan and sizes).'
      : 'What-if plan: pyggml mem --plan-only ' + (p.source.args || []).join(' ') + (p.source.config ? ' with the config above' : '') + '.';
    $('plan-source').textContent = src + ` Planned in ${fmtNum(p.plan_seconds * 1000, 0)} ms.`;
    const warn = (mem.plan.warnings || []).concat(mem.notes || []);
    const legend = h('div', { class: 'legend' }, devs.map((d) => {
      const sw = h('span', { class: 'swatch' }); sw.style.background = colorOf(d.device);
      return h('span', { class: 'item' }, sw, d.device);
    }));
    $('plan-body').replaceChildren(
      facts(p),
      h('div', { class: 'card' }, h('h3', {}, 'Memory per device'), deviceBars(devs), deviceTable(devs, mem), fitBox(p),
        p.source.kind !== 'running' && mem.plan.llama && mem.plan.llama.length ? h('p', { class: 'hint' }, 'llama.cpp: ', h('code', {}, mem.plan.llama.join(' '))) : null,
        warn.length ? h('ul', { class: 'warnings' }, warn.map((w) => h('li', {}, w))) : null),
      h('div', { class: 'card' }, h('h3', {}, 'Where each layer lives'), legend, layerStrip(p), layersTable(p)),
      h('div', { class: 'card' }, h('h3', {}, 'Compute buffer over the graph (bytes alive per node, worst-case ubatch)'),
        h('p', { class: 'hint' }, 'Move the mouse over a chart to see the node and the bytes alive. Dashed: the planned buffer; vertical line: the peak.'),
        timeline(p.timeline)));
  }

  async function showPlan(body) {
    const view = $('view-model');
    view.setAttribute('data-state', 'loading');
    $('plan-error').classList.add('hidden');
    if (!model.shown) $('plan-body').replaceChildren(h('p', { class: 'hint' }, 'Planning…'));
    try {
      let p;
      if (body) p = await getJSON('/v1/pyggml/plan', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      else p = model.running || (model.running = await getJSON('/v1/pyggml/plan'));
      model.shown = p;
      renderPlan(p);
      view.setAttribute('data-state', 'ready');
    } catch (e) {
      $('plan-error').textContent = e instanceof Offline ? 'The server does not answer.' : 'Could not plan: ' + e.message;
      $('plan-error').classList.remove('hidden');
      view.setAttribute('data-state', 'error');
    }
  }

  function initModel() {
    $('plan-args').value = store.get('planArgs', '');
    $('plan-config').value = store.get('planConfig', '');
    if ($('plan-config').value) $('plan-config-box').open = true;
    $('plan-run').addEventListener('click', () => {
      const args = $('plan-args').value.trim(), config = $('plan-config').value;
      store.set('planArgs', args); store.set('planConfig', config);
      if (!args && !config.trim()) { showPlan(null); return; }
      showPlan({ args, config: config.trim() ? config : null });
    });
    $('plan-args').addEventListener('keydown', (ev) => { if (ev.key === 'Enter') $('plan-run').click(); });
    $('plan-reset').addEventListener('click', () => showPlan(null));
  }

  // ---- live -------------------------------------------------------------------------------------
  let liveTimer = null;

  function card(id, label, value, sub) {
    return h('div', { class: 'card stat', id }, h('div', { class: 'stat-label' }, label),
      h('div', { class: 'stat-value' }, value), h('div', { class: 'stat-sub' }, sub || ''));
  }

  function renderLive(L) {
    const gen = L.tokens_per_second.generated, pr = L.tokens_per_second.prompt;
    const done = gen.slice(0, -1);                     // the last second is still counting
    const lastFull = done[done.length - 1] || 0;
    const avg = done.reduce((a, b) => a + b, 0) / Math.max(1, done.length);
    $('live-cards').replaceChildren(
      card('live-slots-busy', 'slots busy', `${L.slots_busy} / ${L.slots_total}`, 'requests being served'),
      card('live-queue', 'queue', `${L.queue_length}`, `waiting for a slot (at most ${L.queue_size})`),
      card('live-kv', 'KV cells used', `${L.kv_cells_used} / ${L.kv_cells_total}`, fmtNum(100 * L.kv_cells_used / Math.max(1, L.kv_cells_total)) + ' % of the cache'),
      card('live-tps', 'generated tokens/s', `${lastFull}`, `last second; ${fmtNum(avg)} average over the last minute`),
      card('live-totals', 'since start', `${L.totals.generated_tokens}`, `tokens generated, ${L.totals.prompt_tokens} prompt tokens evaluated, ${L.totals.requests} requests`));
    // tokens per second: bars (generated) and a line (prompt tokens), 60 s
    const W = 1100, H = 230, Lm = 46, R = 8, T = 26, B = 22, n = gen.length;   // legend above T
    const ymax = Math.max(4, ...gen, ...pr);
    const bw = (W - Lm - R) / n;
    const Y = (v) => T + (H - T - B) * (1 - v / ymax);
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'live-chart', role: 'img', 'aria-label': 'tokens per second' });
    svg.append(s('line', { x1: Lm, x2: W - R, y1: Y(0), y2: Y(0), class: 'axis-line' }));
    svg.append(s('text', { x: Lm - 4, y: Y(ymax) + 8, class: 'axis', 'text-anchor': 'end' }, String(ymax)));
    svg.append(s('text', { x: Lm - 4, y: Y(0) + 4, class: 'axis', 'text-anchor': 'end' }, '0'));
    svg.append(s('text', { x: Lm, y: H - 6, class: 'axis' }, `-${n} s`));
    svg.append(s('text', { x: W - R, y: H - 6, class: 'axis', 'text-anchor': 'end' }, 'now'));
    gen.forEach((v, i) => {
      if (v > 0) svg.append(s('rect', { x: Lm + i * bw + 1, y: Y(v), width: bw - 2, height: Y(0) - Y(v), fill: PART.weights },
        s('title', {}, `${v} tokens generated, ${pr[i]} prompt tokens (${n - 1 - i} s ago)`)));
    });
    let d = '';
    pr.forEach((v, i) => { d += (i ? ' L ' : 'M ') + (Lm + (i + 0.5) * bw) + ' ' + Y(v); });
    svg.append(s('path', { d, fill: 'none', stroke: PART.compute, 'stroke-width': 1.5 }));
    const lx = W - R - 300;
    const lg = s('g', {}, s('rect', { x: lx, y: 2, width: 10, height: 10, fill: PART.weights }),
      s('text', { x: lx + 14, y: 11, class: 'legend-text' }, 'generated tokens'),
      s('line', { x1: lx + 130, x2: lx + 146, y1: 7, y2: 7, stroke: PART.compute, 'stroke-width': 2 }),
      s('text', { x: lx + 150, y: 11, class: 'legend-text' }, 'prompt tokens evaluated'));
    svg.append(lg);
    $('live-chart').replaceChildren(svg);
    $('live-slots').replaceChildren(...L.slots.map((sl) => {
      const pct = 100 * sl.kv_cells / Math.max(1, sl.n_ctx_slot);
      const fill = h('div', { class: 'fill ' + sl.state }); fill.style.width = Math.min(100, pct) + '%';
      const detail = sl.state === 'idle' ? (sl.kv_cells ? 'idle, keeps its prefix cache' : 'idle')
        : sl.state === 'prompt' ? `evaluating the prompt (${sl.prompt_left} of ${sl.prompt_tokens} tokens left)`
          : sl.state === 'generating' ? `generating: ${sl.generated} tokens so far` : sl.state;
      return h('div', { class: 'slot', 'data-slot': sl.id, 'data-state': sl.state },
        h('div', { class: 'slot-name' }, 'slot ' + sl.id), h('div', { class: 'meter' }, fill),
        h('div', { class: 'slot-info' }, `${sl.kv_cells} / ${sl.n_ctx_slot} cells · ${detail}`));
    }));
    $('view-live').setAttribute('data-updated', String(L.time));
  }

  async function pollLive() {
    if (keyPrompt) return;                          // one request waits for the key already
    try { renderLive(await getJSON('/v1/pyggml/live')); }
    catch (e) { /* the banner says it */ }
  }
  function startLive() { stopLive(); pollLive(); liveTimer = setInterval(pollLive, 1000); }
  function stopLive() { if (liveTimer) clearInterval(liveTimer); liveTimer = null; }

  // ---- views ------------------------------------------------------------------------------------
  function route() {
    const v = (location.hash || '#chat').slice(1);
    const view = ['chat', 'model', 'live'].includes(v) ? v : 'chat';
    for (const x of ['chat', 'model', 'live']) {
      $('view-' + x).classList.toggle('hidden', x !== view);
      $('tab-' + x).classList.toggle('active', x === view);
    }
    if (view === 'live') startLive(); else stopLive();
    if (view === 'model' && !model.shown) showPlan(null);
    if (view === 'chat') $('input').focus();
  }

  async function start() {
    $('key-button').addEventListener('click', () => askKey(null));
    $('key-forget').addEventListener('click', () => { store.del('apiKey'); $('key-input').value = ''; });
    initChat();
    initModel();
    window.addEventListener('hashchange', route);
    heartbeat = setInterval(beat, 5000);
    route();
    try {
      const models = await getJSON('/v1/models');
      const m = models.data && models.data[0];
      if (m) {
        chat.modelId = m.id;
        $('model-name').textContent = m.id + (m.meta ? ` · ${m.meta.n_slots} slots × ${m.meta.n_ctx_slot} tokens` : '');
        document.title = 'pyggml · ' + m.id;
      }
      if (store.get('apiKey', '')) $('key-button').classList.remove('hidden');
      renderChat();
    } catch (e) { /* the banner or the key dialog says it */ }
    document.body.setAttribute('data-ready', '1');
  }
  document.addEventListener('DOMContentLoaded', start);
})();
