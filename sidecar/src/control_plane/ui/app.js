// The trajectory viewer. Reads the sidecar's admin API with the admin token and polls it for
// live updates. Recorded text is untrusted: it only ever becomes text nodes (textContent),
// never markup.
'use strict';

const TOKEN_KEY = 'clawback.admin-token';
const POLL_MS = 4000;
const SVG_NS = 'http://www.w3.org/2000/svg';

const state = {
  tenant: null,
  trajectory: null,
  // The operator's search (`q`): every word, in any case, somewhere in the conversation.
  query: '',
  // The last search's answer, kept while the query stays the same.
  lastSearch: null,
  busy: false,
  // A refresh asked for while one was running (a click during a poll): run it right after.
  again: false,
  // The last JSON each view was drawn from: a poll that changed nothing redraws nothing, so an
  // open <details> or a scroll position survives.
  drawn: { tenants: '', list: '', rewards: '', gate: '', trajectory: '' },
};

class AuthError extends Error {}

// ---- small DOM helpers -------------------------------------------------------------------

/** An element with attributes (`class`, `text`, `data-*`, anything else) and children. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = String(value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

const $ = (id) => document.getElementById(id);

function time(ms) {
  if (!ms) return '—';
  return new Date(ms).toLocaleString(undefined, { hour12: false });
}

function shortId(id) {
  return String(id).slice(0, 8) + '…' + String(id).slice(-4);
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) {
    return String(text);
  }
}

function signClass(reward) {
  if (reward > 0) return 'positive';
  if (reward < 0) return 'negative';
  return 'neutral';
}

// ---- token and navigation state -----------------------------------------------------------

function hashParams() {
  return new URLSearchParams(location.hash.replace(/^#/, ''));
}

/** Moves a token handed over in the fragment into sessionStorage and out of the address bar. */
function adoptFragmentToken() {
  const params = hashParams();
  const token = params.get('token');
  if (token === null) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  params.delete('token');
  history.replaceState(null, '', location.pathname + (params.toString() ? '#' + params : ''));
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function readLocation() {
  const params = hashParams();
  state.tenant = params.get('tenant') || state.tenant;
  state.trajectory = params.get('trajectory');
  state.query = params.get('q') || '';
  $('query').value = state.query;
}

// ---- the admin API ------------------------------------------------------------------------

async function api(path) {
  const response = await fetch(path, {
    headers: { authorization: 'Bearer ' + token() },
    cache: 'no-store',
  });
  if (response.status === 401) throw new AuthError('the admin token was refused');
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    // an empty or non-JSON error body: reported by status below
  }
  if (!response.ok) {
    const message = body && body.error && body.error.message;
    throw new Error(message || `${path}: HTTP ${response.status}`);
  }
  return body;
}

// ---- views --------------------------------------------------------------------------------

function drawTenants(tenants) {
  const nav = $('tenants');
  nav.replaceChildren(
    ...tenants.map((t) =>
      el('a', {
        href: '#tenant=' + encodeURIComponent(t.tenant),
        class: t.tenant === state.tenant ? 'selected' : '',
        'data-tenant': t.tenant,
        text: t.tenant,
      }),
    ),
  );
  const current = tenants.find((t) => t.tenant === state.tenant);
  const policy = $('policy');
  if (current && current.policy) {
    const p = current.policy;
    policy.replaceChildren(
      'live policy: ',
      el('strong', { id: 'policy-adapter', text: p.adapter }),
      ' ',
      el('span', { id: 'policy-version', 'data-version': p.version, text: 'v' + p.version }),
      el('span', { class: 'muted', text: ' since ' + time(p.live_since) }),
    );
  } else {
    policy.replaceChildren('live policy: ', el('strong', { text: 'base model' }));
  }
}

function drawList(list) {
  const ul = $('trajectories');
  const shown = list.trajectories.length;
  if (list.searched !== undefined) {
    $('list-note').textContent = `(${shown} matching, of the newest ${list.searched} searched)`;
  } else {
    $('list-note').textContent = list.complete ? `(${shown})` : `(newest ${shown} of the first 10 000)`;
  }
  if (shown === 0) {
    const empty = list.searched !== undefined ? 'nothing matches' : 'nothing recorded yet';
    ul.replaceChildren(el('li', { class: 'muted', text: empty }));
    return;
  }
  ul.replaceChildren(
    ...list.trajectories.map((t) => {
      const label = t.metadata && (t.metadata.task || t.metadata.session);
      const summary = t.summary || {};
      const steps = summary.steps === undefined ? null : `${summary.steps} step${summary.steps === 1 ? '' : 's'}`;
      return el(
        'li',
        {},
        el(
          'a',
          {
            href: `#tenant=${encodeURIComponent(state.tenant)}&trajectory=${t.id}`,
            class: t.id === state.trajectory ? 'selected' : '',
            'data-trajectory': t.id,
          },
          el('div', {
            class: 'first-message',
            'data-first-message': '',
            text: summary.first_user_message || '(no user message)',
          }),
          el('span', { class: 'pill ' + t.status, text: t.status }),
          t.live ? [' ', el('span', { class: 'pill live', text: 'live' })] : null,
          summary.reward !== undefined && summary.reward !== null
            ? [' ', el('span', {
              class: 'reward ' + signClass(summary.reward),
              'data-list-reward': summary.reward,
              title: `mean of ${summary.rewards} reward${summary.rewards === 1 ? '' : 's'}`,
              text: summary.reward.toFixed(2),
            })]
            : null,
          el(
            'div',
            { class: 'meta' },
            [t.tenant, steps, time(t.created_at), shortId(t.id)].filter(Boolean).join(' · '),
            label ? ' · ' + (typeof label === 'string' ? label : JSON.stringify(label)) : '',
            t.group ? ` · group of ${t.group.size}` : '',
          ),
        ),
      );
    }),
  );
}

/** Reward over time: one dot per reward, and the running mean of the last ten. */
function drawRewards(rewards) {
  const box = $('rewards-chart');
  const points = rewards.points;
  const mean = points.length
    ? points.reduce((sum, p) => sum + p.reward, 0) / points.length
    : null;
  $('rewards-note').textContent =
    `(${points.length} from the newest ${rewards.trajectories} trajectories` +
    (mean === null ? ')' : `, mean ${mean.toFixed(3)})`);
  if (points.length === 0) {
    box.replaceChildren(el('p', { class: 'muted', text: 'no rewards yet' }));
    return;
  }
  const W = 760, H = 190, left = 40, right = 12, top = 12, bottom = 28;
  let t0 = points[0].at, t1 = points[points.length - 1].at;
  if (t1 - t0 < 1000) { t0 -= 30000; t1 += 30000; }
  let lo = Math.min(-1, ...points.map((p) => p.reward));
  let hi = Math.max(1, ...points.map((p) => p.reward));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (W - left - right);
  const y = (r) => top + ((hi - r) / (hi - lo)) * (H - top - bottom);
  const chart = svg('svg', {
    viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'reward over time', id: 'rewards-svg',
  });
  chart.append(
    svg('line', { class: 'axis', x1: left, y1: top, x2: left, y2: H - bottom }),
    svg('line', { class: 'axis', x1: left, y1: H - bottom, x2: W - right, y2: H - bottom }),
    svg('line', { class: 'zero', x1: left, y1: y(0), x2: W - right, y2: y(0) }),
  );
  for (const r of [hi, 0, lo]) {
    chart.append(svg('text', { class: 'label', x: left - 6, y: y(r) + 4, 'text-anchor': 'end' },
      String(Number(r.toFixed(2)))));
  }
  chart.append(
    svg('text', { class: 'label', x: left, y: H - 8 }, time(t0)),
    svg('text', { class: 'label', x: W - right, y: H - 8, 'text-anchor': 'end' }, time(t1)),
  );
  const recent = [];
  const meanPath = [];
  for (const p of points) {
    recent.push(p.reward);
    if (recent.length > 10) recent.shift();
    const m = recent.reduce((a, b) => a + b, 0) / recent.length;
    meanPath.push(`${x(p.at).toFixed(1)},${y(m).toFixed(1)}`);
  }
  chart.append(svg('polyline', { class: 'mean', points: meanPath.join(' ') }));
  for (const p of points) {
    const dot = svg('circle', {
      class: 'point ' + signClass(p.reward), cx: x(p.at).toFixed(1), cy: y(p.reward).toFixed(1),
      r: 4, 'data-reward': p.reward, 'data-trajectory': p.trajectory,
    });
    const where = p.step_index === null ? 'trajectory' : 'turn ' + p.step_index;
    dot.append(svg('title', {}, `${p.reward} · ${where} of ${shortId(p.trajectory)} · ${p.source} · ${time(p.at)}`));
    chart.append(dot);
  }
  box.replaceChildren(chart);
}

/** What the trainer's gate decided about the tenant's candidate versions, newest first. */
function drawGate(gate) {
  const box = $('gate');
  const decisions = gate.decisions;
  const held = decisions.filter((d) => !d.promoted).length;
  $('gate-note').textContent = decisions.length
    ? `(the newest ${decisions.length}: ${decisions.length - held} promoted, ${held} held back)`
    : '';
  if (decisions.length === 0) {
    box.replaceChildren(el('p', {
      class: 'muted',
      text: "no gate decisions: the trainer's [gate] is off, or it has not judged a candidate yet",
    }));
    return;
  }
  const rows = decisions.map((d) => el(
    'tr',
    { class: d.promoted ? 'promoted' : 'held-back', 'data-gate-version': d.version },
    el('td', { text: 'v' + d.version }),
    el('td', { text: d.promoted ? 'promoted' : 'held back' }),
    el('td', { text: d.live === null || d.live === undefined ? 'the base' : 'v' + d.live }),
    el('td', {}, d.sets.map((s) => el('div', {
      text: `${s.name} ${s.candidate}/${s.prompts} (live ${s.live}, base ${s.base})`,
    }))),
    el('td', { text: d.kl.toFixed(4) }),
    el('td', { text: d.seconds.toFixed(0) + ' s' }),
    el('td', { text: time(d.decided_at) }),
    el('td', { class: 'reasons' }, d.reasons.map((r) => el('div', { text: r }))),
  ));
  box.replaceChildren(el(
    'table',
    { class: 'gate', id: 'gate-table' },
    el('thead', {}, el('tr', {}, ['version', 'decision', 'against', 'prompts passed', 'KL to base',
      'took', 'when', 'why held back'].map((h) => el('th', { text: h })))),
    el('tbody', {}, rows),
  ));
}

/** The text of an OpenAI message's `content`: a string, or the text of its parts. */
function contentText(content) {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => {
        if (typeof part === 'string') return part;
        if (part.text !== undefined) return part.text;
        if (part.type === 'image_url' || part.type === 'input_image') return '[image]';
        return JSON.stringify(part);
      })
      .join('\n');
  }
  return JSON.stringify(content, null, 2);
}

function toolCall(call) {
  // Chat: {id, function: {name, arguments}}; Responses: {type: "function_call", name, arguments}.
  const fn = call.function || call;
  return el(
    'div',
    { class: 'tool-call', 'data-tool-call': fn.name || '' },
    el('span', { class: 'tool-name', text: fn.name || '(unnamed tool)' }),
    call.id || call.call_id ? el('span', { class: 'muted', text: '  ' + (call.id || call.call_id) }) : null,
    el('pre', { text: pretty(fn.arguments === undefined ? '' : fn.arguments) }),
  );
}

/** One message of a conversation (chat message or Responses input item). */
function message(m) {
  if (m && m.type === 'function_call') {
    return el('div', { class: 'message assistant' }, el('div', { class: 'role', text: 'assistant · tool call' }), toolCall(m));
  }
  const role = (m && (m.role || m.type)) || 'message';
  const roleClass = role === 'function_call_output' ? 'tool' : role;
  const text = m.content !== undefined ? contentText(m.content) : m.output !== undefined ? contentText(m.output) : '';
  const callId = m.tool_call_id || m.call_id;
  return el(
    'div',
    { class: 'message ' + roleClass, 'data-role': role },
    el('div', { class: 'role', text: role }, callId ? el('span', { class: 'call-id', text: ' · ' + callId }) : null),
    text ? el('div', { class: 'text', text }) : null,
    (m.tool_calls || []).map(toolCall),
  );
}

/** The completion tokens, each shaded by how unlikely the policy found it: 1 − p. */
function tokens(step) {
  if (step.tokens !== 'engine') {
    return el('p', { class: 'muted', text: 'text only: the upstream returned no token ids' });
  }
  const logprobs = step.completion_logprobs || [];
  const ids = step.completion_token_ids || [];
  if (logprobs.length === 0) {
    return el('p', { class: 'muted', text: `${ids.length} completion token ids, no logprobs` });
  }
  const spans = logprobs.map((lp, i) => {
    const p = Math.exp(lp.logprob);
    const span = el('span', {
      class: /^<\|.*\|>$/.test(lp.token) ? 'tok special' : 'tok',
      'data-logprob': lp.logprob,
      'data-token-id': ids[i],
      title: `${JSON.stringify(lp.token)} · id ${ids[i]} · logprob ${lp.logprob.toFixed(4)} · p ${p.toFixed(3)}` +
        (lp.top_logprobs && lp.top_logprobs.length
          ? '\nalternatives: ' + lp.top_logprobs.map((t) => `${JSON.stringify(t.token)} ${t.logprob.toFixed(3)}`).join(', ')
          : ''),
      text: lp.token,
    });
    // CSSOM, not a style attribute: allowed under the page's Content-Security-Policy.
    span.style.backgroundColor = `rgba(226, 87, 36, ${(0.85 * (1 - p)).toFixed(3)})`;
    return span;
  });
  const mean = logprobs.reduce((sum, lp) => sum + lp.logprob, 0) / logprobs.length;
  return el(
    'div',
    {},
    el('div', { class: 'tokens', 'data-token-count': logprobs.length }, spans),
    el(
      'div',
      { class: 'legend' },
      `${logprobs.length} tokens · mean logprob ${mean.toFixed(3)} · `,
      el('span', { class: 'swatch high' }), ' likely ',
      el('span', { class: 'swatch low' }), ' unlikely',
    ),
  );
}

function evaluation(e) {
  const source = e.source.type === 'plugin'
    ? `plugin ${e.source.name} (${String(e.source.content_hash).slice(0, 12)})`
    : e.source.channel === 'feedback' ? 'feedback' : `feedback via ${e.source.channel}`;
  const labels = Object.entries(e.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ');
  if (e.kind === 'filter_error') {
    return el('div', { class: 'evaluation' },
      el('span', { class: 'reward negative', text: 'filter error' }),
      el('span', { text: e.reason }),
      el('span', { class: 'source', text: source }));
  }
  return el(
    'div',
    { class: 'evaluation', 'data-evaluation': e.id },
    e.reward !== undefined && e.reward !== null
      ? el('span', { class: 'reward ' + signClass(e.reward), 'data-reward': e.reward, text: 'reward ' + e.reward })
      : null,
    e.hint ? el('span', { class: 'hint', 'data-hint': '', text: e.hint }) : null,
    el('span', { class: 'source', text: source + (labels ? ' · ' + labels : '') + ' · ' + time(e.created_at) }),
  );
}

function turn(step, evaluations) {
  const facts = [
    step.endpoint,
    step.upstream && step.upstream.model,
    step.finish_reason && 'finish ' + step.finish_reason,
    step.policy && `policy ${step.policy.adapter} v${step.policy.version}`,
    step.usage && `${step.usage.prompt_tokens} + ${step.usage.completion_tokens} tokens`,
    step.timings && step.timings.finished_at && `${step.timings.finished_at - step.timings.started_at} ms`,
    step.trainable ? null : 'not trained',
  ].filter(Boolean);
  const request = step.request || { messages: [] };
  const out = step.output || {};
  const firstTurn = step.index === 0;
  const prompt = el(
    'details',
    { class: 'prompt', open: firstTurn ? '' : null },
    el('summary', {
      text: `request: ${request.messages.length} messages` +
        (request.tools && request.tools.length ? `, ${request.tools.length} tools` : ''),
    }),
    request.messages.map(message),
  );
  const evals = evaluations.get(step.id) || [];
  return el(
    'li',
    { class: 'turn', 'data-step-index': step.index, 'data-step': step.id },
    el('div', { class: 'turn-head' },
      el('h3', { text: 'Turn ' + step.index }),
      el('span', { class: 'facts', text: facts.join(' · ') })),
    prompt,
    el('h4', { text: 'assistant' }),
    el(
      'div',
      { class: 'message assistant output' },
      out.reasoning_content ? el('div', { class: 'text reasoning', text: out.reasoning_content }) : null,
      out.content ? el('div', { class: 'text', text: out.content }) : null,
      (out.tool_calls || []).map(toolCall),
    ),
    el('h4', { text: 'completion tokens' }),
    tokens(step),
    step.next_state
      ? el('div', { class: 'next-state' },
        el('h4', { text: 'next state' }),
        step.next_state.messages.map(message))
      : null,
    evals.length ? el('div', { class: 'evaluations' }, el('h4', { text: 'evaluations' }), evals.map(evaluation)) : null,
  );
}

function drawTrajectory(record) {
  const t = record.trajectory;
  const byStep = new Map();
  const whole = [];
  for (const e of record.evaluations) {
    if (e.step) {
      if (!byStep.has(e.step)) byStep.set(e.step, []);
      byStep.get(e.step).push(e);
    } else {
      whole.push(e);
    }
  }
  const facts = [
    ['id', t.id],
    ['status', t.status + (t.completion ? ` (${t.completion})` : '')],
    ['created', time(t.created_at)],
    ['completed', t.completed_at ? time(t.completed_at) : null],
    ['group', t.group ? `${t.group.id} (${t.group.size} rollouts)` : null],
    ...Object.entries(t.metadata || {}).map(([k, v]) => ['metadata.' + k, typeof v === 'string' ? v : JSON.stringify(v)]),
    ['traceparent', record.steps.length && record.steps[0].traceparent],
  ].filter(([, v]) => v);
  $('trajectory').replaceChildren(
    el(
      'div',
      { class: 'trajectory-head', 'data-trajectory': t.id },
      el('h2', { text: `Trajectory ${shortId(t.id)} · ${record.steps.length} turns` }),
      el('dl', {}, facts.map(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })])),
      whole.length ? el('div', { class: 'evaluations' }, el('h4', { text: 'trajectory evaluations' }), whole.map(evaluation)) : null,
    ),
    el('ol', { class: 'turns' }, record.steps.map((s) => turn(s, byStep))),
  );
}

// ---- polling ------------------------------------------------------------------------------

function setStatus(text, isError) {
  const status = $('status');
  status.textContent = text;
  status.classList.toggle('error', Boolean(isError));
}

/** Redraws `view` from `data` only when the data changed since the last draw. */
function redraw(view, data, draw) {
  const text = JSON.stringify(data);
  if (state.drawn[view] === text) return;
  state.drawn[view] = text;
  draw(data);
}

async function refresh() {
  if (!token()) return;
  if (state.busy) {
    state.again = true;
    return;
  }
  state.busy = true;
  try {
    const { tenants } = await api('/tenants');
    if (!state.tenant || !tenants.some((t) => t.tenant === state.tenant)) {
      state.tenant = tenants.length ? tenants[0].tenant : null;
    }
    redraw('tenants', { tenants, selected: state.tenant }, (d) => drawTenants(d.tenants));
    if (state.tenant) {
      const q = encodeURIComponent(state.tenant);
      // A search reads up to 2,000 records on the server: it runs once per query (and on Enter),
      // not on every poll.
      const searched = state.query && state.lastSearch && state.lastSearch.key === state.tenant + '\n' + state.query;
      const [list, rewards, gate] = await Promise.all([
        searched
          ? state.lastSearch.list
          : api(`/trajectories?tenant=${q}&limit=100` + (state.query ? `&q=${encodeURIComponent(state.query)}` : '')),
        api(`/tenants/${q}/rewards?limit=50`),
        api(`/tenants/${q}/gate?limit=20`),
      ]);
      state.lastSearch = state.query ? { key: state.tenant + '\n' + state.query, list } : null;
      redraw('list', { list, selected: state.trajectory }, (d) => drawList(d.list));
      redraw('rewards', rewards, drawRewards);
      redraw('gate', gate, drawGate);
      if (state.trajectory) {
        const record = await api(`/trajectories/${encodeURIComponent(state.trajectory)}?tenant=${q}`);
        redraw('trajectory', record, drawTrajectory);
      }
    }
    setStatus('updated ' + new Date().toLocaleTimeString(undefined, { hour12: false }));
  } catch (error) {
    if (error instanceof AuthError) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(error.message);
    } else {
      setStatus(error.message, true);
    }
  } finally {
    state.busy = false;
    if (state.again) {
      state.again = false;
      refresh();
    }
  }
}

function showLogin(problem) {
  $('main').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  $('login-error').hidden = !problem;
  $('login-error').textContent = problem || '';
  setStatus('signed out');
}

function showMain() {
  $('login').hidden = true;
  $('main').hidden = false;
  $('logout').hidden = false;
}

function start() {
  adoptFragmentToken();
  readLocation();
  $('login').addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value);
    $('token').value = '';
    showMain();
    refresh();
  });
  // A search is part of the address (`#...&q=words`), so it survives a reload and can be shared.
  let typing = null;
  const search = () => {
    const params = hashParams();
    const query = $('query').value.trim();
    if (query) params.set('q', query);
    else params.delete('q');
    window.location.hash = params.toString();
  };
  $('search').addEventListener('submit', (event) => {
    event.preventDefault();
    clearTimeout(typing);
    state.lastSearch = null; // Enter runs the search again
    search();
    refresh();
  });
  $('query').addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(search, 400);
  });
  $('logout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin();
  });
  window.addEventListener('hashchange', () => {
    readLocation();
    state.drawn = { tenants: '', list: '', rewards: '', gate: '', trajectory: '' };
    if (!state.trajectory) {
      $('trajectory').replaceChildren(el('p', { class: 'muted', text: 'Pick a trajectory on the left.' }));
    }
    refresh();
  });
  if (token()) {
    showMain();
    refresh();
  } else {
    showLogin();
  }
  setInterval(refresh, POLL_MS);
}

start();
