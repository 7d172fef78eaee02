'use strict';
// The headwater explorer: a page over the read-only /v1 API of the server that serves it.
//
// The bearer token is typed into the page and kept in this tab's sessionStorage: it is sent as
// the Authorization header of each fetch, never in a URL (history, logs, Referer) nor in a
// cookie (which the browser would send on its own, to pages of other sites' making too). It is
// gone when the tab closes. Everything shown is put in the page as text, never as markup, and
// the server's Content-Security-Policy lets the page run only this script.
(() => {
  const TOKEN_KEY = 'headwater.token';
  const PAGE = 25;  // rows of one answer added to the graph at a time
  const NODE_W = 250;
  const NODE_H = 62;

  // ---- small helpers --------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
      else if (name === 'class') node.className = value;
      else node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // ``node``'s children replaced by these (nulls left out: replaceChildren would show them as text)
  function fill(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== undefined && c !== null && c !== false));
  }

  function link(text, hash, attrs) {
    return el('a', {href: hash, ...(attrs || {})}, text);
  }

  function hashOf(path, params) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== '') query.set(name, String(value));
    }
    const text = query.toString();
    return `#${path}${text ? '?' + text : ''}`;
  }

  // JSON with every integer a double cannot hold exactly (rids are 64-bit) kept as its digits, a string.
  function parseJSON(text) {
    let out = '';
    let from = 0;
    let inString = false;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (inString) {
        if (c === '\\') i++;
        else if (c === '"') inString = false;
        continue;
      }
      if (c === '"') { inString = true; continue; }
      if (c === '-' || (c >= '0' && c <= '9')) {
        let j = i + 1;
        while (j < text.length && /[0-9.eE+-]/.test(text[j])) j++;
        const number = text.slice(i, j);
        if (/^-?[0-9]+$/.test(number) && !Number.isSafeInteger(Number(number))) {
          out += text.slice(from, i) + '"' + number + '"';
          from = j;
        }
        i = j - 1;
      }
    }
    return JSON.parse(out + text.slice(from));
  }

  class AuthError extends Error {}

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, params, retried) {
    const url = new URL(path, window.location.origin);
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== '') url.searchParams.set(name, String(value));
    }
    const headers = {Accept: 'application/json'};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(url, {headers, cache: 'no-store', credentials: 'omit', redirect: 'error'});
    const text = await response.text();
    let body = null;
    try {
      body = text ? parseJSON(text) : null;
    } catch (_) {
      body = null;
    }
    if (response.status === 401) throw new AuthError(body && body.error || 'the token was refused');
    if (response.status === 503 && response.headers.get('Retry-After') && !retried) {
      const wait = Math.min(5, Number(response.headers.get('Retry-After')) || 1);
      await new Promise((resolve) => setTimeout(resolve, wait * 1000));
      return api(path, params, true);
    }
    if (!response.ok) throw new ApiError(response.status, (body && body.error) || response.statusText);
    return body;
  }

  // ---- the token ------------------------------------------------------------------------

  let refused = false;  // the last token given was refused: say so on the form

  function showLogin(message) {
    document.getElementById('main').hidden = true;
    document.getElementById('login').hidden = false;
    document.getElementById('logout').hidden = true;
    document.getElementById('login-error').textContent = message || '';
    document.getElementById('token').focus();
  }

  function hideLogin() {
    document.getElementById('login').hidden = true;
    document.getElementById('main').hidden = false;
    document.getElementById('logout').hidden = !sessionStorage.getItem(TOKEN_KEY);
  }

  function setupLogin() {
    document.getElementById('login-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const input = document.getElementById('token');
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      input.value = '';
      refused = true;  // until an answer comes back
      route();
    });
    document.getElementById('logout').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      refused = false;
      showLogin('');
    });
  }

  function failed(error, into) {
    if (error instanceof AuthError) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(had && refused ? 'The server refused this token.' : '');
      return;
    }
    const message = error instanceof ApiError ? `${error.status}: ${error.message}` : String(error.message || error);
    const box = el('p', {class: 'error', role: 'alert'}, message);
    if (into) fill(into, box);
    else fill(document.getElementById('main'), box);
  }

  // ---- what rows are -------------------------------------------------------------------

  function basename(text) {
    const parts = String(text).replace(/\/+$/, '').split('/');
    return parts[parts.length - 1] || String(text);
  }

  function shortDataset(dataset) {
    if (!dataset) return '';
    const [kind, ...rest] = String(dataset).split(':');
    const place = rest.join(':');
    if (['parquet', 'json', 'orc', 'csv', 'delta'].includes(kind)) return `${basename(place)} (${kind})`;
    if (kind === 'kafka') return place;
    return String(dataset);
  }

  // What a row's address says of it, for a row asked by address before any answer describes it.
  function fromAddress(address) {
    const [kind, ...rest] = address.split(':');
    if (kind === 'kafka' && rest.length >= 3) {
      const offset = rest.pop();
      const partition = rest.pop();
      return {kind: 'source', dataset: `kafka:${rest.join(':')}`, topic: rest.join(':'), partition, offset};
    }
    if (kind === 'table' && rest.length >= 2) return {kind: 'source', dataset: rest[0], key: rest.slice(1).join(':')};
    if (kind === 'file' && rest.length >= 2) {
      const position = rest.pop();
      return {kind: 'source', dataset: `file:${rest.join(':')}`, path: rest.join(':'), position};
    }
    return {kind: 'source', dataset: address};
  }

  function rowLines(row) {
    const kind = row.kind || 'row';
    if (row.placeholder) return [[row.placeholder, 'title'], ['click to add them', 'meta'], ['', 'meta']];
    if (row.topic !== undefined && row.topic !== null) {
      return [['Kafka record', 'title'], [row.topic, 'meta'], [`partition ${row.partition} · offset ${row.offset}`, 'coords']];
    }
    if (row.key !== undefined && row.key !== null) {
      return [[`${row.dataset || 'table'} row`, 'title'], [row.table ? basename(row.table) : 'static table', 'meta'],
        [`key ${row.key}`, 'coords']];
    }
    if (row.path !== undefined && row.path !== null) {
      return [['file row', 'title'], [basename(row.path), 'meta'],
        [row.position !== undefined && row.position !== null ? `row ${row.position}` : row.path, 'coords']];
    }
    const title = row.unexplained ? `${kind} row: unexplained` : `${kind} row`;
    return [[title, 'title'], [shortDataset(row.dataset) || (row.asked ? 'the row asked about' : ''), 'meta'],
      [`rid ${row.rid}`, 'coords']];
  }

  function operatorText(record) {
    const names = [];
    for (const op of record.operators || []) {
      if (op && op.kind !== 'source' && !names.includes(op.name)) names.push(op.name);
    }
    if (!names.length && (record.operators || []).length) names.push(record.operators[0].name);
    if (!names.length) for (const id of record.ops || []) names.push(`op ${id}`);
    return names.join(' → ');
  }

  // ---- the lineage graph ---------------------------------------------------------------

  class Lineage {
    constructor(view) {
      this.view = view;
      this.rows = new Map();   // rid (text) -> what is known of the row
      this.edges = new Map();  // "src>dst" -> edge
      this.more = new Map();   // placeholder id -> {of, direction, records, answer}
      this.expanded = new Set();  // "rid|direction"
      this.answers = [];
      this.selected = null;
    }

    row(rid, known) {
      const key = String(rid);
      const held = this.rows.get(key) || {rid: key};
      for (const [name, value] of Object.entries(known || {})) {
        if (value !== undefined && value !== null && name !== 'of' && name !== 'payload') held[name] = value;
      }
      this.rows.set(key, held);
      return held;
    }

    edge(src, dst, record, answer) {
      const key = `${src}>${dst}`;
      const gaps = new Set((answer.gaps || []).map((g) => Number(g.batch)));
      const gapped = (record.batches || []).filter((b) => gaps.has(Number(b)));
      const held = this.edges.get(key) || {src: String(src), dst: String(dst)};
      Object.assign(held, {
        label: operatorText(record), exact: record.exact !== false, via: record.via || 'edges',
        batches: record.batches || [], gap: gapped, columns: record.columns, cols: record.cols,
        operators: record.operators || [], ops: record.ops || [],
      });
      this.edges.set(key, held);
    }

    // an answer of ``direction`` from ``of``, merged in: its first rows, a placeholder for the rest
    add(of, direction, answer, first) {
      this.answers.push({of: String(of), direction, answer});
      this.expanded.add(`${of}|${direction}`);
      const records = answer.answer || [];
      this.place(of, direction, records.slice(0, first === undefined ? PAGE : first), answer);
      const rest = records.slice(first === undefined ? PAGE : first);
      const id = `more:${of}:${direction}`;
      if (rest.length) {
        this.more.set(id, {of: String(of), direction, records: rest, answer});
        this.row(id, {placeholder: `${rest.length} more rows`, kind: 'more'});
        if (direction === 'backward') this.edges.set(`${id}>${of}`, {src: id, dst: String(of), label: '', more: true});
        else this.edges.set(`${of}>${id}`, {src: String(of), dst: id, label: '', more: true});
      } else {
        this.drop(id);
      }
      for (const u of answer.unexplained || []) {
        const row = this.row(u.rid, {kind: u.kind, dataset: u.dataset, unexplained: true});
        if (String(row.rid) !== String(of)) {
          this.edges.set(`${row.rid}>${of}`, {src: String(row.rid), dst: String(of), unexplained: true,
            label: 'lineage stops here: no recorded inputs', via: 'edges', exact: true, batches: [], gap: []});
        }
      }
    }

    place(of, direction, records, answer) {
      for (const record of records) {
        this.row(record.rid, record);
        if (direction === 'backward') this.edge(record.rid, of, record, answer);
        else this.edge(of, record.rid, record, answer);
      }
    }

    drop(id) {
      this.more.delete(id);
      this.rows.delete(id);
      for (const key of [...this.edges.keys()]) if (key.startsWith(`${id}>`) || key.endsWith(`>${id}`)) this.edges.delete(key);
    }

    showMore(id) {
      const held = this.more.get(id);
      if (!held) return;
      this.place(held.of, held.direction, held.records.slice(0, PAGE), held.answer);
      held.records = held.records.slice(PAGE);
      if (held.records.length) this.rows.get(id).placeholder = `${held.records.length} more rows`;
      else this.drop(id);
    }

    drawing() {
      const nodes = [];
      for (const row of this.rows.values()) {
        const handles = row.placeholder ? [] : ['backward', 'forward'].filter((d) => !this.expanded.has(`${row.rid}|${d}`));
        const cls = [`kind-${row.kind || 'unknown'}`, row.asked ? 'asked' : '', row.unexplained ? 'unexplained' : '',
          row.placeholder ? 'more' : '', this.selected === row.rid ? 'selected' : ''].join(' ');
        nodes.push({id: row.rid, w: NODE_W, h: NODE_H, lines: rowLines(row), cls, handles,
          title: row.placeholder ? row.placeholder : `${row.kind || 'row'} ${row.dataset || ''}\nrid ${row.rid}`,
          attrs: {'data-rid': row.rid, 'data-kind': row.kind || '', 'data-dataset': row.dataset || ''}});
      }
      const edges = [];
      for (const e of this.edges.values()) {
        const cls = [e.exact === false ? 'superset' : 'exact', e.via === 'inference' ? 'inferred' : '',
          e.gap && e.gap.length ? 'gap' : '', e.unexplained ? 'unexplained' : '', e.more ? 'more' : ''].join(' ');
        const label = `${e.exact === false ? '⊇ ' : ''}${e.label || ''}`;
        const note = [e.gap && e.gap.length ? `gap: batch ${e.gap.join(', ')}` : '',
          e.via === 'inference' ? 'inferred' : ''].filter(Boolean).join(' · ');
        const title = [e.label, e.exact === false ? 'superset: may include rows that did not contribute' : '',
          e.via === 'inference' ? 'inferred from the batch log: the batch published no edges' : '',
          e.gap && e.gap.length ? `through batch ${e.gap.join(', ')}, not fully captured` : '',
          e.batches && e.batches.length ? `batches ${e.batches.join(', ')}` : ''].filter(Boolean).join('\n');
        edges.push({src: e.src, dst: e.dst, label, note, cls, title});
      }
      return {nodes, edges};
    }
  }

  // ---- views ---------------------------------------------------------------------------

  const main = () => document.getElementById('main');
  let queriesCache = null;

  async function knownQueries() {
    if (!queriesCache) queriesCache = (await api('/v1/queries')).queries;
    return queriesCache;
  }

  function searchForm(params) {
    const rowInput = el('input', {id: 'row', name: 'row', size: 48, required: true, spellcheck: 'false',
      placeholder: 'rid, or kafka:TOPIC:PARTITION:OFFSET, table:NAME:KEY, file:PATH:POSITION …',
      value: params.get('row') || ''});
    const go = (direction) => {
      const text = rowInput.value.trim();
      if (!text) return;
      const named = /^-?[0-9]+$/.test(text) ? {rid: text} : {source: text};
      window.location.hash = hashOf('/lineage', {dir: direction, ...named});
    };
    const byRow = el('form', {id: 'search-row', class: 'card', onsubmit: (e) => { e.preventDefault(); go('backward'); }},
      el('h2', {}, 'A row'),
      el('p', {class: 'hint'}, 'A sink row\'s _hw_rid, or a source row\'s address.'),
      el('div', {class: 'row'}, rowInput,
        el('button', {type: 'submit', id: 'go-backward'}, '← Backward'),
        el('button', {type: 'button', id: 'go-forward', onclick: () => go('forward')}, 'Forward →')));
    const dataset = el('input', {id: 'dataset', name: 'dataset', size: 48, list: 'sinks', required: true,
      spellcheck: 'false', placeholder: 'parquet:/path/to/sink', value: params.get('dataset') || ''});
    const where = el('input', {id: 'where', name: 'where', size: 48, required: true, spellcheck: 'false',
      placeholder: 'order_id = 17 AND region = \'EU\'', value: params.get('where') || ''});
    const sinks = el('datalist', {id: 'sinks'});
    knownQueries().then((queries) => {
      for (const q of queries) if (q.sink) sinks.appendChild(el('option', {value: q.sink}, q.name));
    }).catch(() => {});
    const byPredicate = el('form', {id: 'search-where', class: 'card', onsubmit: (e) => {
      e.preventDefault();
      window.location.hash = hashOf('/where', {dataset: dataset.value.trim(), where: where.value.trim()});
    }},
    el('h2', {}, 'Rows of a sink'),
    el('p', {class: 'hint'}, 'A sink as lineage names it (or by its OpenLineage name, as a catalog shows it), ' +
      'and a SQL predicate over its columns.'),
    el('div', {class: 'row'}, el('label', {for: 'dataset'}, 'Sink'), dataset, sinks),
    el('div', {class: 'row'}, el('label', {for: 'where'}, 'Where'), where, el('button', {type: 'submit'}, 'Find rows')));
    return el('section', {class: 'search'}, byRow, byPredicate);
  }

  async function searchView(params) {
    fill(main(), el('h1', {}, 'Find a row'), searchForm(params));
    await knownQueries();  // asks with the token: a wrong one shows the form now, not at the first search
  }

  async function whereView(params) {
    const dataset = params.get('dataset') || '';
    const where = params.get('where') || '';
    if (!where) {  // a catalog's link names the sink (its OpenLineage name, say): the predicate is the reader's
      fill(main(), el('h1', {}, 'Rows of a sink'), searchForm(params),
        el('p', {class: 'hint', id: 'where-ask'}, 'Give a predicate over the sink\'s columns to find its rows.'));
      return;
    }
    const out = el('section', {id: 'where-rows'}, el('p', {class: 'loading'}, 'Selecting rows…'));
    fill(main(), el('h1', {}, 'Rows of a sink'), searchForm(params), out);
    try {
      const found = await api('/v1/where', {dataset, where, limit: 1000});
      const list = el('ol', {class: 'rids'});
      for (const rid of found.rids) {
        list.appendChild(el('li', {}, el('code', {}, String(rid)), ' ',
          link('← backward', hashOf('/lineage', {dir: 'backward', rid}), {class: 'rid-link'}), ' ',
          link('forward →', hashOf('/lineage', {dir: 'forward', rid}))));
      }
      fill(out, 
        el('p', {id: 'where-count'}, `${found.rids.length} row${found.rids.length === 1 ? '' : 's'} of ${found.dataset}`),
        list);
    } catch (error) {
      failed(error, out);
    }
  }

  async function lineageView(params) {
    const direction = params.get('dir') === 'forward' ? 'forward' : 'backward';
    const rid = params.get('rid');
    const source = params.get('source');
    const asked = rid ? {rid} : {source};
    const other = direction === 'backward' ? 'forward' : 'backward';
    const summary = el('div', {id: 'summary', class: 'summary'}, el('p', {class: 'loading'}, 'Asking…'));
    const svgNode = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svgNode.setAttribute('id', 'graph');
    svgNode.setAttribute('role', 'img');
    svgNode.setAttribute('aria-label', 'lineage graph');
    const details = el('aside', {id: 'details', class: 'details'}, el('p', {class: 'hint'},
      'Click a row for what is known of it; + on its left or right adds what it was derived from, or what was ' +
      'derived from it.'));
    const fit = el('button', {type: 'button', id: 'fit', onclick: () => svgNode.classList.toggle('fit')}, 'Fit / actual size');
    fill(main(), 
      el('div', {class: 'title-row'},
        el('h1', {}, `${direction === 'backward' ? 'Backward' : 'Forward'} lineage of ${rid ? 'rid ' + rid : source}`),
        link(`${other} instead`, hashOf('/lineage', {dir: other, ...asked}), {class: 'button'}), fit),
      summary, legend(),
      el('div', {class: 'lineage'}, el('div', {class: 'canvas'}, svgNode), details));
    let answer;
    try {
      answer = await api(`/v1/lineage/${direction}`, asked);
    } catch (error) {
      failed(error, summary);
      return;
    }
    const graph = new Lineage();
    const root = graph.row(answer.of, {asked: true, ...(source ? fromAddress(source) : {})});
    if (!root.kind && direction === 'backward' && (answer.answer.length || (answer.unexplained || []).length)) {
      root.kind = 'output';
    }
    if (!root.dataset && direction === 'backward') {
      // an output row is named by the query that wrote it, as the answers name the rows they reach
      const ops = answer.answer.flatMap((r) => r.operators || []);
      if (ops.length && ops[ops.length - 1].query) root.dataset = ops[ops.length - 1].query;
    }
    graph.add(answer.of, direction, answer);
    const state = {graph, svg: svgNode, details, summary};
    function redraw() {
      HWGraph.draw(svgNode, graph.drawing(), {
        node: (id) => select(state, id, redraw),
        handle: (id, way) => expand(state, id, way, redraw),
      });
      showSummary(state);
    }
    state.redraw = redraw;
    redraw();
    show(svgNode, String(answer.of));
  }

  // the row's node scrolled to the middle of the canvas
  function show(svgNode, rid) {
    const node = [...svgNode.querySelectorAll('g.node')].find((g) => g.getAttribute('data-rid') === String(rid));
    if (node) node.scrollIntoView({block: 'center', inline: 'center'});
  }

  function legend() {
    const item = (cls, text) => el('span', {class: `legend-item ${cls}`}, el('span', {class: 'swatch'}), text);
    return el('div', {class: 'legend'},
      item('exact', 'exact: recorded edges'), item('superset', 'superset (⊇): may include rows that did not contribute'),
      item('inferred', 'inferred from the batch log'), item('gap', 'through a batch not fully captured'),
      item('unexplained', 'lineage stops: no recorded inputs'));
  }

  function showSummary(state) {
    const box = state.summary;
    const parts = [];
    const gaps = new Map();
    const unexplained = new Set();
    let truncated = false;
    const readBy = [];
    for (const {answer} of state.graph.answers) {
      for (const g of answer.gaps || []) gaps.set(`${g.query}|${g.batch}`, g);
      for (const u of answer.unexplained || []) unexplained.add(String(u.rid));
      truncated = truncated || answer.truncated;
      for (const b of answer.read_by || []) readBy.push(b);
    }
    const first = state.graph.answers[0].answer;
    const rows = [...state.graph.rows.values()].filter((r) => !r.placeholder).length;
    if (!gaps.size && !unexplained.size) {
      parts.push(el('span', {class: 'badge ok', id: 'complete'}, 'complete'),
        ' Every batch on the way was fully captured, and every row on the way has its recorded inputs.');
    } else {
      parts.push(el('span', {class: 'badge warn', id: 'incomplete'}, 'incomplete'), ' ');
      if (gaps.size) {
        parts.push(`${gaps.size} batch${gaps.size > 1 ? 'es' : ''} on the way not fully captured: `);
        [...gaps.values()].forEach((g, i) => {
          if (i) parts.push(', ');
          parts.push(link(`${g.query} batch ${g.batch} (${g.status || 'not logged'})`,
            hashOf('/batch', {query: g.query, batch: g.batch}), {class: 'gap-link'}));
        });
        parts.push('. ');
      }
      if (unexplained.size) parts.push(`${unexplained.size} row${unexplained.size > 1 ? 's' : ''} where lineage stops.`);
    }
    const counts = el('p', {class: 'counts'}, `${rows} rows in the graph; the first answer had ${first.answer.length}`,
      truncated ? ' (cut by the server\'s max results)' : '', '.');
    if (!first.answer.length && first.read_by && first.read_by.length) {
      counts.append(' Read by ', first.read_by.map((b) => `${b.query} batch ${b.batch}`).join(', '),
        ', which derived nothing from it (filtered, unmatched, late or a duplicate).');
    }
    fill(box, el('p', {}, parts), counts);
  }

  async function expand(state, id, direction, redraw) {
    const graph = state.graph;
    if (graph.more.has(id)) {
      graph.showMore(id);
      redraw();
      return;
    }
    const status = el('p', {class: 'loading'}, `Asking ${direction} from rid ${id}…`);
    fill(state.details, status);
    try {
      const answer = await api(`/v1/lineage/${direction}`, {rid: id});
      graph.add(id, direction, answer);
      graph.selected = id;
      select(state, id, redraw);
      show(state.svg, id);
    } catch (error) {
      failed(error, state.details);
    }
  }

  function columnsText(e) {
    if (e.columns && e.columns.length) return `columns: ${e.columns.join(', ')}`;
    if (e.cols === -1 || e.cols === '-1') return 'columns: not known (every one, to be safe)';
    if (e.cols !== undefined && e.cols !== null) return `columns (bit mask): ${BigInt.asUintN(64, BigInt(e.cols)).toString(2)}`;
    return '';
  }

  function fieldRows(pairs) {
    return el('table', {class: 'fields'}, pairs.filter(([, v]) => v !== undefined && v !== null && v !== '')
      .map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v instanceof Node ? v : String(v)))));
  }

  function select(state, id, redraw) {
    const graph = state.graph;
    if (graph.more.has(id)) {
      expand(state, id, null, redraw);
      return;
    }
    graph.selected = id;
    redraw();
    const row = graph.rows.get(id);
    const into = state.details;
    const incoming = [...graph.edges.values()].filter((e) => e.dst === id && !e.more);
    const outgoing = [...graph.edges.values()].filter((e) => e.src === id && !e.more);
    const how = (e, other) => el('li', {},
      el('strong', {}, e.label || '(no operators named)'),
      el('div', {class: 'meta'}, [e.exact === false ? 'superset' : 'exact', e.via === 'inference' ? 'inferred' : 'recorded edges',
        e.batches && e.batches.length ? `batches ${e.batches.join(', ')}` : '',
        e.gap && e.gap.length ? `not fully captured: batch ${e.gap.join(', ')}` : ''].filter(Boolean).join(' · ')),
      el('div', {class: 'meta'}, columnsText(e)),
      el('div', {class: 'meta'}, `${other === e.src ? 'from' : 'to'} rid ${other}`));
    const payload = el('div', {class: 'payload'});
    fill(into, 
      el('h2', {}, rowLines(row)[0][0]),
      fieldRows([['rid', el('code', {}, row.rid)], ['kind', row.kind], ['dataset', row.dataset], ['table', row.table],
        ['topic', row.topic], ['partition', row.partition], ['offset', row.offset], ['key', row.key],
        ['path', row.path], ['position', row.position]]),
      el('div', {class: 'actions'},
        el('button', {type: 'button', class: 'expand-backward', onclick: () => expand(state, id, 'backward', redraw),
          disabled: graph.expanded.has(`${id}|backward`)}, '← Expand backward'),
        el('button', {type: 'button', class: 'expand-forward', onclick: () => expand(state, id, 'forward', redraw),
          disabled: graph.expanded.has(`${id}|forward`)}, 'Expand forward →'),
        el('button', {type: 'button', class: 'load-payload', onclick: () => loadPayload(state, id, payload)}, 'Payload'),
        link('Open on its own', hashOf('/lineage', {dir: 'backward', rid: id}), {class: 'button'})),
      payload,
      incoming.length ? el('h3', {}, 'Derived from') : null,
      incoming.length ? el('ul', {class: 'hows'}, incoming.slice(0, 12).map((e) => how(e, e.src))) : null,
      incoming.length > 12 ? el('p', {class: 'meta'}, `and ${incoming.length - 12} more`) : null,
      outgoing.length ? el('h3', {}, 'Feeds') : null,
      outgoing.length ? el('ul', {class: 'hows'}, outgoing.slice(0, 12).map((e) => how(e, e.dst))) : null,
      outgoing.length > 12 ? el('p', {class: 'meta'}, `and ${outgoing.length - 12} more`) : null);
  }

  // A row's payload: asked again, with payload=true, of the question between it and a neighbour in the graph
  async function loadPayload(state, id, into) {
    const graph = state.graph;
    const row = graph.rows.get(id);
    const edge = [...graph.edges.values()].find((e) => !e.more && !e.unexplained && (e.dst === id || e.src === id));
    if (!edge) {
      fill(into, el('p', {class: 'hint'}, 'Expand the row first: its payload is asked of a neighbour\'s question.'));
      return;
    }
    const [direction, from] = edge.dst === id ? ['forward', edge.src] : ['backward', edge.dst];
    fill(into, el('p', {class: 'loading'}, 'Reading the payload…'));
    try {
      const answer = await api(`/v1/lineage/${direction}`, {rid: from, to: row.dataset || row.kind, payload: 'true'});
      const found = (answer.answer || []).find((r) => String(r.rid) === String(id));
      const value = found ? found.payload : undefined;
      fill(into, el('h3', {}, 'Payload'), value === undefined || value === null
        ? el('p', {class: 'hint'}, 'The server gave no payload for this row.')
        : el('pre', {class: 'json'}, JSON.stringify(value, null, 2)));
    } catch (error) {
      failed(error, into);
    }
  }

  // ---- queries and batches --------------------------------------------------------------

  const STATUS_TEXT = {full: 'fully captured', sampled: 'sampled', 'log-only': 'log only: no edges',
    failed: 'failed', null: 'not logged yet'};

  function statusBadge(status) {
    return el('span', {class: `badge status-${status || 'none'}`}, status || 'not logged');
  }

  async function queriesView() {
    const out = el('section', {}, el('p', {class: 'loading'}, 'Reading the batch log…'));
    fill(main(), el('h1', {}, 'Queries'), out);
    try {
      queriesCache = null;
      const queries = await knownQueries();
      if (!queries.length) {
        fill(out, el('p', {}, 'No traced query has a plan in the store yet.'));
        return;
      }
      fill(out, el('table', {class: 'list', id: 'queries'},
        el('tr', {}, ['query', 'sink', 'batches', 'not fully captured', 'statuses', 'last batch at'].map((h) => el('th', {}, h))),
        queries.map((q) => el('tr', {},
          el('td', {}, link(q.name, hashOf('/query', {name: q.name}), {class: 'query-link'})),
          el('td', {class: 'wrap'}, shortDataset(q.sink)),
          el('td', {}, String(q.batches)),
          el('td', {class: q.gaps ? 'bad' : 'good'}, String(q.gaps)),
          el('td', {}, Object.entries(q.statuses).map(([s, n]) => `${s}: ${n}`).join(', ')),
          el('td', {}, q.last_at || '')))));
    } catch (error) {
      failed(error, out);
    }
  }

  function percent(ratio) {
    const value = ratio * 100;
    return `${value >= 10 || value === 0 ? Math.round(value) : value.toFixed(1)}%`;
  }

  function timeline(batches, budget, name) {
    const SVG = 'http://www.w3.org/2000/svg';
    const s = (tag, attrs, parent) => {
      const node = document.createElementNS(SVG, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
      if (parent) parent.appendChild(node);
      return node;
    };
    const bar = Math.max(4, Math.min(28, Math.floor(900 / Math.max(1, batches.length))));
    const width = Math.max(320, batches.length * (bar + 2) + 70);
    const height = 190;
    const top = 16;
    const base = 140;
    const overheads = batches.map((b) => b.overhead || 0);
    const scale = Math.max(budget > 0 ? budget * 1.5 : 0, ...overheads, 0.05);
    const y = (v) => base - Math.min(1, v / scale) * (base - top);
    const chart = s('svg', {id: 'timeline', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
      'aria-label': 'batches: capture status and overhead'});
    s('line', {x1: 50, y1: base, x2: width - 10, y2: base, class: 'axis'}, chart);
    for (const tick of [0, scale / 2, scale]) {
      s('text', {x: 44, y: y(tick) + 4, 'text-anchor': 'end', class: 'tick'}, chart).textContent = percent(tick);
    }
    if (budget > 0) {
      s('line', {x1: 50, y1: y(budget), x2: width - 10, y2: y(budget), class: 'budget'}, chart);
      s('text', {x: width - 12, y: y(budget) - 4, 'text-anchor': 'end', class: 'tick budget-text'}, chart).textContent =
        `budget ${percent(budget)}`;
    }
    batches.forEach((b, i) => {
      const x = 54 + i * (bar + 2);
      const a = document.createElementNS(SVG, 'a');
      a.setAttribute('href', hashOf('/batch', {query: name, batch: b.batch}));
      a.setAttribute('class', `batch-bar${b.gap ? ' gap' : ''}`);
      a.setAttribute('data-batch', String(b.batch));
      chart.appendChild(a);
      const h = Math.max(2, base - y(b.overhead || 0));
      s('rect', {x, y: base - h, width: bar, height: h, class: `bar status-${b.status || 'none'}`}, a);
      s('rect', {x, y: base + 4, width: bar, height: 10, class: `strip status-${b.status || 'none'}`}, a);
      if (b.gap) s('text', {x: x + bar / 2, y: base + 28, 'text-anchor': 'middle', class: 'gap-mark'}, a).textContent = '▲';
      const title = document.createElementNS(SVG, 'title');
      title.textContent = `batch ${b.batch}: ${STATUS_TEXT[b.status] || b.status}` +
        (b.overhead !== null && b.overhead !== undefined ? `, overhead ${percent(b.overhead)}` : '') +
        (b.at ? `, at ${b.at}` : '');
      a.appendChild(title);
    });
    if (batches.length) {
      s('text', {x: 54, y: height - 8, class: 'tick'}, chart).textContent = `batch ${batches[0].batch}`;
      const end = 54 + (batches.length - 1) * (bar + 2) + bar;
      if (end - 54 > 110) {
        s('text', {x: end, y: height - 8, 'text-anchor': 'end', class: 'tick'}, chart).textContent =
          `batch ${batches[batches.length - 1].batch}`;
      }
    }
    return chart;
  }

  function planDrawing(operators) {
    const svgNode = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svgNode.setAttribute('id', 'plan');
    const ids = new Set(operators.map((op) => String(op.id)));
    HWGraph.draw(svgNode, {
      nodes: operators.map((op) => ({id: String(op.id), w: 260, h: 42, cls: `operator op-${op.kind.replace(/\W+/g, '-')}`,
        lines: [[op.name, 'title'], [`${op.kind} · operator ${op.id}`, 'meta']], title: `${op.kind}: ${op.name}`,
        attrs: {'data-op': String(op.id), 'data-name': op.name}})),
      edges: operators.flatMap((op) => (op.inputs || []).filter((i) => ids.has(String(i)))
        .map((i) => ({src: String(i), dst: String(op.id), label: ''}))),
    }, {}, {vertical: true});
    return svgNode;
  }

  async function queryView(params) {
    const name = params.get('name') || '';
    const out = el('section', {}, el('p', {class: 'loading'}, 'Reading the batch log…'));
    fill(main(), el('h1', {}, `Query ${name}`), out);
    let q;
    try {
      q = await api('/v1/query', {name, limit: 500});
    } catch (error) {
      failed(error, out);
      return;
    }
    const budget = q.budget || 0;
    const recent = [...q.batches].reverse();
    fill(out, 
      fieldRows([['sink', q.sink], ['sources', (q.sources || []).map((s) => s.name || s.dataset || s.kind).join(', ')],
        ['output columns', (q.output_columns || []).join(', ')], ['batches', `${q.count}${q.truncated ? ` (the latest ${q.batches.length} shown)` : ''}`],
        ['overhead budget', budget > 0 ? `${percent(budget)} (this server's config)` : 'none set (this server\'s config)']]),
      el('h2', {}, 'Plan'),
      q.operators && q.operators.length
        ? el('div', {class: 'canvas plan'}, planDrawing(q.operators))
        : el('p', {class: 'hint'}, 'No plan with operators is kept for this query.'),
      el('h2', {}, 'Batches'),
      el('p', {class: 'hint'}, 'Bar height: capture time over the rest of the batch\'s time; colour: capture status; ▲: not fully captured. Click a batch.'),
      el('div', {class: 'canvas'}, timeline(q.batches, budget, name)),
      el('div', {class: 'legend'}, ['full', 'sampled', 'log-only', 'failed', 'none'].map((s) =>
        el('span', {class: 'legend-item'}, el('span', {class: `swatch status-${s}`}), STATUS_TEXT[s === 'none' ? null : s]))),
      el('h2', {}, `Gaps (${q.gaps.length})`),
      q.gaps.length ? el('ul', {id: 'gaps'}, q.gaps.map((g) => el('li', {},
        link(`batch ${g.batch}`, hashOf('/batch', {query: name, batch: g.batch}), {class: 'gap-link'}), ' ', statusBadge(g.status))))
        : el('p', {}, 'Every batch in the log was fully captured.'),
      el('h2', {}, 'Latest batches'),
      el('table', {class: 'list', id: 'batches'},
        el('tr', {}, ['batch', 'status', 'at', 'rows in', 'rows out', 'seconds', 'capture s', 'overhead'].map((h) => el('th', {}, h))),
        recent.slice(0, 50).map((b) => el('tr', {class: b.gap ? 'gap' : ''},
          el('td', {}, link(String(b.batch), hashOf('/batch', {query: name, batch: b.batch}))),
          el('td', {}, statusBadge(b.status)), el('td', {}, b.at || ''),
          el('td', {}, b.rows_in ?? ''), el('td', {}, b.rows_out ?? ''), el('td', {}, b.seconds ?? ''),
          el('td', {}, b.capture_seconds ?? ''),
          el('td', {class: budget > 0 && b.overhead > budget ? 'bad' : ''},
            b.overhead === null || b.overhead === undefined ? '' : percent(b.overhead))))));
  }

  async function batchView(params) {
    const query = params.get('query') || '';
    const batch = params.get('batch') || '';
    const out = el('section', {}, el('p', {class: 'loading'}, 'Reading the batch log…'));
    fill(main(), el('div', {class: 'title-row'}, el('h1', {}, `Batch ${batch} of `,
      link(query, hashOf('/query', {name: query})))), out);
    let b;
    try {
      b = await api('/v1/batch', {query, batch, limit: 1000});
    } catch (error) {
      failed(error, out);
      return;
    }
    const rows = el('ol', {class: 'rids many', id: 'batch-rows'}, b.rows.slice(0, 200).map((r) => el('li', {},
      link(`rid ${r.rid}`, hashOf('/lineage', {dir: 'backward', rid: r.rid}), {class: 'rid-link'}),
      el('span', {class: 'meta', title: r.file}, ` ${basename(r.file).split('-').slice(0, 2).join('-')} row ${r.position}`))));
    const read = el('ul', {id: 'batch-read'}, b.read.map((r) => el('li', {},
      `${r.topic} partition ${r.partition}: offsets ${r.first} to ${r.last} `,
      link('forward from the first', hashOf('/lineage', {dir: 'forward', source: `kafka:${r.topic}:${r.partition}:${r.first}`}),
        {class: 'source-link'}))));
    const record = {...b.record};
    fill(out, 
      el('p', {}, statusBadge(b.status), ' ', STATUS_TEXT[b.status] || b.status || '',
        b.overhead !== null && b.overhead !== undefined ? ` · overhead ${percent(b.overhead)}` +
          (b.budget > 0 ? ` against a budget of ${percent(b.budget)}` : '') : ''),
      b.gap ? el('p', {class: 'warning', id: 'gap-note'}, 'This batch was not fully captured: lineage through it is ' +
        'inferred from the batch log, or missing. The rows it affects are below: the sink rows it wrote, and the ' +
        'Kafka records it read.') : null,
      el('h2', {}, `Sink rows it wrote (${b.rows.length}${b.truncated ? '+' : ''})`),
      el('p', {class: 'hint'}, 'The rows of the files its batch log record lists (sink_files): exactly what this batch ' +
        'wrote to the sink. Each opens its backward lineage.'),
      b.rows.length ? rows : el('p', {}, b.rows_note || 'None.'),
      el('h2', {}, 'Kafka records it read'),
      b.read.length ? read : el('p', {}, 'No Kafka offsets in its record.'),
      el('h2', {}, 'Batch log record'),
      el('pre', {class: 'json'}, JSON.stringify(record, null, 2)));
  }

  // ---- routing -------------------------------------------------------------------------

  const VIEWS = {'/': searchView, '/lineage': lineageView, '/where': whereView, '/queries': queriesView,
    '/query': queryView, '/batch': batchView};

  async function route() {
    const hash = window.location.hash.replace(/^#/, '') || '/';
    const [path, query] = hash.split('?');
    const view = VIEWS[path] || searchView;
    document.querySelectorAll('nav a').forEach((a) => a.classList.toggle('current',
      a.getAttribute('href') === `#${path}` || (path === '/lineage' && a.id === 'nav-search')));
    hideLogin();
    try {
      await view(new URLSearchParams(query || ''));
      refused = false;
    } catch (error) {
      failed(error);
    }
  }

  window.addEventListener('hashchange', route);
  document.addEventListener('DOMContentLoaded', () => {
    setupLogin();
    route();
  });
})();
