// clients.mjs — the real SDKs (openai, @anthropic-ai/sdk; versions pinned in
// package-lock.json) against keel serve: a tool-using conversation streamed
// and not through both APIs, every event parsed by the SDKs' own stream
// machinery, count_tokens, completions, a prefill (a trailing assistant
// message continued) through both, and the error classes the SDKs
// derive from keel's error objects (400, 401, 413, a prompt too long, a
// prefill ending in whitespace). The model is a random-weight
// one, so its answers are text; the tool-call streams keel produces are
// checked too: canned SSE written by keel's own encoder (test_server_api
// --write-sse DIR) is served to the SDKs from a local HTTP server, and
// their accumulated messages must hold the tool call.
//
// usage: node clients.mjs PORT API_KEY SSE_DIR PORT2 (PORT2: a server whose
// template has a tool-call format, for the constrained-output checks)
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const [port, apiKey, sseDir, port2] = process.argv.slice(2);
let checks = 0;
function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
  checks++;
}

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
];
const chatMessages = [
  { role: 'system', content: 'You are a weather bot.' },
  { role: 'user', content: 'What is the weather in Paris?' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
  },
  { role: 'tool', tool_call_id: 'call_1', content: 'Sunny, 21 C' },
  { role: 'user', content: 'And what should I wear?' },
];
const finishes = ['stop', 'length', 'tool_calls'];

async function openaiReal() {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0 });
  const r = await client.chat.completions.create({ model: 'keel', messages: chatMessages, tools, max_tokens: 8, temperature: 0 });
  check(r.object === 'chat.completion' && r.choices.length === 1, 'chat.completion shape');
  check(typeof r.choices[0].message.content === 'string', 'message content');
  check(finishes.includes(r.choices[0].finish_reason), 'finish_reason ' + r.choices[0].finish_reason);
  check(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0, 'usage');
  check(typeof r.usage.prompt_tokens_details.cached_tokens === 'number', 'cached_tokens');

  // raw chunks
  const s = await client.chat.completions.create({
    model: 'keel', messages: chatMessages, tools, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', n = 0, usage = null, finish = null;
  for await (const c of s) {
    n++;
    check(c.object === 'chat.completion.chunk', 'chunk object');
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  check(n >= 3 && usage && usage.completion_tokens > 0, 'streamed chunks and usage');
  check(finishes.includes(finish), 'streamed finish_reason');
  check(usage.prompt_tokens_details.cached_tokens > 0, 'the streamed turn reused the cache');
  check(text === r.choices[0].message.content, 'stream text equals the non-streamed answer');

  // the stream helper accumulates and validates every event
  const st = client.chat.completions.stream({ model: 'keel', messages: chatMessages, tools, max_tokens: 8, temperature: 0 });
  let deltas = '';
  st.on('content', (d) => { deltas += d; });
  const fin = await st.finalChatCompletion();
  check(fin.choices[0].message.content === deltas, 'ChatCompletionStream accumulation');

  // logprobs, answered and streamed (the SDK's accumulator concatenates them)
  const lr = await client.chat.completions.create({ model: 'keel', messages: chatMessages, max_tokens: 4, temperature: 0,
    logprobs: true, top_logprobs: 2 });
  const lc = lr.choices[0].logprobs && lr.choices[0].logprobs.content;
  check(Array.isArray(lc) && lc.length >= 1 && lc.length <= lr.usage.completion_tokens, 'logprobs.content');
  check(lc.every((t) => typeof t.token === 'string' && t.logprob <= 0 && Array.isArray(t.bytes) &&
    t.top_logprobs.length === 2 && t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob), 'logprob entries');
  const ls = client.chat.completions.stream({ model: 'keel', messages: chatMessages, max_tokens: 4, temperature: 0,
    logprobs: true, top_logprobs: 2 });
  const lf = await ls.finalChatCompletion();
  check(JSON.stringify(lf.choices[0].logprobs.content) === JSON.stringify(lc), 'streamed logprobs equal the answer\'s');
  // per token, not all in the last chunk
  const raw = await client.chat.completions.create({ model: 'keel', messages: chatMessages, max_tokens: 4, temperature: 0,
    logprobs: true, top_logprobs: 2, stream: true });
  const per = [];
  for await (const c of raw) {
    const e = c.choices.length && c.choices[0].logprobs && c.choices[0].logprobs.content;
    if (e && e.length) per.push(e);
  }
  check(JSON.stringify(per.flat()) === JSON.stringify(lc), 'chunks\' logprobs concatenated equal the answer\'s');
  check(lc.length < 2 || per.length >= 2, 'logprobs streamed per token (' + per.map((e) => e.length).join(',') + ')');

  const comp = await client.completions.create({ model: 'keel', prompt: 'Once upon a time', max_tokens: 5, stream: true });
  let cn = 0;
  for await (const c of comp) { if (c.choices.length) cn++; }
  check(cn >= 1, 'completions stream');

  try {
    await client.chat.completions.create({ model: 'keel', messages: [] });
    check(false, 'an empty message list is refused');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, 'BadRequestError: ' + e);
    check(/must not be empty/.test(e.message), 'error message: ' + e.message);
  }
  const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
  try {
    await bad.chat.completions.create({ model: 'keel', messages: chatMessages, max_tokens: 2 });
    check(false, 'a wrong key is refused');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'AuthenticationError: ' + e);
  }
  const long = Array.from({ length: 2500 }, (_, i) => `dog ${i}`).join(' ');
  try {
    await client.chat.completions.create({ model: 'keel', messages: [{ role: 'user', content: long }], max_tokens: 2 });
    check(false, 'a prompt past the context is refused');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' && e.param === 'messages',
          'context_length_exceeded: ' + e);
  }
  const models = await client.models.list();
  check(models.data.length === 1, 'models.list');
  const one = await client.models.retrieve(models.data[0].id);
  check(one.id === models.data[0].id, 'models.retrieve');
}

const anthropicTools = [
  { name: 'get_weather', description: 'Weather of a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } },
];
const anthropicMessages = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'Sunny, 21 C' }] }, { type: 'text', text: 'What should I wear?' }] },
];
const system = [{ type: 'text', text: 'You are a weather bot.', cache_control: { type: 'ephemeral' } }];
const stops = ['end_turn', 'max_tokens', 'tool_use', 'stop_sequence'];

async function anthropicReal() {
  const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey, maxRetries: 0 });
  const base = { model: 'claude-test', max_tokens: 8, temperature: 0, system, tools: anthropicTools, messages: anthropicMessages,
    metadata: { user_id: 'u1' }, stop_sequences: ['###'], tool_choice: { type: 'auto' } };
  const m = await client.messages.create(base);
  check(m.type === 'message' && m.role === 'assistant', 'message shape');
  check(stops.includes(m.stop_reason), 'stop_reason ' + m.stop_reason);
  check(m.usage.output_tokens > 0, 'usage.output_tokens');

  const stream = client.messages.stream(base);
  let text = '', events = 0;
  stream.on('text', (t) => { text += t; });
  for await (const ev of stream) {
    events++;
    check(typeof ev.type === 'string', 'event type');
  }
  const fin = await stream.finalMessage();
  check(events >= 4, 'events');
  check(stops.includes(fin.stop_reason), 'final stop_reason');
  const finText = fin.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(finText === text, 'MessageStream accumulation');
  check(fin.usage.output_tokens > 0 && fin.usage.cache_read_input_tokens > 0, 'final usage with cache reads');

  const raw = await client.messages.create({ ...base, stream: true, thinking: { type: 'enabled', budget_tokens: 1024 } });
  const names = [];
  for await (const ev of raw) names.push(ev.type);
  check(names[0] === 'message_start' && names[names.length - 1] === 'message_stop', 'raw event order: ' + names.join(','));

  if (client.messages.countTokens) {
    const ct = await client.messages.countTokens({ model: 'claude-test', system, tools: anthropicTools, messages: anthropicMessages });
    check(ct.input_tokens > 0, 'count_tokens');
  }
  try {
    await client.messages.create({ model: 'claude-test', max_tokens: 8, messages: [{ role: 'system', content: 'x' }] });
    check(false, 'an unknown role is refused');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && e.status === 400, 'BadRequestError: ' + e);
    check(e.error && e.error.type === 'error' && e.error.error.type === 'invalid_request_error', 'Anthropic error object');
  }
  // issue 25: a body over --max-body is a readable 413 (not a connection
  // error the SDK would retry); a prompt past the context is the error
  // clients match to compact ("prompt is too long")
  try {
    await client.messages.create({ model: 'claude-test', max_tokens: 8, messages: [{ role: 'user', content: 'x'.repeat(9 << 20) }] });
    check(false, 'a 9 MiB body is refused');
  } catch (e) {
    check(e instanceof Anthropic.APIError && e.status === 413, '413 read by the SDK: ' + e);
  }
  const long = Array.from({ length: 2500 }, (_, i) => `dog ${i}`).join(' ');
  try {
    await client.messages.create({ model: 'claude-test', max_tokens: 8, messages: [{ role: 'user', content: long }] });
    check(false, 'a prompt past the context is refused');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && /prompt is too long: \d+ tokens > \d+ maximum/.test(e.message),
          'prompt is too long: ' + e);
  }
  const bad = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'wrong', maxRetries: 0 });
  try {
    await bad.messages.create(base);
    check(false, 'a wrong key is refused');
  } catch (e) {
    check(e instanceof Anthropic.AuthenticationError && e.status === 401, 'AuthenticationError: ' + e);
  }
}

// A prefill: the last message is the assistant's, and the model continues
// it (OpenAI: keel's default, continue_final_message; Anthropic's documented
// prefill). The prompt is the conversation opened for the assistant plus
// the prefill's text (ChatML: the generated model carries no template), so
// its token count equals that raw text's on /v1/completions; answers and
// streams carry the new text only.
const pfUser = 'The little dog ran to the park and';
const pfText = 'Once upon a time';
const pfOpen = `<|im_start|>user\n${pfUser}<|im_end|>\n<|im_start|>assistant\n`;

async function prefill() {
  const oa = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0 });
  const rawTokens = async (prompt) =>
    (await oa.completions.create({ model: 'keel', prompt, max_tokens: 1, temperature: 0 })).usage.prompt_tokens;
  const nCont = await rawTokens(pfOpen + pfText);
  const nClosed = await rawTokens(pfOpen + pfText + '<|im_end|>\n<|im_start|>assistant\n');
  check(nClosed > nCont, 'closing the message adds tokens');
  const messages = [{ role: 'user', content: pfUser }, { role: 'assistant', content: pfText }];
  const r = await oa.chat.completions.create({ model: 'keel', messages, max_tokens: 6, temperature: 0 });
  const c = r.choices[0].message.content;
  check(r.usage.prompt_tokens === nCont, `OpenAI prefill continued: ${r.usage.prompt_tokens} prompt tokens, want ${nCont}`);
  check(typeof c === 'string' && !c.startsWith(pfText), 'OpenAI answer without the prefill: ' + JSON.stringify(c));
  const st = oa.chat.completions.stream({ model: 'keel', messages, max_tokens: 6, temperature: 0 });
  let deltas = '';
  st.on('content', (d) => { deltas += d; });
  const fin = await st.finalChatCompletion();
  check(deltas === c && fin.choices[0].message.content === c, 'OpenAI prefill stream: ' + JSON.stringify(deltas));
  const closed = await oa.chat.completions.create({ model: 'keel', messages, max_tokens: 2, continue_final_message: false });
  check(closed.usage.prompt_tokens === nClosed, 'continue_final_message false closes the message');

  const an = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey, maxRetries: 0 });
  const m = await an.messages.create({ model: 'claude-test', max_tokens: 6, temperature: 0, messages });
  check(m.usage.input_tokens + m.usage.cache_read_input_tokens === nCont, 'Anthropic prefill continued');
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(m.content.length >= 1 && !text.startsWith(pfText), 'Anthropic answer without the prefill: ' + JSON.stringify(text));
  const ms = an.messages.stream({ model: 'claude-test', max_tokens: 6, temperature: 0, messages });
  let streamed = '';
  ms.on('text', (t) => { streamed += t; });
  const mf = await ms.finalMessage();
  check(streamed === text && mf.content.filter((b) => b.type === 'text').map((b) => b.text).join('') === text,
        'Anthropic prefill stream: ' + JSON.stringify(streamed));
  if (an.messages.countTokens) {
    const ct = await an.messages.countTokens({ model: 'claude-test', messages });
    check(ct.input_tokens === nCont, 'count_tokens of a prefill');
  }
  try {
    await an.messages.create({ model: 'claude-test', max_tokens: 6,
      messages: [{ role: 'user', content: pfUser }, { role: 'assistant', content: pfText + ' ' }] });
    check(false, 'a prefill ending in whitespace is refused');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error.error.type === 'invalid_request_error' &&
          e.error.error.message === 'messages: final assistant content cannot end with trailing whitespace',
          'trailing whitespace: ' + e);
  }
}

// keel's own tool-call streams, served verbatim to the SDKs
async function cannedToolStreams() {
  const files = { '/v1/chat/completions': 'openai_tools.sse', '/v1/messages': 'anthropic_tools.sse' };
  const srv = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const f = files[req.url];
      if (!f) { res.writeHead(404); res.end(); return; }
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      res.end(fs.readFileSync(path.join(sseDir, f)));
    });
  });
  await new Promise((ok) => srv.listen(0, '127.0.0.1', ok));
  const p = srv.address().port;
  try {
    const oa = new OpenAI({ baseURL: `http://127.0.0.1:${p}/v1`, apiKey: 'x', maxRetries: 0 });
    const st = oa.chat.completions.stream({ model: 'keel', messages: chatMessages, tools });
    let argDone = null;
    st.on('tool_calls.function.arguments.done', (e) => { argDone = e; });
    const fin = await st.finalChatCompletion();
    const msg = fin.choices[0].message;
    check(fin.choices[0].finish_reason === 'tool_calls', 'canned: finish_reason tool_calls');
    check(msg.content === 'Hello', 'canned: content');
    check(msg.tool_calls.length === 1 && msg.tool_calls[0].id === 'call_abc', 'canned: tool call id');
    check(msg.tool_calls[0].function.name === 'get' && msg.tool_calls[0].function.arguments === '{"a":1}', 'canned: tool call');
    check(argDone && argDone.name === 'get', 'canned: arguments.done event');
    check(fin.usage && fin.usage.prompt_tokens_details.cached_tokens === 12, 'canned: usage');

    const an = new Anthropic({ baseURL: `http://127.0.0.1:${p}`, apiKey: 'x', maxRetries: 0 });
    const ms = an.messages.stream({ model: 'claude-test', max_tokens: 8, messages: anthropicMessages, tools: anthropicTools });
    let json = null, thinking = '';
    ms.on('inputJson', (_d, snap) => { json = snap; });
    ms.on('thinking', (d) => { thinking += d; });
    const m = await ms.finalMessage();
    check(m.stop_reason === 'tool_use', 'canned: stop_reason tool_use');
    check(m.content.map((b) => b.type).join(',') === 'thinking,text,tool_use', 'canned: blocks ' + m.content.map((b) => b.type));
    check(thinking === 'think' && m.content[0].thinking === 'think', 'canned: thinking');
    check(m.content[2].id === 'toolu_abc' && m.content[2].name === 'get' && m.content[2].input.a === 1, 'canned: tool_use input');
    check(json && json.a === 1, 'canned: inputJson snapshots');
    check(m.usage.output_tokens === 9 && m.usage.input_tokens === 18 && m.usage.cache_read_input_tokens === 12, 'canned: usage');
  } finally {
    srv.close();
  }
}

// Constrained output through the SDKs: response_format json_schema, a
// strict tool forced by tool_choice (OpenAI) and a tool forced by
// tool_choice (Anthropic): a random-weight model at temperature 1 must
// still return text that parses and keeps every constraint; a schema the
// compiler refuses is a BadRequestError naming the keyword.
const forecast = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 6 },
    days: { type: 'integer', minimum: 1, maximum: 7 },
    units: { enum: ['c', 'f'] },
    hourly: { type: 'boolean' },
  },
  required: ['city', 'days', 'units'],
  additionalProperties: false,
};
function forecastOk(o) {
  const keys = Object.keys(o);
  return typeof o.city === 'string' && [...o.city].length >= 1 && [...o.city].length <= 6 &&
    Number.isInteger(o.days) && o.days >= 1 && o.days <= 7 && ['c', 'f'].includes(o.units) &&
    (o.hourly === undefined || typeof o.hourly === 'boolean') &&
    keys.every((k) => ['city', 'days', 'units', 'hourly'].includes(k));
}

async function constrained() {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port2}/v1`, apiKey, maxRetries: 0 });
  const ask = [{ role: 'user', content: 'The forecast for Paris, as JSON.' }];
  for (let i = 0; i < 3; i++) {
    const r = await client.chat.completions.create({ model: 'keel', messages: ask, max_tokens: 400, temperature: 1,
      seed: 5 + i, response_format: { type: 'json_schema', json_schema: { name: 'forecast', schema: forecast, strict: true } } });
    check(r.choices[0].finish_reason === 'stop', 'response_format json_schema: finished (' + r.choices[0].finish_reason + ')');
    const text = r.choices[0].message.content;
    let o = null;
    try { o = JSON.parse(text); } catch (e) { check(false, 'response_format json_schema: JSON: ' + text); }
    check(forecastOk(o), 'response_format json_schema: the schema holds: ' + text);
  }
  const jo = await client.chat.completions.create({ model: 'keel', messages: ask, max_tokens: 400, temperature: 1,
    response_format: { type: 'json_object' } });
  if (jo.choices[0].finish_reason === 'stop') {
    const o = JSON.parse(jo.choices[0].message.content);
    check(o !== null && typeof o === 'object' && !Array.isArray(o), 'json_object: an object');
  }
  try {
    await client.chat.completions.create({ model: 'keel', messages: ask, max_tokens: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'u', schema: { type: 'array', uniqueItems: true } } } });
    check(false, 'a schema the compiler refuses is a 400');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /uniqueItems/.test(e.message), 'refused schema: ' + e);
  }
  const strictTools = [{ type: 'function', function: { name: 'get_forecast', description: 'Forecast of a city',
    strict: true, parameters: forecast } }];
  for (let i = 0; i < 3; i++) {
    // one call (with parallel calls allowed a random model may go on
    // writing calls until max_tokens), a seed per try so a run repeats
    const t = await client.chat.completions.create({ model: 'keel', messages: ask, tools: strictTools, max_tokens: 600,
      temperature: 1, seed: 11 + i, parallel_tool_calls: false,
      tool_choice: { type: 'function', function: { name: 'get_forecast' } } });
    const calls = t.choices[0].message.tool_calls;
    check(t.choices[0].finish_reason === 'tool_calls' && calls && calls.length >= 1,
      'forced strict tool: a tool call (' + t.choices[0].finish_reason + ')');
    check(calls[0].function.name === 'get_forecast', 'forced strict tool: its name');
    check(forecastOk(JSON.parse(calls[0].function.arguments)), 'forced strict tool: arguments ' + calls[0].function.arguments);
  }
  const an = new Anthropic({ baseURL: `http://127.0.0.1:${port2}`, apiKey, maxRetries: 0 });
  for (let i = 0; i < 3; i++) {
    const m = await an.messages.create({ model: 'keel', max_tokens: 600, temperature: 1, messages: ask,
      tools: [{ name: 'get_forecast', description: 'Forecast of a city', input_schema: forecast }],
      tool_choice: { type: 'tool', name: 'get_forecast', disable_parallel_tool_use: true } });
    const use = m.content.find((b) => b.type === 'tool_use');
    check(m.stop_reason === 'tool_use' && use && use.name === 'get_forecast', 'anthropic forced tool: a tool_use (' + m.stop_reason + ')');
    check(forecastOk(use.input), 'anthropic forced tool: input ' + JSON.stringify(use.input));
  }
}

try {
  await openaiReal();
  await anthropicReal();
  await prefill();
  await cannedToolStreams();
  await constrained();
  const ver = (p) => JSON.parse(fs.readFileSync(path.join('node_modules', p, 'package.json'))).version;
  console.log(`server-clients: ${checks} checks passed (openai ${ver('openai')}, @anthropic-ai/sdk ${ver('@anthropic-ai/sdk')})`);
} catch (e) {
  console.error('server-clients: FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
}
