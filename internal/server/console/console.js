// The idemd console. Everything a record holds (keys, owners, headers, bodies) is data
// from idemd's clients, so it reaches the page only as text: through textContent,
// text nodes and createElement, never as markup. The Content-Security-Policy the
// daemon sends would block an injected script anyway; this keeps one from being made.
// Each such string is also put in an isolate of its own (clientText), with its invisible
// characters shown as what they are, so that a right-to-left override in a key cannot
// turn the page's own words around it.
'use strict';

(() => {
  const TOKEN_KEY = 'idemd-console-token';
  const TEXT_PREVIEW_BYTES = 4096;
  const HEX_PREVIEW_BYTES = 512;
  const TRAFFIC_EVERY_MS = 2000;
  const OUTCOMES = ['acquired', 'replayed', 'in_progress', 'fingerprint_mismatch', 'other'];
  const OUTCOME_LABELS = {
    acquired: 'acquired', replayed: 'replayed', in_progress: 'in progress',
    fingerprint_mismatch: 'fingerprint mismatch', other: 'other',
  };

  const $ = (id) => document.getElementById(id);

  // The token lives in this tab's sessionStorage: it goes in the Authorization header
  // of each call below and nowhere else, so no cookie can carry it to idemd on another
  // site's behalf.
  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    who: null,
    tenant: '',
    // skewMs is the daemon's clock minus this browser's, so that a countdown counts
    // against the clock that decides when a lease runs out.
    skewMs: 0,
    record: null,
    feedCursor: '',
    trafficTimer: 0,
    // pointed is, by chart, the second the pointer is on (its time), or null.
    pointed: {},
    // latest numbers each view's requests, so that an answer that arrives after a
    // later request's is dropped instead of drawn over it.
    latest: { record: 0, feed: 0, traffic: 0 },
  };

  // ticket starts a request of a view; current says whether it is still the view's last.
  function ticket(view) {
    const n = ++state.latest[view];
    return { current: () => state.latest[view] === n };
  }

  // el makes an element; strings among the children become text nodes, never markup.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === 'class') {
        e.className = value;
      } else {
        e.setAttribute(name, value);
      }
    }
    for (const c of children) {
      if (c !== null && c !== undefined) {
        e.append(c instanceof Node ? c : document.createTextNode(String(c)));
      }
    }
    return e;
  }

  // INVISIBLE matches a character that draws nothing, or changes how the text around it
  // is drawn: controls, format characters (the bidi embeddings, overrides, isolates and
  // marks, zero-width spaces and joiners, the byte order mark), line and paragraph
  // separators, spaces other than U+0020, and the Hangul fillers.
  const INVISIBLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Zs}\u115F\u1160\u3164\uFFA0]/u;
  const INVISIBLE_NAMES = {
    '00A0': 'no-break space', '061C': 'Arabic letter mark', '200B': 'zero-width space',
    '200C': 'zero-width non-joiner', '200D': 'zero-width joiner', '200E': 'left-to-right mark',
    '200F': 'right-to-left mark', '202A': 'left-to-right embedding', '202B': 'right-to-left embedding',
    '202C': 'pop directional formatting', '202D': 'left-to-right override', '202E': 'right-to-left override',
    '2060': 'word joiner', '2066': 'left-to-right isolate', '2067': 'right-to-left isolate',
    '2068': 'first strong isolate', '2069': 'pop directional isolate', FEFF: 'zero-width no-break space',
  };

  // visible is text with each invisible character replaced by a visible mark naming it
  // (U+202E), as a fragment of text nodes and marks. lines keeps tabs and line breaks,
  // for bodies.
  function visible(text, lines) {
    const out = document.createDocumentFragment();
    let plain = '';
    for (const ch of String(text)) {
      if (ch === ' ' || !INVISIBLE.test(ch) || (lines && (ch === '\n' || ch === '\t' || ch === '\r'))) {
        plain += ch;
        continue;
      }
      if (plain) out.append(plain);
      plain = '';
      const hex = ch.codePointAt(0).toString(16).toUpperCase().padStart(4, '0');
      out.append(el('span', { class: 'invisible', title: INVISIBLE_NAMES[hex] || 'an invisible character' }, `U+${hex}`));
    }
    if (plain) out.append(plain);
    return out;
  }

  // clientText is a string of a client's, in an isolate (bdi) of its own: its
  // direction is its own and goes no further.
  function clientText(text) {
    return el('bdi', { class: 'client' }, visible(text));
  }

  // clientCode is clientText in code.
  function clientCode(text) {
    return el('code', null, clientText(text));
  }

  class ProblemError extends Error {
    constructor(status, problem) {
      const p = problem || {};
      super(`${status} ${p.code || ''}: ${p.detail || p.title || 'request failed'}`);
      this.status = status;
      this.code = p.code || '';
      this.detail = p.detail || '';
    }
  }

  // call sends one request of the console to its own origin, with the token.
  async function call(method, path, params) {
    const url = new URL(path, window.location.origin);
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== '') {
        url.searchParams.set(name, value);
      }
    }
    const headers = {};
    if (state.token) {
      headers.Authorization = `Bearer ${state.token}`;
    }
    const sent = Date.now();
    const resp = await fetch(url, { method, headers, credentials: 'omit', cache: 'no-store', redirect: 'error' });
    const received = Date.now();
    let body = null;
    const text = resp.status === 204 ? '' : await resp.text();
    if (text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = { detail: text };
      }
    }
    if (!resp.ok) {
      throw new ProblemError(resp.status, body);
    }
    const date = Date.parse(resp.headers.get('Date') || '');
    return { body, midpoint: (sent + received) / 2, date };
  }

  const ownTenant = () => state.who && state.tenant === state.who.tenant;
  const can = (scope) => state.who && state.who.scopes.includes(scope);
  // The store view says where the store is and how it replicates: the platform's, or
  // everyone's when idemd runs open.
  const storeAllowed = () => state.who && (state.who.open || can('platform'));

  // Durations read at a glance: tenths of a second when they are short.
  function duration(ms) {
    const s = Math.max(0, ms) / 1000;
    if (s < 10) return `${s.toFixed(1)} s`;
    if (s < 60) return `${Math.floor(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.floor(s % 60)).padStart(2, '0')} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  // live makes a span that the ticker keeps up to date: "until" counts down to at,
  // "since" counts up from it, "relative" says either.
  function live(at, mode) {
    const span = el('span', { class: 'live' });
    span.dataset.at = String(at);
    span.dataset.mode = mode;
    tickOne(span, Date.now() + state.skewMs);
    return span;
  }

  function tickOne(span, now) {
    const at = Number(span.dataset.at);
    const d = at - now;
    switch (span.dataset.mode) {
      case 'until':
        span.textContent = d > 0 ? `in ${duration(d)}` : `ran out ${duration(-d)} ago`;
        span.classList.toggle('expired', d <= 0);
        break;
      case 'since':
        span.textContent = duration(-d);
        break;
      default:
        span.textContent = d >= 0 ? `in ${duration(d)}` : `${duration(-d)} ago`;
    }
  }

  function tick() {
    const now = Date.now() + state.skewMs;
    for (const span of document.querySelectorAll('.live')) {
      tickOne(span, now);
    }
  }

  function when(iso, mode) {
    if (!iso) return '—';
    const at = Date.parse(iso);
    return el('span', null, iso, ' (', live(at, mode || 'relative'), ')');
  }

  // showError says what went wrong. A problem's detail may quote what was sent, so it
  // is shown with its invisible characters marked; an error of the page's own may carry
  // its words as nodes.
  function showError(id, err) {
    if (!err) {
      $(id).replaceChildren();
    } else if (err.nodes) {
      $(id).replaceChildren(...err.nodes);
    } else {
      $(id).replaceChildren(clientText(err instanceof ProblemError ? err.message : String(err)));
    }
  }

  // Bytes: text when they are UTF-8 without control characters, else hex.
  function bytesOf(base64) {
    const bin = atob(base64 || '');
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function preview(bytes, id) {
    const size = el('p', { class: 'muted' }, `${bytes.length} bytes`);
    if (bytes.length === 0) return el('div', null, size);
    let text = null;
    try {
      // stream: a character cut by the preview's end is not an error.
      text = new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(0, TEXT_PREVIEW_BYTES), { stream: true });
      // eslint-disable-next-line no-control-regex
      if (/[\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F]/.test(text)) text = null;
    } catch {
      text = null;
    }
    let shown;
    if (text !== null) {
      shown = el('pre', { class: 'body', id, dir: 'auto' }, visible(text, true));
      if (bytes.length > TEXT_PREVIEW_BYTES) size.append(`, the first ${TEXT_PREVIEW_BYTES} shown as text`);
      else size.append(', as text');
    } else {
      const n = Math.min(bytes.length, HEX_PREVIEW_BYTES);
      const lines = [];
      for (let off = 0; off < n; off += 16) {
        const row = Array.from(bytes.subarray(off, Math.min(off + 16, n)), (b) => b.toString(16).padStart(2, '0'));
        lines.push(`${off.toString(16).padStart(6, '0')}  ${row.join(' ')}`);
      }
      shown = el('pre', { class: 'body hex', id }, lines.join('\n'));
      size.append(`, binary: the first ${n} in hex`);
    }
    return el('div', null, size, shown);
  }

  // sealedNote describes an envelope a client sealed (docs/sealing.md): its version and
  // the id of the key that opens it, which the console does not hold.
  function sealedNote(bytes) {
    const n = bytes.length > 2 ? bytes[2] : 0;
    if (bytes.length < 3 + n || bytes[0] !== 0xc1) return `sealed, ${bytes.length} bytes, not an envelope this console reads`;
    const id = String.fromCharCode(...bytes.subarray(3, 3 + n));
    return `sealed by its client with key ${id} (envelope version ${bytes[1]}), ${bytes.length} bytes: not readable here`;
  }

  function field(dl, label, value, id) {
    const dd = el('dd', id ? { id } : null, value === '' || value === null || value === undefined ? '—' : value);
    dl.append(el('dt', null, label), dd);
  }

  // ---- signing in ----

  async function start() {
    setInterval(tick, 200);
    $('signin-form').addEventListener('submit', signIn);
    $('sign-out').addEventListener('click', signOut);
    $('tenant').addEventListener('change', () => {
      const view = parseLink().view;
      navigate(link(view === 'tenant' ? 'overview' : view, { tenant: $('tenant').value }));
    });
    // Back, forward, and a link followed in the page all change the fragment.
    window.addEventListener('hashchange', () => route());
    for (const radio of document.querySelectorAll('input[name="mode"]')) {
      radio.addEventListener('change', () => {
        const middleware = $('mode-middleware').checked;
        $('fields-key').hidden = middleware;
        $('fields-middleware').hidden = !middleware;
      });
    }
    $('inspect-form').addEventListener('submit', inspect);
    $('purge').addEventListener('click', askPurge);
    $('purge-no').addEventListener('click', () => { $('purge-confirm').hidden = true; });
    $('purge-yes').addEventListener('click', purge);
    $('abandoned-form').addEventListener('submit', (e) => {
      e.preventDefault();
      navigate(link('abandoned', { tenant: state.tenant, prefix: $('abandoned-prefix').value }));
    });
    $('abandoned-next').addEventListener('click', () => loadAbandoned(state.feedCursor));
    $('store-refresh').addEventListener('click', loadStore);
    try {
      const r = await call('GET', '/console/api/whoami');
      await signedIn(r.body);
    } catch (err) {
      showSignIn(state.token && err.status === 401 ? 'The stored token is no longer accepted; sign in again.' : '');
    }
  }

  function showSignIn(message) {
    state.token = '';
    state.who = null;
    sessionStorage.removeItem(TOKEN_KEY);
    stopTraffic();
    $('signin').hidden = false;
    $('who').hidden = true;
    $('tabs').hidden = true;
    for (const v of document.querySelectorAll('.view')) v.hidden = true;
    $('signin-error').textContent = message || '';
    $('token').focus();
  }

  async function signIn(e) {
    e.preventDefault();
    state.token = $('token').value.trim();
    $('token').value = '';
    try {
      const r = await call('GET', '/console/api/whoami');
      sessionStorage.setItem(TOKEN_KEY, state.token);
      await signedIn(r.body);
    } catch (err) {
      showSignIn(err.status === 401 ? 'idemd does not know this token.' : String(err.message || err));
    }
  }

  function signOut() {
    showSignIn('');
    clearRecord();
  }

  async function signedIn(who) {
    state.who = who;
    state.tenant = who.tenant;
    $('signin').hidden = true;
    $('who').hidden = false;
    $('tabs').hidden = false;
    $('tab-store').hidden = !storeAllowed();
    $('open-note').hidden = !who.open;
    $('sign-out').hidden = who.open;
    $('tenant-name').textContent = who.tenant;
    $('who-token').textContent = who.open ? 'no auth file' : `token ${who.token || '(unnamed)'}`;
    $('who-scopes').textContent = `scopes: ${who.scopes.join(', ')}`;
    const select = $('tenant');
    select.replaceChildren();
    select.hidden = true;
    $('tenant-name').hidden = false;
    if (can('platform')) {
      const r = await call('GET', '/console/api/tenants');
      for (const t of r.body.tenants) {
        const option = el('option', null, t);
        option.value = t;
        select.append(option);
      }
      select.value = state.tenant;
      select.hidden = false;
      $('tenant-name').hidden = true;
    }
    route();
  }

  // ---- views and their links ----
  //
  // Every view has a URL, so that an alert or a colleague can link straight to it:
  //   #/overview                          every tenant the token may see
  //   #/tenants/<tenant>                  the overview at one tenant's line
  //   #/records?tenant=<t>&key=<key>      a key in the inspector
  //   #/abandoned?tenant=<t>&prefix=<p>   a tenant's abandoned keys
  //   #/traffic?tenant=<t>                a tenant's traffic
  //   #/store                             the store
  // The parameters are a query string (URLSearchParams), which encodes every character
  // that would end or change it ('&', '#', '?', '%', '+', '/'), and any that is not
  // ASCII, so that any key survives the round trip; in a fragment no dot segment is
  // resolved. The page opens the view its URL names, on load as well; navigating
  // writes a new URL, so that back and forward return through the views.

  // VIEWS maps a link's first path segment to its view.
  const VIEWS = { overview: 'overview', tenants: 'overview', records: 'inspect', abandoned: 'abandoned', traffic: 'traffic', store: 'store' };

  // link is the fragment of a view ('tenant' for a tenant's line in the overview).
  function link(view, params) {
    const p = params || {};
    if (view === 'tenant') return `#/tenants/${encodeURIComponent(p.tenant)}`;
    const q = new URLSearchParams();
    if (view !== 'overview' && view !== 'store') {
      for (const name of ['tenant', 'key', 'prefix']) if (p[name]) q.set(name, p[name]);
    }
    const path = view === 'inspect' ? 'records' : view;
    return q.toString() ? `#/${path}?${q}` : `#/${path}`;
  }

  // parseLink reads the page's fragment: the view, the tenant it names ('' for none)
  // and its other parameters. A fragment of the console's older links (#traffic) is
  // read as the view it names.
  function parseLink() {
    const hash = window.location.hash.slice(1);
    const at = hash.indexOf('?');
    const path = (at < 0 ? hash : hash.slice(0, at)).replace(/^\//, '');
    const q = new URLSearchParams(at < 0 ? '' : hash.slice(at + 1));
    const [first, second] = path.split('/');
    const name = first === 'inspect' ? 'records' : first;
    if (name === 'tenants' && second) {
      let tenant = '';
      try {
        tenant = decodeURIComponent(second);
      } catch {
        tenant = '';
      }
      return { view: 'tenant', tenant, params: {} };
    }
    const view = Object.hasOwn(VIEWS, name) ? VIEWS[name] : 'overview';
    return { view, tenant: q.get('tenant') || '', params: { key: q.get('key') || '', prefix: q.get('prefix') || '' } };
  }

  // navigate opens a view's link as a new step of the tab's history.
  function navigate(fragment) {
    if (window.location.hash !== fragment) window.history.pushState(null, '', fragment);
    route();
  }

  // setTenant makes tenant the one the views act in.
  function setTenant(tenant) {
    if (!tenant || tenant === state.tenant) return;
    state.tenant = tenant;
    const select = $('tenant');
    if ([...select.options].some((o) => o.value === tenant)) select.value = tenant;
    clearRecord();
  }

  // route shows the view the URL names, in the tenant it names, and writes the URL
  // out in full (with the tenant the view acts in) in place of the one it read.
  function route(derived) {
    if (!state.who) return;
    const at = parseLink();
    setTenant(at.tenant);
    const allowed = storeAllowed() ? ['overview', 'inspect', 'abandoned', 'traffic', 'store'] : ['overview', 'inspect', 'abandoned', 'traffic'];
    const known = at.view === 'tenant' ? 'overview' : (allowed.includes(at.view) ? at.view : 'overview');
    const canonical = at.view === 'tenant' ? link('tenant', { tenant: at.tenant })
      : link(known, { tenant: state.tenant, key: at.params.key, prefix: at.params.prefix });
    if (window.location.hash !== canonical) window.history.replaceState(null, '', canonical);
    for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== `view-${known}`;
    for (const a of document.querySelectorAll('#tabs a')) {
      if (a.id === `tab-${known}`) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    $('tab-overview').href = link('overview');
    $('tab-inspect').href = link('inspect', { tenant: state.tenant });
    $('tab-abandoned').href = link('abandoned', { tenant: state.tenant });
    $('tab-traffic').href = link('traffic', { tenant: state.tenant });
    $('tab-store').href = link('store');
    stopTraffic();
    if (known === 'abandoned') {
      $('abandoned-prefix').value = at.params.prefix;
      loadAbandoned('');
    }
    if (known === 'traffic') startTraffic();
    if (known === 'store') loadStore();
    if (known === 'overview') loadOverview(at.view === 'tenant' ? at.tenant : '');
    if (known === 'inspect') showKey(at.params.key, derived);
    updatePurge();
  }

  // showKey opens the key a link names in the inspector, unless it shows it already.
  function showKey(key, derived) {
    if (!key) {
      clearRecord();
      return;
    }
    if (!derived) {
      $('mode-key').checked = true;
      $('fields-key').hidden = false;
      $('fields-middleware').hidden = true;
      $('key').value = key;
    }
    if (state.record && state.record.key === key && state.record.tenant === state.tenant && !derived) return;
    clearRecord();
    lookup(key, derived || null).catch((err) => showError('inspect-error', err));
  }

  // ---- the tenants' overview ----

  async function loadOverview(tenant) {
    showError('overview-error', null);
    try {
      const r = await call('GET', '/console/api/overview');
      renderOverview(r.body, tenant);
    } catch (err) {
      showError('overview-error', err);
    }
  }

  // renderOverview draws the tenants' lines, marking the line of tenant when a link
  // named it.
  function renderOverview(o, tenant) {
    $('overview-scope').textContent = `Served by daemon ${o.daemon}: ${o.scope}.`;
    const count = (n) => (n === null || n === undefined ? '—' : formatNumber(n));
    const rows = o.tenants.map((t) => {
      const quota = t.max_records || t.max_stored_bytes ? `${Math.round(t.quota_percent)}%` : 'no quota';
      const button = (view, label) => el('a', { href: link(view, { tenant: t.tenant }), class: `overview-${view}` }, label);
      const links = el('td', null, button('traffic', 'Traffic'), ' ', button('abandoned', 'Abandoned'), ' ', button('inspect', 'Keys'));
      const pending = t.pending === null || t.pending === undefined ? '—' : `${t.pending_capped ? '≥ ' : ''}${formatNumber(t.pending)}`;
      const row = el('tr', null,
        el('td', null, el('a', { href: link('tenant', { tenant: t.tenant }) }, t.tenant)),
        el('td', null, count(t.records) + (t.max_records ? ` of ${formatNumber(t.max_records)}` : '')),
        el('td', null, count(t.stored_bytes) + (t.max_stored_bytes ? ` of ${formatNumber(t.max_stored_bytes)}` : '')),
        el('td', null, t.usage_error ? t.usage_error : quota),
        el('td', { class: 'pending' }, pending),
        el('td', null, count(t.abandoned)),
        el('td', null, t.claims_per_second.toFixed(2)),
        el('td', null, t.refused_per_second.toFixed(2)),
        links);
      row.dataset.tenant = t.tenant;
      if (t.tenant === tenant) row.setAttribute('aria-current', 'true');
      return row;
    });
    $('overview-rows').replaceChildren(...rows);
    const marked = $('overview-rows').querySelector('tr[aria-current]');
    if (marked) marked.scrollIntoView({ block: 'nearest' });
    $('overview-fill').textContent = o.store_fill === null || o.store_fill === undefined
      ? 'The store has no limit to fill.'
      : `The store is ${Math.round(o.store_fill * 100)}% full.`;
  }

  // ---- the key inspector ----

  function clearRecord() {
    state.record = null;
    $('record').hidden = true;
    showError('inspect-error', null);
  }

  async function inspect(e) {
    e.preventDefault();
    clearRecord();
    $('purge-result').textContent = '';
    try {
      let key = $('key').value;
      let derived = null;
      if ($('mode-middleware').checked) {
        derived = { scope: $('scope').value, idempotencyKey: $('idem-key').value, prefix: $('prefix').value };
        const r = await call('GET', '/console/api/derive',
          { scope: derived.scope, idempotency_key: derived.idempotencyKey, prefix: derived.prefix });
        key = r.body.key;
      }
      if (!key) throw new Error('key: give the key to look up');
      // The key's link goes in the URL; the inspector then looks it up (again, when
      // the URL already named it).
      state.record = null;
      const fragment = link('inspect', { tenant: state.tenant, key });
      if (window.location.hash !== fragment) window.history.pushState(null, '', fragment);
      route(derived);
    } catch (err) {
      showError('inspect-error', err);
    }
  }

  async function lookup(key, derived) {
    const t = ticket('record');
    let r;
    try {
      r = await call('GET', '/console/api/records', { tenant: state.tenant, key });
    } catch (err) {
      if (err.status === 404 && err.code === 'not_found') {
        const missing = new Error(`tenant ${state.tenant} has no record of the key ${key}`);
        missing.nodes = [`tenant ${state.tenant} has no record of the key `, clientCode(key)];
        throw missing;
      }
      throw err;
    }
    if (!t.current()) return;
    state.skewMs = Date.parse(r.body.server_time) - r.midpoint;
    state.record = r.body;
    renderRecord(r.body, derived);
  }

  function renderRecord(rec, derived) {
    const dl = $('rec-fields');
    dl.replaceChildren();
    field(dl, 'key', clientCode(rec.key), 'f-key');
    if (derived) {
      const from = el('span', null, 'scope ', clientCode(derived.scope), ', Idempotency-Key ',
        clientCode(derived.idempotencyKey));
      if (derived.prefix) from.append(', prefix ', clientCode(derived.prefix));
      field(dl, 'derived from', from, 'f-derived');
    }
    field(dl, 'tenant', rec.tenant, 'f-tenant');
    const stateClass = ['pending', 'completed', 'failed'].includes(rec.state) ? `state state-${rec.state}` : 'state';
    field(dl, 'state', el('span', { class: stateClass }, rec.state), 'f-state');
    field(dl, 'attempt', String(rec.attempt), 'f-attempt');
    field(dl, 'recovered', rec.recovered
      ? 'yes: this lease was taken over from a holder whose lease ran out, which may have done part of the work'
      : 'no', 'f-recovered');
    field(dl, 'owner', rec.owner ? clientText(rec.owner) : '', 'f-owner');
    field(dl, 'fingerprint', rec.fingerprint ? clientCode(rec.fingerprint) : '', 'f-fingerprint');
    if (rec.lease_expires_at) {
      field(dl, 'lease expires', el('span', null, live(Date.parse(rec.lease_expires_at), 'until'),
        ` (${rec.lease_expires_at})`), 'f-lease');
    } else {
      field(dl, 'lease expires', 'no lease: the key is finished', 'f-lease');
    }
    field(dl, 'created', when(rec.created_at), 'f-created');
    field(dl, 'updated', when(rec.updated_at), 'f-updated');
    field(dl, 'expires', when(rec.expires_at), 'f-expires');

    const resp = $('rec-response');
    resp.replaceChildren();
    if (rec.response) {
      const rdl = el('dl', { class: 'fields-list' });
      field(rdl, 'status', String(rec.response.status), 'f-status');
      resp.append(rdl);
      const byRef = rec.response_by_reference;
      if (byRef) {
        // A result kept in the blob store: the record holds its size and SHA-256, and
        // its bytes come only by download, checked by the daemon first.
        field(rdl, 'kept', `by reference, in the blob store: ${byRef.size} bytes` +
          (byRef.sealed ? ', a sealed envelope: not readable here' : ''), 'f-by-reference');
        field(rdl, 'SHA-256', el('code', null, byRef.sha256), 'f-sha256');
        if (!byRef.sealed) resp.append(headersOf(rec.response));
        const note = el('span', { class: 'muted', id: 'download-note' });
        const button = el('button', { type: 'button', id: 'download' }, 'Download the result');
        button.addEventListener('click', () => download(rec, note));
        resp.append(el('p', null, button, ' ', note));
        return finishRecord(rec);
      }
      if (rec.response.sealed !== undefined) {
        field(rdl, 'sealed', sealedNote(bytesOf(rec.response.sealed)), 'f-sealed');
        return finishRecord(rec);
      }
      resp.append(headersOf(rec.response));
      resp.append(preview(bytesOf(rec.response.body), 'f-body'));
    } else {
      resp.append(el('p', { class: 'muted' }, 'none stored'));
    }
    finishRecord(rec);
  }

  // headersOf is the table of a stored response's headers.
  function headersOf(response) {
    const rows = [];
    for (const [name, values] of Object.entries(response.headers || {})) {
      for (const value of values) rows.push(el('tr', null, el('td', { class: 'header-name' }, clientCode(name)), el('td', null, clientText(value))));
    }
    if (rows.length === 0) return el('p', { class: 'muted' }, 'no stored headers');
    return el('table', { id: 'f-headers' },
      el('thead', null, el('tr', null, el('th', null, 'header'), el('th', null, 'value'))),
      el('tbody', null, ...rows));
  }

  // download fetches a key's stored result, which the daemon reads back and checks
  // against its size and SHA-256 before the first byte, and hands it to the browser as
  // a file. A plain link could not carry the token, which goes in the Authorization
  // header as every call's does.
  async function download(rec, note) {
    const url = new URL('/console/api/result', window.location.origin);
    url.searchParams.set('tenant', rec.tenant);
    url.searchParams.set('key', rec.key);
    const headers = {};
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    note.textContent = 'downloading…';
    try {
      const resp = await fetch(url, { headers, credentials: 'omit', cache: 'no-store', redirect: 'error' });
      if (!resp.ok) {
        let problem = null;
        try {
          problem = JSON.parse(await resp.text());
        } catch {
          problem = null;
        }
        throw new ProblemError(resp.status, problem);
      }
      const file = await resp.blob();
      const href = URL.createObjectURL(file);
      const a = el('a', { href, download: 'result.bin', hidden: '' });
      document.body.append(a);
      a.click();
      a.remove();
      // The browser has taken the file by then; the URL would hold it in memory.
      setTimeout(() => URL.revokeObjectURL(href), 60_000);
      note.textContent = `downloaded ${file.size} bytes`;
    } catch (err) {
      note.replaceChildren('Not downloaded: ', clientText(err.message));
    }
  }

  function finishRecord(rec) {
    const point = $('rec-point');
    point.replaceChildren();
    const rp = rec.recovery_point;
    if (rp) {
      const pdl = el('dl', { class: 'fields-list' });
      field(pdl, 'name', clientText(rp.name), 'f-point-name');
      field(pdl, 'attempt', String(rp.attempt), 'f-point-attempt');
      field(pdl, 'recorded', when(rp.recorded_at), 'f-point-recorded');
      const data = bytesOf(rp.data);
      // The daemon says whether the data is an envelope, by the check a sealed result
      // passes: plain data may start with the envelope's marker.
      if (rec.recovery_point_sealed) {
        field(pdl, 'data', sealedNote(data), 'f-point-sealed');
        point.append(pdl);
      } else {
        point.append(pdl, preview(data, 'f-point-data'));
      }
    } else {
      point.append(el('p', { class: 'muted' }, 'none recorded'));
    }
    $('purge-confirm').hidden = true;
    updatePurge();
    $('record').hidden = false;
  }

  // Purging needs the admin scope (and platform for another tenant, which only a
  // platform token can choose); the daemon checks it again whatever the page shows.
  function updatePurge() {
    const allowed = can('admin');
    $('purge').disabled = !allowed;
    $('purge-note').textContent = allowed ? '' : 'Purging needs a token with the admin scope.';
  }

  function askPurge() {
    if (!state.record) return;
    $('purge-key').replaceChildren(clientText(state.record.key));
    $('purge-tenant').textContent = state.record.tenant;
    $('purge-confirm').hidden = false;
  }

  async function purge() {
    const rec = state.record;
    $('purge-confirm').hidden = true;
    if (!rec) return;
    try {
      // The key goes in the query, as the lookup's does: in a path, a browser would
      // resolve a key such as '..' as a dot segment and purge nothing, or another URL.
      await call('DELETE', '/console/api/records', { tenant: rec.tenant, key: rec.key });
      $('record').hidden = true;
      state.record = null;
      $('purge-result').replaceChildren('Purged ', clientCode(rec.key), ` from tenant ${rec.tenant}.`);
    } catch (err) {
      $('purge-result').replaceChildren('Not purged: ', clientText(err.message));
    }
  }

  // ---- the abandoned-keys feed ----

  // A page of the feed reads a bounded number of pending keys, so a page can be empty
  // and still have a cursor: behind many live leases, the abandoned keys are further on.
  // The page follows such cursors, up to FEED_HOPS pages, before it shows one empty.
  const FEED_HOPS = 10;

  async function loadAbandoned(cursor) {
    showError('abandoned-error', null);
    const prefix = $('abandoned-prefix').value;
    const t = ticket('feed');
    try {
      let page;
      let hops = 0;
      do {
        const params = { prefix, cursor, limit: 50 };
        const r = ownTenant()
          ? await call('GET', '/v1/abandoned', params)
          : await call('GET', '/console/api/abandoned', { tenant: state.tenant, ...params });
        if (!t.current()) return;
        // The feed says nothing of the daemon's clock but its Date header, to the second.
        if (!Number.isNaN(r.date) && Math.abs(r.date - r.midpoint) > 1500) state.skewMs = r.date - r.midpoint;
        page = r.body;
        cursor = page.next_cursor || '';
        hops++;
      } while (page.keys.length === 0 && cursor && hops < FEED_HOPS);
      renderAbandoned(page, prefix, hops);
    } catch (err) {
      if (t.current()) showError('abandoned-error', err);
    }
  }

  function renderAbandoned(page, prefix, hops) {
    const rows = page.keys.map((k) => {
      const inspectButton = el('button', { type: 'button' }, 'Inspect');
      inspectButton.addEventListener('click', () => navigate(link('inspect', { tenant: state.tenant, key: k.key })));
      return el('tr', null,
        el('td', null, clientCode(k.key)),
        el('td', null, String(k.attempt)),
        el('td', { class: 'fingerprint' }, k.fingerprint ? clientCode(k.fingerprint) : '—'),
        el('td', null, k.owner ? clientText(k.owner) : '—'),
        el('td', null, k.lease_expired_at),
        el('td', null, live(Date.parse(k.lease_expired_at), 'since')),
        el('td', null, k.recovery_point ? clientText(k.recovery_point) : '—'),
        el('td', null, inspectButton));
    });
    $('abandoned-rows').replaceChildren(...rows);
    $('abandoned-table').dataset.prefix = prefix;
    $('abandoned-empty').hidden = rows.length > 0;
    $('abandoned-empty').textContent = page.next_cursor
      ? `No abandoned keys in the ${hops} pages read; Next page reads on.`
      : 'No abandoned keys.';
    state.feedCursor = page.next_cursor || '';
    $('abandoned-next').hidden = !page.next_cursor;
  }

  // ---- traffic ----

  function startTraffic() {
    loadTraffic();
    state.trafficTimer = setInterval(loadTraffic, TRAFFIC_EVERY_MS);
  }

  function stopTraffic() {
    clearInterval(state.trafficTimer);
    state.trafficTimer = 0;
  }

  async function loadTraffic() {
    const t = ticket('traffic');
    try {
      const r = await call('GET', '/console/api/traffic', { tenant: state.tenant });
      if (!t.current()) return;
      showError('traffic-error', null);
      renderTraffic(r.body);
    } catch (err) {
      showError('traffic-error', err);
    }
  }

  function renderTraffic(t) {
    const total = OUTCOMES.reduce((n, o) => n + t.totals[o], 0);
    const summary = $('traffic-summary');
    summary.dataset.total = String(total);
    for (const o of OUTCOMES) summary.dataset[o] = String(t.totals[o]);
    $('traffic-scope').textContent = `Counted in daemon ${t.daemon} only, the one serving this page: ` +
      'behind a load balancer, each daemon counts its own claims. Per second, over the last three minutes. ' +
      'A percentile is the upper bound of the bucket holding it, within a factor of √2.';
    summary.textContent = `${total} claims in tenant ${t.tenant} over the last ${t.claims.acquired.length} s: ` +
      OUTCOMES.map((o) => `${t.totals[o]} ${OUTCOME_LABELS[o]}`).join(', ') +
      (t.tracked ? '' : ' (not tracked: the console counts a bounded number of tenants)');
    const toMs = (at) => Date.parse(t.start) + at * t.step_seconds * 1000;
    // Stacked, so that no outcome's claims hide another's: each band is as thick as
    // its outcome's claims in that second, and the top edge is all claims.
    chart($('chart-claims'), OUTCOMES.map((o) => ({
      name: OUTCOME_LABELS[o], cls: `line-${o}`, values: t.claims[o],
      legend: `${t.totals[o]}, at most ${formatNumber(Math.max(...t.claims[o]))}/s`,
    })), { unit: '/s', toMs, stacked: true });
    const lastOf = (values) => {
      for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return `${formatNumber(values[i])} ms lately`;
      return 'no claim';
    };
    // p50 is dashed over a wider p99, so that both show where they are equal.
    chart($('chart-latency'), [
      { name: 'p99', cls: 'line-p99', values: t.p99_ms, legend: lastOf(t.p99_ms) },
      { name: 'p50', cls: 'line-p50', values: t.p50_ms, legend: lastOf(t.p50_ms) },
    ], { unit: ' ms', toMs });
  }

  const SVG = 'http://www.w3.org/2000/svg';

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) e.setAttribute(name, String(value));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // clock is a time of day in UTC, as the record's times are given.
  const clock = (ms) => new Date(ms).toISOString().slice(11, 19);

  const TICK_MS = 30000;

  // chart draws series of numbers (null for no value) over the same seconds: as bands
  // stacked one on another (opts.stacked), or as lines, which the style sheet tells
  // apart by their dashes as well as their colours. Below runs a time axis, a label
  // every 30 s of the clock. Each second has a column that says its time and each
  // series' value: as its title, on hover, and in the readout under the chart while
  // the pointer is on it, which a redraw keeps.
  function chart(box, series, opts) {
    const W = 720;
    const H = 170;
    const left = 56;
    const right = 8;
    const top = 8;
    const bottom = 36;
    const n = series[0].values.length;
    // tops[k][i] is where series k ends in second i: its value, on those below it
    // when stacked.
    const tops = [];
    series.forEach((s, k) => {
      tops.push(s.values.map((v, i) => {
        if (!opts.stacked) return v;
        return (k > 0 ? tops[k - 1][i] : 0) + (v || 0);
      }));
    });
    let peak = 0;
    for (const row of tops) for (const v of row) if (v !== null && v > peak) peak = v;
    const yMax = peak > 0 ? niceCeil(peak) : 1;
    const x = (i) => left + (i * (W - left - right)) / Math.max(1, n - 1);
    const y = (v) => top + (1 - v / yMax) * (H - top - bottom);
    const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', class: 'chart-svg' });
    root.dataset.max = String(peak);
    root.dataset.ymax = String(yMax);
    root.append(svg('line', { x1: left, y1: y(yMax / 2), x2: W - right, y2: y(yMax / 2), class: 'grid' }));
    root.append(svg('line', { x1: left, y1: y(yMax), x2: W - right, y2: y(yMax), class: 'grid' }));
    root.append(svg('text', { x: left - 6, y: y(yMax) + 4, class: 'label end' }, `${formatNumber(yMax)}${opts.unit}`));
    root.append(svg('text', { x: left - 6, y: y(yMax / 2) + 4, class: 'label end' }, formatNumber(yMax / 2)));
    root.append(svg('text', { x: left - 6, y: y(0) + 4, class: 'label end' }, '0'));

    // The time axis.
    const t0 = opts.toMs(0);
    const stepMs = opts.toMs(1) - t0;
    const tEnd = opts.toMs(n - 1);
    for (let at = Math.ceil(t0 / TICK_MS) * TICK_MS; at <= tEnd; at += TICK_MS) {
      const xt = x((at - t0) / stepMs);
      root.append(svg('line', { x1: xt, y1: y(0), x2: xt, y2: y(0) + 4, class: 'axis' }));
      root.append(svg('line', { x1: xt, y1: top, x2: xt, y2: y(0), class: 'grid' }));
      const anchor = xt > W - right - 28 ? 'end' : 'middle';
      root.append(svg('text', { x: xt, y: y(0) + 16, class: `label ${anchor} tick-label` }, clock(at)));
    }
    root.append(svg('text', { x: W - right, y: H - 4, class: 'label end' }, 'time, UTC'));

    const legend = el('p', { class: 'legend' });
    series.forEach((s, k) => {
      if (opts.stacked) {
        // The band: along its top edge, then back along the edge below it.
        let d = '';
        for (let i = 0; i < n; i++) d += `${i ? 'L' : 'M'}${x(i).toFixed(1)} ${y(tops[k][i]).toFixed(1)} `;
        for (let i = n - 1; i >= 0; i--) d += `L${x(i).toFixed(1)} ${y(k > 0 ? tops[k - 1][i] : 0).toFixed(1)} `;
        const band = svg('path', { d: `${d}Z`, class: `band ${s.cls}` });
        band.dataset.series = s.name;
        root.append(band);
        const swatch = svg('svg', { width: 14, height: 10, class: 'swatch' });
        swatch.append(svg('rect', { x: 0, y: 0, width: 14, height: 10, class: `band ${s.cls}` }));
        legend.append(swatch, ` ${s.name}: ${s.legend}  `);
        return;
      }
      let d = '';
      let pen = false;
      s.values.forEach((v, i) => {
        if (v === null) {
          pen = false;
          return;
        }
        d += `${pen ? 'L' : 'M'}${x(i).toFixed(1)} ${y(v).toFixed(1)} `;
        pen = true;
        // A value with no neighbour draws no line, so it gets a dot.
        const lone = (i === 0 || s.values[i - 1] === null) && (i === n - 1 || s.values[i + 1] === null);
        if (lone) root.append(svg('circle', { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5, class: `dot ${s.cls}` }));
      });
      if (d) {
        const line = svg('path', { d, class: `line ${s.cls}` });
        line.dataset.series = s.name;
        root.append(line);
      }
      const swatch = svg('svg', { width: 24, height: 10, class: 'swatch' });
      swatch.append(svg('line', { x1: 0, y1: 5, x2: 24, y2: 5, class: `line ${s.cls}` }));
      legend.append(swatch, ` ${s.name}: ${s.legend}  `);
    });
    root.append(svg('line', { x1: left, y1: y(0), x2: W - right, y2: y(0), class: 'axis' }));

    // The columns, one a second, on top of everything, for the pointer.
    const describe = (i) => {
      const parts = series.map((s) => `${s.name} ${s.values[i] === null ? '—' : `${formatNumber(s.values[i])}${opts.unit}`}`);
      const all = opts.stacked ? `; ${formatNumber(tops[series.length - 1][i])}${opts.unit} in all` : '';
      return `${clock(opts.toMs(i))} UTC: ${parts.join(', ')}${all}`;
    };
    const guide = svg('line', { x1: 0, y1: top, x2: 0, y2: y(0), class: 'guide', visibility: 'hidden' });
    const readout = el('p', { class: 'readout' });
    const point = (i) => {
      if (i === null) {
        guide.setAttribute('visibility', 'hidden');
        readout.textContent = 'Point at the chart for the values of a second.';
        return;
      }
      guide.setAttribute('x1', x(i).toFixed(1));
      guide.setAttribute('x2', x(i).toFixed(1));
      guide.setAttribute('visibility', 'visible');
      readout.textContent = describe(i);
    };
    const columns = svg('g', { class: 'columns' });
    const half = (W - left - right) / Math.max(1, n - 1) / 2;
    for (let i = 0; i < n; i++) {
      const x0 = Math.max(left, x(i) - half);
      const x1 = Math.min(W - right, x(i) + half);
      const col = svg('rect', { x: x0.toFixed(2), y: top, width: (x1 - x0).toFixed(2), height: y(0) - top, class: 'column' });
      col.append(svg('title', null, describe(i)));
      const values = {};
      for (const s of series) values[s.name] = s.values[i];
      col.dataset.values = JSON.stringify(values);
      col.dataset.total = JSON.stringify(opts.stacked ? tops[series.length - 1][i] : null);
      col.addEventListener('mouseenter', () => {
        state.pointed[box.id] = opts.toMs(i);
        point(i);
      });
      columns.append(col);
    }
    root.addEventListener('mouseleave', () => {
      state.pointed[box.id] = null;
      point(null);
    });
    root.append(guide, columns);
    // The second pointed at before this redraw, if it is still in the window.
    const was = state.pointed[box.id];
    const i = was === null || was === undefined ? -1 : Math.round((was - t0) / stepMs);
    point(i >= 0 && i < n ? i : null);
    box.replaceChildren(root, legend, readout);
  }

  function niceCeil(v) {
    const step = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 5, 10]) if (m * step >= v) return m * step;
    return 10 * step;
  }

  function formatNumber(v) {
    return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1);
  }

  // ---- the store ----

  async function loadStore() {
    showError('store-error', null);
    try {
      const r = await call('GET', '/console/api/store');
      renderStore(r.body);
    } catch (err) {
      showError('store-error', err);
    }
  }

  function renderStore(st) {
    const dl = $('store-fields');
    dl.replaceChildren();
    field(dl, 'kind', st.kind, 's-kind');
    field(dl, 'record layout', st.layout, 's-layout');
    field(dl, 'location', st.location, 's-location');
    field(dl, 'ready', st.ready ? 'yes: the store takes writes' : `no: ${st.ready_error || 'not ready'}`, 's-ready');
    if (st.migration) {
      const mg = st.migration;
      field(dl, 'moving records', mg.done
        ? `from ${mg.from}: done, ${mg.handed_over} copied; the old store holds only markers`
        : `from ${mg.from}: ${mg.handed_over} copied, ${mg.left} left, ${mg.per_second.toFixed(0)}/s, about ${Math.ceil(mg.to_go_s)} s to go (${mg.by_calls} by calls, ${mg.failed} failed)` +
          (mg.waiting && mg.waiting.length ? `; waiting for: ${mg.waiting.join('; ')}`
            : mg.alone_daemons ? `; waiting for ${mg.alone_daemons} connection(s) of daemons serving the old store alone` : ''), 's-migration');
    }
    const num = (v, digits, unit) => (v === null || v === undefined ? '—' : `${v.toFixed(digits)}${unit}`);
    const ping = (n) => (n.error ? `no answer: ${n.error}` : num(n.ping_ms, 2, ' ms'));
    const rows = [];
    for (const m of st.masters) {
      rows.push(el('tr', { class: 'master' },
        el('td', null, 'master'),
        el('td', null, el('code', null, m.address)),
        el('td', null, ping(m)),
        el('td', null, num(m.round_trip_ms, 2, ' ms')),
        el('td', null, num(m.pipelines, 0, '')),
        el('td', null, num(m.queued_calls, 0, '')),
        el('td', null, '')));
      for (const r of m.replicas || []) {
        rows.push(el('tr', { class: 'replica' },
          el('td', null, 'replica'),
          el('td', null, el('code', null, r.address)),
          el('td', null, ping(r)),
          el('td', null, '—'),
          el('td', null, '—'),
          el('td', null, '—'),
          el('td', null, `${r.state}, ${r.lag_bytes} bytes behind, last ack ${r.since_ack_s} s ago`)));
      }
    }
    $('masters-rows').replaceChildren(...rows);
    $('masters-table').hidden = st.masters.length === 0;
    let note = 'A master appears once this daemon has sent it a pipeline.';
    if (st.kind === 'embedded') note = 'The embedded store is one file on this daemon\'s disk: it has no masters or replicas.';
    else if (st.masters.some((m) => m.replicas)) note = 'PING now is measured from this daemon as the view is read; the pipeline round trip is the shortest lately. Replicas are listed as their master reports them.';
    if (st.topology_error) note += ` Reading the masters and replicas failed: ${st.topology_error}`;
    $('masters-note').textContent = note;
  }

  start();
})();
