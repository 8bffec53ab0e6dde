// The chat page of keel serve in a real browser (Debian's Chromium, headless,
// driven by playwright-core): two turns streamed, the memory panel, Stop,
// the API key, and model output that holds markup rendered as text.
// node page.mjs PORT API_KEY SCREENSHOT_DIR
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';

const [port, key, shots] = process.argv.slice(2);
const base = `http://127.0.0.1:${port}`;
const exe = process.env.KEEL_CHROMIUM || '/usr/bin/chromium';
const browser = await chromium.launch({ executablePath: exe, args: ['--no-sandbox', '--disable-gpu'] });
const problems = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console: ' + m.text()); });
  // anything the page fetches must be this server's
  page.on('request', (r) => { if (!r.url().startsWith(base)) problems.push('fetched ' + r.url()); });
  let grammar = null;
  await page.route('**/v1/chat/completions', async (route) => {
    const body = JSON.parse(route.request().postData());
    assert.equal(body.stream, true);
    if (grammar) body.grammar = grammar;
    await route.continue({ postData: JSON.stringify(body) });
  });

  const resp = await page.goto(base + '/');
  assert.equal(resp.status(), 200);
  assert.match(resp.headers()['content-security-policy'] || '', /script-src 'self'/);
  await page.fill('#apikey', key);
  await page.dispatchEvent('#apikey', 'change');
  await page.fill('#maxtok', '24');
  await page.dispatchEvent('#maxtok', 'change');
  await page.fill('#temp', '0');
  await page.dispatchEvent('#temp', 'change');

  const answers = page.locator('.msg.assistant');
  const ask = async (text, n) => {
    await page.fill('#input', text);
    await page.press('#input', 'Enter');
    await page.waitForFunction((k) => document.querySelectorAll('.msg.assistant .stats').length >= k, n, { timeout: 120000 });
  };
  await ask('Tell me about the little dog in the park.', 1);
  await ask('And what did the dog see there?', 2);
  assert.equal(await answers.count(), 2, 'two answers');
  assert.equal(await page.locator('.msg.user').count(), 2, 'two user messages');
  for (let i = 0; i < 2; i++) {
    const t = await answers.nth(i).locator('.content').innerText();
    assert.ok(t.trim().length > 0, `answer ${i + 1} has text`);
  }
  const cached1 = Number(await answers.nth(0).locator('.stats').getAttribute('data-cached'));
  const cached2 = Number(await answers.nth(1).locator('.stats').getAttribute('data-cached'));
  const tps2 = Number(await answers.nth(1).locator('.stats').getAttribute('data-tps'));
  console.log(`page: answer 1 cached ${cached1}, answer 2 cached ${cached2}, ${tps2} tok/s`);
  assert.ok(cached2 > 0, 'the second turn reused the cache');
  assert.ok(tps2 > 0, 'tokens/s shown');
  // the memory panel shows the server's cache after the second answer
  await page.waitForFunction(() => Number(document.getElementById('memtab').dataset.cached) > 0, null, { timeout: 20000 });
  const mem = await page.locator('#memory').innerText();
  assert.match(mem, /KV cells used\s+\d+ \/ \d+/);
  assert.match(mem, /KV bytes/);
  assert.match(mem, /compactions\s+\d+/);
  assert.match(mem, /prompt-cache entries\s+[1-9]/);
  await page.screenshot({ path: `${shots}/page-chat.png`, fullPage: true });

  // the conversation is kept in the browser: a reload shows it again
  await page.reload();
  await page.waitForSelector('.msg.assistant');
  assert.equal(await page.locator('.msg.assistant').count(), 2, 'kept across a reload');
  assert.equal(await page.locator('#convs li').count(), 1);

  // model output with markup is text: nothing runs, no element is made
  await page.click('#new');
  await page.fill('#maxtok', '400');
  await page.dispatchEvent('#maxtok', 'change');
  grammar = 'root ::= "<script>window.pwned=1</script><img src=x onerror=window.pwned=2> **ok** [x](javascript:window.pwned=3) `<b>c</b>`"';
  await ask('Say something dangerous.', 1);
  grammar = null;
  const last = page.locator('.msg.assistant').last();
  const text = await last.locator('.content').innerText();
  assert.ok(text.includes('<script>window.pwned=1</script><img src=x onerror=window.pwned=2>'), 'markup shown as text: ' + text);
  assert.equal(await page.locator('#log script, #log img, #log b, #log a').count(), 0, 'no element from model output');
  assert.equal(await last.locator('strong').innerText(), 'ok', 'Markdown still renders');
  assert.equal(await page.evaluate(() => window.pwned), undefined, 'nothing ran');
  await page.screenshot({ path: `${shots}/page-markup.png`, fullPage: true });

  // Stop: a long answer is cut, the conversation stays usable. The model
  // is too fast to catch mid-answer, so the network is slowed down to a
  // trickle (2 KB/s) while the answer streams.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: 2000, uploadThroughput: -1 });
  await page.fill('#maxtok', '2000');
  await page.dispatchEvent('#maxtok', 'change');
  await page.fill('#input', 'Tell me a very long story.');
  await page.press('#input', 'Enter');
  await page.waitForFunction(() => {
    const a = document.querySelectorAll('.msg.assistant');
    const c = a[a.length - 1] && a[a.length - 1].querySelector('.content');
    return c && c.textContent.length > 20;
  }, null, { timeout: 60000 });
  await page.click('#stop');
  await page.waitForFunction(() => {
    const a = document.querySelectorAll('.msg.assistant');
    const s = a[a.length - 1].querySelector('.stats');
    return s && /stopped/.test(s.textContent);
  }, null, { timeout: 20000 });
  assert.equal(await page.locator('#send').isDisabled(), false, 'send enabled after stop');
  await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });

  // without the key, the API refuses and the page says so
  await page.fill('#apikey', 'wrong');
  await page.dispatchEvent('#apikey', 'change');
  await page.fill('#maxtok', '4');
  await ask_error(page);
  // return_progress over plain HTTP: prompt_progress chunks climb from the
  // cached prefix to the prompt's length, all before the first text
  const progress = async (extra) => {
    const r = await fetch(base + '/v1/chat/completions', { method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'The little dog ran to the park and saw a cat. '.repeat(20) }],
        stream: true, max_tokens: 4, temperature: 0, ...extra }) });
    assert.equal(r.status, 200);
    const seen = [];
    let textAt = -1;
    for (const line of (await r.text()).split('\n')) {
      if (!line.startsWith('data: {')) continue;
      const j = JSON.parse(line.slice(6));
      if (j.prompt_progress) seen.push(j.prompt_progress);
      const d = j.choices && j.choices[0] && j.choices[0].delta;
      if (d && d.content && textAt < 0) textAt = seen.length;
    }
    return { seen, textAt };
  };
  const p1 = await progress({ return_progress: true });
  assert.ok(p1.seen.length >= 2, 'progress chunks: ' + JSON.stringify(p1.seen));
  const first = p1.seen[0], lastp = p1.seen[p1.seen.length - 1];
  assert.equal(first.processed, first.cache);
  assert.equal(lastp.processed, lastp.total);
  assert.ok(lastp.total > 200 && lastp.time_ms >= 0);
  for (let i = 1; i < p1.seen.length; i++) assert.ok(p1.seen[i].processed > p1.seen[i - 1].processed);
  assert.ok(p1.textAt < 0 || p1.textAt === p1.seen.length, 'progress before text');
  const p2 = await progress({ return_progress: true });
  assert.ok(p2.seen[0].cache > 0 && p2.seen[0].processed === p2.seen[0].cache, 'second time from the cache');
  assert.equal((await progress({})).seen.length, 0, 'no progress unless asked');
  problems.splice(0, problems.length, ...problems.filter((p) => !/401/.test(p)));
  assert.deepEqual(problems, [], 'no page errors, no foreign fetches');
  console.log('page: ok');
} finally {
  await browser.close();
}

async function ask_error(page) {
  await page.fill('#input', 'hello');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.msg.error', { timeout: 20000 });
  assert.match(await page.locator('.msg.error').last().innerText(), /Invalid API Key/);
}
