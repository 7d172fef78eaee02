'use strict';
// A layered drawing of a small directed acyclic graph in SVG: rows and their lineage, or a
// plan's operators. Data flows left to right (or top to bottom): a node's layer is the longest
// path to it from a node without inputs (a node without inputs sits just before its first
// consumer); each layer is ordered by the mean position of its neighbours, a few sweeps each
// way, to keep edges from crossing, then moved level with its neighbours as far as the order
// and the spacing allow. Labels of edges that share an end and a text are drawn once; the
// others are moved apart until none overlaps another.
window.HWGraph = (() => {
  const SVG = 'http://www.w3.org/2000/svg';
  const GAP_ACROSS = 18;  // between the nodes of one layer
  const MARGIN = 24;
  const LABEL_CHARS = 36;
  const CHAR_W = 6.3;  // of the 11px sans-serif labels, roughly
  const LINE_H = 14;

  function svg(tag, attrs, parent) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    if (parent) parent.appendChild(node);
    return node;
  }

  function cut(text, chars) {
    return text.length <= chars ? text : text.slice(0, chars - 1) + '…';
  }

  function layersOf(ids, edges) {
    const incoming = new Map(ids.map((id) => [id, []]));
    const outgoing = new Map(ids.map((id) => [id, []]));
    for (const e of edges) {
      if (e.src !== e.dst && incoming.has(e.dst) && outgoing.has(e.src)) {
        incoming.get(e.dst).push(e.src);
        outgoing.get(e.src).push(e.dst);
      }
    }
    const layer = new Map();
    const waiting = new Map(ids.map((id) => [id, incoming.get(id).length]));
    const queue = ids.filter((id) => waiting.get(id) === 0);
    queue.forEach((id) => layer.set(id, 0));
    for (let head = 0; head < queue.length; head++) {
      const id = queue[head];
      for (const next of outgoing.get(id)) {
        layer.set(next, Math.max(layer.get(next) || 0, layer.get(id) + 1));
        waiting.set(next, waiting.get(next) - 1);
        if (waiting.get(next) === 0) queue.push(next);
      }
    }
    for (const id of ids) if (!layer.has(id)) layer.set(id, 0);  // on a cycle: lineage has none
    for (const id of ids) {  // an input sits just before its first consumer, not at the far start
      if (!incoming.get(id).length && outgoing.get(id).length) {
        layer.set(id, Math.max(0, Math.min(...outgoing.get(id).map((next) => layer.get(next))) - 1));
      }
    }
    const used = [...new Set(layer.values())].sort((a, b) => a - b);
    const layers = used.map(() => []);
    for (const id of ids) layers[used.indexOf(layer.get(id))].push(id);
    const position = new Map();
    const index = (nodes) => nodes.forEach((id, i) => position.set(id, i / Math.max(1, nodes.length - 1)));
    layers.forEach(index);
    for (let sweep = 0; sweep < 6; sweep++) {
      const forth = sweep % 2 === 0;
      const neighbours = forth ? incoming : outgoing;
      for (const nodes of forth ? layers : [...layers].reverse()) {
        const weight = new Map(nodes.map((id) => {
          const near = neighbours.get(id);
          return [id, near.length ? near.reduce((sum, n) => sum + position.get(n), 0) / near.length : position.get(id)];
        }));
        nodes.sort((a, b) => weight.get(a) - weight.get(b));
        index(nodes);
      }
    }
    return layers;
  }

  // Positions as near ``wanted`` as they can be, in this order, each at least ``sizes[i-1] + GAP_ACROSS``
  // after the one before: least squares under order constraints (pool adjacent violators).
  function pack(wanted, sizes) {
    const offsets = [0];
    for (let i = 1; i < wanted.length; i++) offsets.push(offsets[i - 1] + sizes[i - 1] + GAP_ACROSS);
    const blocks = [];  // [mean, count]
    wanted.forEach((w, i) => {
      blocks.push([w - offsets[i], 1]);
      while (blocks.length > 1 && blocks[blocks.length - 2][0] > blocks[blocks.length - 1][0]) {
        const [m2, n2] = blocks.pop();
        const [m1, n1] = blocks.pop();
        blocks.push([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]);
      }
    });
    const out = [];
    for (const [mean, count] of blocks) for (let k = 0; k < count; k++) out.push(mean + offsets[out.length]);
    return out;
  }

  // {nodes: [{id, w, h}], edges: [{src, dst}]} -> {at: id -> {x, y}, width, height}. ``gap``: between
  // layers; ``vertical``: layers top to bottom.
  function layout(nodes, edges, gap, vertical) {
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const along = (id) => (vertical ? byId.get(id).h : byId.get(id).w);
    const across = (id) => (vertical ? byId.get(id).w : byId.get(id).h);
    const layers = layersOf(nodes.map((n) => n.id), edges);
    const before = new Map(nodes.map((n) => [n.id, []]));
    const after = new Map(nodes.map((n) => [n.id, []]));
    for (const e of edges) {
      if (before.has(e.dst) && after.has(e.src) && e.src !== e.dst) {
        before.get(e.dst).push(e.src);
        after.get(e.src).push(e.dst);
      }
    }
    const centre = new Map();
    const place = (ids, wanted) => {
      const starts = pack(wanted, ids.map(across));
      ids.forEach((id, i) => centre.set(id, starts[i] + across(id) / 2));
    };
    for (const ids of layers) place(ids, ids.map(() => 0));
    // each sweep levels a layer with the one it just placed (the layer before, then the one after): a
    // chain comes out straight, and the last sweep sets each input level with what it feeds
    for (let sweep = 0; sweep < 8; sweep++) {
      const forth = sweep % 2 === 0;
      for (const ids of forth ? layers : [...layers].reverse()) {
        place(ids, ids.map((id) => {
          const cs = (forth ? before : after).get(id).map((n) => centre.get(n));
          return (cs.length ? cs.reduce((a, b) => a + b, 0) / cs.length : centre.get(id)) - across(id) / 2;
        }));
      }
    }
    const first = Math.min(...nodes.map((n) => centre.get(n.id) - across(n.id) / 2));
    const at = new Map();
    let depth = MARGIN;
    let extent = 0;
    for (const ids of layers) {
      const size = Math.max(...ids.map(along));
      for (const id of ids) {
        const side = centre.get(id) - across(id) / 2 - first + MARGIN;
        at.set(id, vertical ? {x: side, y: depth} : {x: depth, y: side});
        extent = Math.max(extent, side + across(id));
      }
      depth += size + gap;
    }
    depth = depth - gap + MARGIN;
    extent += MARGIN;
    return {at, width: vertical ? extent : depth, height: vertical ? depth : extent};
  }

  function labelSize(lines) {
    return {w: Math.max(...lines.map((l) => l.length)) * CHAR_W + 12, h: lines.length * LINE_H + 4};
  }

  function linesOf(e, count) {
    const lines = [cut(e.label || '', LABEL_CHARS) + (count > 1 ? ` ×${count}` : '')];
    if (e.note) lines.push(cut(e.note, LABEL_CHARS));
    return lines.filter(Boolean);
  }

  function labelsOf(edges, ends) {
    // edges sharing an end and a label (three or more): one label, with their count
    const groups = new Map();
    const add = (key, e) => {
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(e);
    };
    for (const e of edges) {
      if (!e.label && !e.note) continue;
      add(['from', e.src, e.label, e.note, e.cls].join('\u0000'), e);
      add(['to', e.dst, e.label, e.note, e.cls].join('\u0000'), e);
    }
    const done = new Set();
    const sets = [];
    for (const group of [...groups.values()].sort((a, b) => b.length - a.length)) {
      const left = group.filter((e) => !done.has(e));
      if (left.length >= 3) {
        left.forEach((e) => done.add(e));
        sets.push(left);
      }
    }
    for (const e of edges) if ((e.label || e.note) && !done.has(e)) sets.push([e]);
    const labels = [];
    for (const members of sets) {
      const mids = members.map((e) => ends.get(e)).map(([x1, y1, x2, y2]) => [(x1 + x2) / 2, (y1 + y2) / 2]);
      mids.sort((a, b) => a[1] - b[1]);
      const [mx, my] = mids[Math.floor(mids.length / 2)];
      const lines = linesOf(members[0], members.length);
      const {w, h} = labelSize(lines);
      labels.push({x: mx - w / 2, y: my - h / 2, w, h, lines, edge: members[0]});
    }
    labels.sort((a, b) => a.y - b.y || a.x - b.x);
    const placed = [];
    for (const label of labels) {
      for (let moved = 0; moved < 400; moved++) {
        const hit = placed.find((p) => p.x < label.x + label.w && label.x < p.x + p.w &&
          p.y < label.y + label.h && label.y < p.y + p.h);
        if (!hit) break;
        label.y = hit.y + hit.h + 2;
      }
      placed.push(label);
    }
    return placed;
  }

  // Draw ``graph`` ({nodes: [{id, w, h, lines: [[text, cls]], cls, title, attrs, handles}],
  // edges: [{src, dst, label, note, cls, title}]}) into the <svg> ``into``, replacing what it held.
  // ``on.node(id)``, ``on.handle(id, direction)``: clicks. ``options.vertical``: top to bottom.
  function draw(into, graph, on, options) {
    const vertical = Boolean(options && options.vertical);
    while (into.firstChild) into.removeChild(into.firstChild);
    // between layers: room for the widest label, so that none covers a node
    const widest = Math.max(0, ...graph.edges.map((e) => (e.label || e.note ? labelSize(linesOf(e, 99)).w : 0)));
    const gap = vertical ? 44 : Math.max(80, Math.min(340, widest + 50));
    const {at, width, height} = layout(graph.nodes, graph.edges, gap, vertical);
    const byId = new Map(graph.nodes.map((n) => [n.id, n]));
    into.setAttribute('viewBox', `0 0 ${width} ${height}`);
    into.setAttribute('width', width);
    into.setAttribute('height', height);
    const defs = svg('defs', {}, into);
    for (const name of ['plain', 'gap', 'inferred', 'unexplained']) {
      const marker = svg('marker', {id: `arrow-${name}`, viewBox: '0 0 10 10', refX: 9, refY: 5,
        markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse', class: `arrowhead ${name}`}, defs);
      svg('path', {d: 'M 0 0 L 10 5 L 0 10 z'}, marker);
    }
    const edgeLayer = svg('g', {class: 'edges'}, into);
    const ends = new Map();
    for (const e of graph.edges) {
      const a = at.get(e.src);
      const b = at.get(e.dst);
      if (!a || !b) continue;
      const from = byId.get(e.src);
      const to = byId.get(e.dst);
      const [x1, y1, x2, y2] = vertical ? [a.x + from.w / 2, a.y + from.h, b.x + to.w / 2, b.y]
        : [a.x + from.w, a.y + from.h / 2, b.x, b.y + to.h / 2];
      ends.set(e, [x1, y1, x2, y2]);
      const bend = Math.max(30, Math.abs(vertical ? y2 - y1 : x2 - x1) / 2);
      const curve = vertical ? `C ${x1} ${y1 + bend}, ${x2} ${y2 - bend}` : `C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}`;
      const classes = (e.cls || '').split(' ');
      const kind = ['gap', 'unexplained', 'inferred'].find((k) => classes.includes(k)) || 'plain';
      const path = svg('path', {d: `M ${x1} ${y1} ${curve}, ${x2} ${y2}`, class: `edge ${e.cls || ''}`,
        'marker-end': `url(#arrow-${kind})`, 'data-src': e.src, 'data-dst': e.dst}, edgeLayer);
      if (e.title) svg('title', {}, path).textContent = e.title;
    }
    const nodeLayer = svg('g', {class: 'nodes'}, into);
    for (const n of graph.nodes) {
      const {x, y} = at.get(n.id);
      const g = svg('g', {class: `node ${n.cls || ''}`, transform: `translate(${x},${y})`, tabindex: 0,
        role: 'button', ...(n.attrs || {})}, nodeLayer);
      svg('rect', {width: n.w, height: n.h, rx: 6, class: 'box'}, g);
      n.lines.forEach(([text, cls], i) => {
        svg('text', {x: 10, y: 18 + i * 16, class: cls || ''}, g).textContent =
          cut(String(text), Math.floor((n.w - 20) / (i === 0 ? 7.4 : 6.6)));
      });
      if (n.title) svg('title', {}, g).textContent = n.title;
      g.addEventListener('click', () => on.node && on.node(n.id));
      g.addEventListener('keydown', (event) => {
        if ((event.key === 'Enter' || event.key === ' ') && on.node) {
          event.preventDefault();
          on.node(n.id);
        }
      });
      for (const direction of n.handles || []) {
        const hx = direction === 'backward' ? 0 : n.w;
        const handle = svg('g', {class: `handle ${direction}`, transform: `translate(${hx},${n.h / 2})`,
          'data-direction': direction}, g);
        svg('circle', {r: 8}, handle);
        svg('text', {y: 4, 'text-anchor': 'middle'}, handle).textContent = '+';
        svg('title', {}, handle).textContent = direction === 'backward' ? 'Expand: what this row was derived from'
          : 'Expand: what was derived from this row';
        handle.addEventListener('click', (event) => {
          event.stopPropagation();
          if (on.handle) on.handle(n.id, direction);
        });
      }
    }
    const labelLayer = svg('g', {class: 'edge-labels'}, into);  // drawn last: over edges and nodes alike
    for (const label of labelsOf([...ends.keys()], ends)) {
      const g = svg('g', {class: `edge-label ${label.edge.cls || ''}`}, labelLayer);
      svg('rect', {x: label.x, y: label.y, width: label.w, height: label.h, rx: 3}, g);
      label.lines.forEach((line, i) => {
        svg('text', {x: label.x + label.w / 2, y: label.y + 13 + i * LINE_H, 'text-anchor': 'middle',
          class: i ? 'note' : 'ops'}, g).textContent = line;
      });
      svg('title', {}, g).textContent = label.edge.title || label.edge.label;
    }
  }

  return {draw, layout};
})();
