// Flotilla's dashboard: the endpoint list, and the selected endpoint's last hour at 1 s from
// GET /api/2.0/serving-endpoints/{name}/metrics, refreshed every second. Data goes into the page
// as text only (textContent), never as markup.
'use strict';

const TOKEN_KEY = 'flotilla.token';
const HOUR_MS = 3600 * 1000;
const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
                '#17becf', '#7f7f7f', '#bcbd22'];
const CODE_COLORS = {2: '#2ca02c', 3: '#1f77b4', 4: '#ff7f0e', 5: '#d62728'};

const state = {
  token: null,
  endpoint: null,   // the selected endpoint's name
  samples: [],      // its seconds, oldest first, at most an hour
  events: [],       // its events, newest first
  charts: {},
  refreshes: 0,
};

// The token: from the fragment (then removed from the address bar), else this tab's session
// storage, else a prompt. The fragment never reaches the server.
function takeToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get('token');
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    fragment.delete('token');
    const rest = fragment.toString();
    history.replaceState(null, '', location.pathname + location.search + (rest ? '#' + rest : ''));
  }
  let token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    token = (window.prompt('Flotilla admin token') || '').trim();
    if (token) {
      sessionStorage.setItem(TOKEN_KEY, token);
    }
  }
  return token;
}

async function api(path) {
  const response = await fetch(path, {
    headers: {Authorization: 'Bearer ' + state.token},
    cache: 'no-store',
  });
  const body = await response.json().catch(() => ({}));
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
  }
  if (!response.ok) {
    throw new Error(path + ': ' + (body.message || 'HTTP ' + response.status));
  }
  return body;
}

function setStatus(text, kind) {
  const status = document.getElementById('status');
  status.textContent = text;
  status.dataset.state = kind;
}

function timeText(ms) {
  return new Date(ms).toLocaleTimeString([], {hour12: false});
}

function cell(row, text) {
  const td = document.createElement('td');
  td.textContent = text;
  row.appendChild(td);
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector('#' + tableId + ' tbody');
  body.replaceChildren(...rows);
}

// ---- the endpoint list ---------------------------------------------------------------------

function replicasText(view) {
  const counts = {};
  for (const replica of view.replicas || []) {
    counts[replica.state] = (counts[replica.state] || 0) + 1;
  }
  return Object.entries(counts).map(([s, n]) => n + ' ' + s).join(', ') || 'none';
}

function versionsText(view) {
  return (view.versions || [])
      .filter((v) => v.serving || v.role === 'target')
      .map((v) => v.name + ' ' + v.traffic + '%' + (v.serving ? '' : ' (rolling out)'))
      .join(', ');
}

async function refreshList() {
  const list = await api('/api/2.0/serving-endpoints');
  const names = list.endpoints.map((view) => view.name);
  if (!state.endpoint || !names.includes(state.endpoint)) {
    const wanted = new URLSearchParams(location.hash.slice(1)).get('endpoint');
    selectEndpoint(names.includes(wanted) ? wanted : names[0] || null);
  }
  const rows = await Promise.all(list.endpoints.map(async (view) => {
    const row = document.createElement('tr');
    row.dataset.endpoint = view.name;
    row.classList.toggle('selected', view.name === state.endpoint);
    row.addEventListener('click', () => selectEndpoint(view.name));
    cell(row, view.name);
    cell(row, view.state.ready + (view.state.config_update === 'IN_PROGRESS' ? ', updating' : ''));
    cell(row, versionsText(view));
    cell(row, replicasText(view));
    try {
      const summary = (await api(metricsPath(view.name, '60s'))).summary;
      cell(row, summary.requests_per_second.toFixed(1));
      cell(row, summary.latency_p99_ms ? summary.latency_p99_ms.toFixed(1) : '-');
    } catch (error) {
      cell(row, '-');
      cell(row, '-');
    }
    if (view.name === state.endpoint) {
      fillReplicas(view);
    }
    return row;
  }));
  fill('endpoints', rows);
}

function fillReplicas(view) {
  fill('replicas', (view.replicas || []).map((replica) => {
    const row = document.createElement('tr');
    cell(row, replica.id);
    cell(row, replica.version || '');
    cell(row, replica.state + (replica.reason ? ' (' + replica.reason + ')' : ''));
    cell(row, replica.address || '');
    cell(row, replica.started_unix_ms ? timeText(replica.started_unix_ms) : '');
    return row;
  }));
}

// ---- the selected endpoint -----------------------------------------------------------------

function metricsPath(name, window) {
  return '/api/2.0/serving-endpoints/' + encodeURIComponent(name) + '/metrics?window=' + window;
}

function selectEndpoint(name) {
  if (name === state.endpoint) {
    return;
  }
  state.endpoint = name;
  state.samples = [];
  state.events = [];
  document.getElementById('detail').hidden = !name;
  document.getElementById('detail-title').textContent = name || '';
  for (const row of document.querySelectorAll('#endpoints tbody tr')) {
    row.classList.toggle('selected', row.dataset.endpoint === name);
  }
}

async function refreshDetail() {
  const name = state.endpoint;
  if (!name) {
    return;
  }
  // The whole hour once, then the last seconds each refresh.
  const window = state.samples.length === 0 ? '1h' : '10s';
  const [metrics, events] = await Promise.all([
    api(metricsPath(name, window)),
    api('/api/2.0/serving-endpoints/' + encodeURIComponent(name) + '/events?limit=500'),
  ]);
  if (name !== state.endpoint) {
    return;  // another was selected meanwhile
  }
  const last = state.samples.length ? state.samples[state.samples.length - 1].timestamp : 0;
  for (const sample of metrics.samples) {
    if (sample.timestamp > last) {
      state.samples.push(sample);
    }
  }
  const since = Date.now() - HOUR_MS;
  state.samples = state.samples.filter((s) => s.timestamp > since);
  state.events = events.events;
  fill('events', state.events.slice(0, 50).map((event) => {
    const row = document.createElement('tr');
    cell(row, timeText(event.timestamp));
    cell(row, event.kind);
    cell(row, event.actor);
    cell(row, event.message);
    return row;
  }));
  drawCharts();
}

// Vertical dashed lines at the events inside a chart's time range, labelled with their kind.
const eventMarkers = {
  id: 'eventMarkers',
  afterDatasetsDraw(chart) {
    const x = chart.scales.x;
    const area = chart.chartArea;
    const context = chart.ctx;
    const kinds = [];
    context.save();
    context.setLineDash([4, 3]);
    context.strokeStyle = '#6b7785';
    context.fillStyle = '#3e4a57';
    context.font = '10px system-ui, sans-serif';
    for (const event of state.events) {
      if (event.timestamp < x.min || event.timestamp > x.max) {
        continue;
      }
      const at = x.getPixelForValue(event.timestamp);
      context.beginPath();
      context.moveTo(at, area.top);
      context.lineTo(at, area.bottom);
      context.stroke();
      context.fillText(event.kind, at + 2, area.top + 10 + (kinds.length % 4) * 11);
      kinds.push(event.kind);
    }
    context.restore();
    chart.canvas.closest('figure').dataset.events = kinds.join(',');
  },
};

function makeChart(id, yTitle, stacked) {
  return new Chart(document.getElementById(id), {
    type: 'line',
    data: {datasets: []},
    options: {
      animation: false,
      parsing: false,
      normalized: true,
      maintainAspectRatio: false,
      interaction: {mode: 'nearest', axis: 'x', intersect: false},
      elements: {point: {radius: 0}, line: {borderWidth: 1.5}},
      scales: {
        x: {type: 'linear', ticks: {callback: (value) => timeText(value), maxTicksLimit: 8}},
        y: {beginAtZero: true, stacked: stacked, title: {display: true, text: yTitle}},
      },
      plugins: {legend: {position: 'bottom', labels: {boxWidth: 12}}},
    },
    plugins: [eventMarkers],
  });
}

function series(label, color, pick, extra) {
  const points = [];
  for (const sample of state.samples) {
    const y = pick(sample);
    if (y !== undefined && y !== null) {
      points.push({x: sample.timestamp, y: y});
    }
  }
  return Object.assign({label: label, data: points, borderColor: color, backgroundColor: color},
                       extra || {});
}

function datasets() {
  const codes = new Set();
  const replicaKeys = new Set();
  for (const sample of state.samples) {
    Object.keys(sample.codes).forEach((code) => codes.add(code));
    for (const [version, states] of Object.entries(sample.replicas)) {
      Object.keys(states).forEach((s) => replicaKeys.add(version + ' ' + s));
    }
  }
  const filled = {fill: true};
  return {
    requests: [...codes].sort().map((code, i) => series(
        code, CODE_COLORS[code[0]] || COLORS[i % COLORS.length], (s) => s.codes[code] || 0,
        filled)),
    latency: [series('p50', COLORS[0], (s) => s.requests ? s.latency_p50_ms : null),
              series('p99', COLORS[1], (s) => s.requests ? s.latency_p99_ms : null)],
    load: [series('in flight', COLORS[0], (s) => s.in_flight),
           series('queued', COLORS[3], (s) => s.queued)],
    replicas: [...[...replicaKeys].sort().map((key, i) => {
      const [version, replicaState] = key.split(' ');
      return series(key, COLORS[i % COLORS.length],
                    (s) => (s.replicas[version] || {})[replicaState] || 0, filled);
    }), series('wanted', '#111111', (s) => s.desired_replicas, {borderDash: [6, 4], stack: 'own'})],
    target: [series('target concurrency', COLORS[4], (s) => s.target_concurrency)],
  };
}

function drawCharts() {
  if (!state.charts.requests) {
    state.charts = {
      requests: makeChart('chart-requests', 'req/s', true),
      latency: makeChart('chart-latency', 'ms', false),
      load: makeChart('chart-load', 'requests', false),
      replicas: makeChart('chart-replicas', 'replicas', true),
      target: makeChart('chart-target', 'concurrent requests', false),
    };
  }
  const now = Date.now();
  const first = state.samples.length ? state.samples[0].timestamp : now - 60 * 1000;
  const sets = datasets();
  for (const [key, chart] of Object.entries(state.charts)) {
    chart.data.datasets = sets[key];
    chart.options.scales.x.min = Math.min(first, now - 60 * 1000);
    chart.options.scales.x.max = now;
    chart.update('none');
    const points = sets[key].reduce((sum, set) => sum + set.data.length, 0);
    chart.canvas.closest('figure').dataset.points = String(points);
  }
}

// ---- the loop ------------------------------------------------------------------------------

async function refresh() {
  try {
    await refreshList();
    await refreshDetail();
    state.refreshes += 1;
    const status = document.getElementById('status');
    status.dataset.samples = String(state.samples.length);
    status.dataset.refreshes = String(state.refreshes);
    setStatus('updated ' + timeText(Date.now()) + (state.endpoint ? ' · ' + state.samples.length +
              ' s of ' + state.endpoint : ''), 'ok');
  } catch (error) {
    setStatus(String(error.message || error), 'error');
  }
}

async function loop() {
  await refresh();
  setTimeout(loop, 1000);
}

document.getElementById('forget').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.reload();
});

state.token = takeToken();
if (state.token) {
  loop();
} else {
  setStatus('no token: open /dashboard/#token=<admin token>, or reload to be asked', 'error');
}
