// agent.mjs — a coding agent's six turns through the real SDK (openai or
// @anthropic-ai/sdk) against keel serve, as Claude Code and OpenAI-SDK
// agents send them: a long system prompt and tools that never change, the
// conversation growing turn by turn, and on odd turns a <system-reminder>
// rewritten inside the FIRST user message, so the prompt changes right
// after the system prompt and tools. On a sliding-window or hybrid model
// keel used to reuse nothing on those turns. Each turn must reuse at least
// the system prompt and tools (turns that only append: the previous
// prompt), and its answer must equal a fresh server's (the reference
// server's slot is erased before each request; both run --deterministic,
// greedy).
//
// usage: node agent.mjs openai|anthropic PORT REF_PORT API_KEY LABEL [options]
//   --turns N          turns (6)
//   --reminders LIST   turns whose reminder is rewritten: "odd" or a comma list (odd)
//   --sys-repeat N     repetitions of the system prompt's sentence (14: ~2k tokens)
//   --grow N           lines of file text each later user message carries (0), as
//                      tool results make an agent's prompt grow (a line ~ 12 tokens)
//   --ttft             stream each agent turn and report its time to first token
// REF_PORT "-": no reference server (the trace as a benchmark: TTFT per turn).
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const [api, port, refPort, apiKey, label, ...rest] = process.argv.slice(2);
const opt = { turns: 6, reminders: 'odd', sysRepeat: 14, grow: 0, ttft: false };
for (let i = 0; i < rest.length; i++) {
  const k = rest[i];
  if (k === '--ttft') opt.ttft = true;
  else if (k === '--turns') opt.turns = Number(rest[++i]);
  else if (k === '--reminders') opt.reminders = rest[++i];
  else if (k === '--sys-repeat') opt.sysRepeat = Number(rest[++i]);
  else if (k === '--grow') opt.grow = Number(rest[++i]);
  else throw new Error('unknown option ' + k);
}
const rewrittenAt = (t) => opt.reminders === 'odd' ? t % 2 === 1 : opt.reminders.split(',').map(Number).includes(t);
let checks = 0;
function check(cond, what) {
  if (!cond) throw new Error(`${label} ${api}: check failed: ${what}`);
  checks++;
}

const SYSTEM = ('You are a careful coding agent working in a C repository. Read before you write, run the tests ' +
  'after each change, keep every commit small and explain what you changed. ').repeat(opt.sysRepeat);
const TOOLS = [
  { name: 'read_file', description: 'Read a file of the repository', schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } },
  { name: 'edit_file', description: 'Replace text in a file', schema: { type: 'object', properties: { path: { type: 'string' }, old: { type: 'string' }, new: { type: 'string' } }, required: ['path', 'old', 'new'] } },
  { name: 'run_tests', description: 'Run the test suite and report the failures', schema: { type: 'object', properties: { filter: { type: 'string' } } } },
];
const openaiTools = TOOLS.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.schema } }));
const anthropicTools = TOOLS.map((t) => ({ name: t.name, description: t.description, input_schema: t.schema }));

// the first user message of turn t: its reminder's version counts the
// rewrites up to t
function firstUser(t) {
  let v = 0;
  for (let k = 1; k <= t; k++) v += rewrittenAt(k) ? 1 : 0;
  return `<system-reminder>todo list: ${3 + v} items open, item ${1 + v} in progress</system-reminder>\n` +
    'Fix the failing test in the memory module.';
}

async function erase(p) {
  const r = await fetch(`http://127.0.0.1:${p}/slots/0?action=erase`, { method: 'POST', headers: { Authorization: `Bearer ${apiKey}` } });
  check(r.status === 200, `erase the reference slot: ${r.status}`);
}

// The first chunk with generated text or a call: the time to first token.
async function openaiTtft(client, msgs) {
  const t0 = performance.now();
  const s = await client.chat.completions.create({ model: 'keel', messages: msgs, tools: openaiTools, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let ttft = -1, usage = null;
  for await (const c of s) {
    const d = c.choices[0] && c.choices[0].delta;
    if (ttft < 0 && d && (d.content || d.tool_calls || d.reasoning_content)) ttft = performance.now() - t0;
    if (c.usage) usage = c.usage;
  }
  return { ttft, usage };
}

async function openaiTurn(client, msgs) {
  const r = await client.chat.completions.create({ model: 'keel', messages: msgs, tools: openaiTools, max_tokens: 6, temperature: 0 });
  const m = r.choices[0].message;
  return {
    prompt: r.usage.prompt_tokens, cached: r.usage.prompt_tokens_details.cached_tokens,
    text: m.content ?? '', answer: JSON.stringify({ content: m.content, tool_calls: m.tool_calls ?? null }),
    cache: r.memory ? r.memory.cache : '?',
  };
}

async function anthropicTurn(client, msgs) {
  const r = await client.messages.create({
    model: 'claude-test', max_tokens: 6, temperature: 0, tools: anthropicTools,
    system: [{ type: 'text', text: SYSTEM, cache_control: { type: 'ephemeral' } }], messages: msgs,
  });
  const text = r.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  return {
    prompt: r.usage.input_tokens + r.usage.cache_read_input_tokens, cached: r.usage.cache_read_input_tokens,
    text, answer: JSON.stringify(r.content), cache: r.memory ? r.memory.cache : '?',
  };
}

async function main() {
  const mk = (p) => api === 'openai'
    ? new OpenAI({ baseURL: `http://127.0.0.1:${p}/v1`, apiKey, maxRetries: 0 })
    : new Anthropic({ baseURL: `http://127.0.0.1:${p}`, apiKey, maxRetries: 0 });
  const agent = mk(port), ref = mk(refPort);
  // the system prompt and tools in tokens: what every turn must reuse
  const counter = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey, maxRetries: 0 });
  const x = [{ role: 'user', content: 'x' }];
  const withSys = await counter.messages.countTokens({ model: 'c', system: SYSTEM, tools: anthropicTools, messages: x });
  const bare = await counter.messages.countTokens({ model: 'c', messages: x });
  const sysTokens = withSys.input_tokens - bare.input_tokens;
  check(sysTokens > 300, `system + tools are ${sysTokens} tokens`);

  const turn = api === 'openai' ? openaiTurn : anthropicTurn;
  const answers = [];
  let prevPrompt = 0;
  const fileText = (k) => Array.from({ length: opt.grow }, (_, i) => `    line ${i} of file ${k}: value = compute(${i}, ${k}) + offset;`).join('\n');
  const table = [];
  for (let t = 0; t < opt.turns; t++) {
    const msgs = [];
    if (api === 'openai') msgs.push({ role: 'system', content: SYSTEM });
    msgs.push({ role: 'user', content: api === 'openai' ? firstUser(t) : [{ type: 'text', text: firstUser(t) }] });
    for (let k = 0; k < t; k++) {
      msgs.push({ role: 'assistant', content: answers[k] || '.' });
      const u = `Turn ${k + 1}: run the tests again and tell me what failed.` + (opt.grow ? `\n${fileText(k)}` : '');
      // Claude Code marks the newest user message as a cache breakpoint
      msgs.push({ role: 'user', content: api === 'openai' ? u : [{ type: 'text', text: u, ...(k === t - 1 ? { cache_control: { type: 'ephemeral' } } : {}) }] });
    }
    let ttft = -1;
    if (opt.ttft && api === 'openai') { /* streamed first: its TTFT; the answer then comes from the cache */
      const x = await openaiTtft(agent, msgs);
      ttft = x.ttft;
      table.push({ turn: t, rewritten: rewrittenAt(t), prompt: x.usage.prompt_tokens, cached: x.usage.prompt_tokens_details.cached_tokens, ttft });
    }
    const a = await turn(agent, msgs);
    const rewritten = rewrittenAt(t);
    console.log(`${label} ${api} turn ${t}${rewritten ? ' (reminder rewritten)' : ''}: ${a.prompt} prompt tokens, ` +
      `${a.cached} cached (system + tools ${sysTokens}): ${a.cache}` + (ttft >= 0 ? `; streamed first: TTFT ${ttft.toFixed(0)} ms` : ''));
    if (refPort !== '-') {
      await erase(refPort);
      const f = await turn(ref, msgs);
      check(f.cached === 0, `turn ${t}: the reference computed everything`);
      check(a.prompt === f.prompt, `turn ${t}: the same prompt`);
      check(a.answer === f.answer, `turn ${t}: answer ${a.answer} equals a fresh server's ${f.answer}`);
    }
    if (t > 0) {
      check(a.cached >= sysTokens - 8, `turn ${t} reused ${a.cached} tokens, fewer than system + tools (${sysTokens})`);
      if (!rewritten) check(a.cached >= prevPrompt - 8, `turn ${t} appended but reused ${a.cached} of the previous ${prevPrompt}`);
    }
    answers.push(a.text);
    prevPrompt = a.prompt;
  }
  if (table.length) {
    console.log('| turn | reminder rewritten | prompt tokens | cached (streamed) | TTFT ms |');
    console.log('|---|---|---|---|---|');
    for (const r of table) console.log(`| ${r.turn} | ${r.rewritten ? 'yes' : ''} | ${r.prompt} | ${r.cached} | ${r.ttft.toFixed(0)} |`);
  }
  console.log(`server-agent: ${label} ${api}: ${checks} checks passed`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
