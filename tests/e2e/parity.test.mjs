// E2B parity (issue 11, item 3) through the official SDKs: E2B's error shape on every
// control-plane path, inclusive startedAfter and unknown-template list filters, the sampled
// metrics window with real disk figures, keys that pass e2b@2.45.0's client-side format check,
// and what E2B's `base` template has (python, git, curl, passwordless sudo for `user`).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import * as v245 from 'e2b-245'
import { SDKS, withSandbox } from './helpers.mjs'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY

// Polls `probe` until it returns a truthy value: waits on the daemon's 5 s metrics sampler.
async function until(probe, what, ms = 60_000) {
  const end = Date.now() + ms
  for (;;) {
    const v = await probe()
    if (v) return v
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 250))
  }
}

test('every control-plane error, an unknown path included, has E2B\'s shape', async () => {
  for (const path of ['/no-such-route', '/sandboxes/nope', '/v2/sandboxes/x/y/z']) {
    const r = await fetch(API + path, { headers: { 'X-API-KEY': KEY } })
    assert.equal(r.status, 404, path)
    const body = await r.json()
    assert.equal(body.code, 404, path)
    assert.equal(typeof body.message, 'string', path)
    assert.ok(body.message.length > 0, path)
  }
  // Wrong key, wrong method, bad query: the same shape.
  let r = await fetch(API + '/v2/sandboxes', { headers: { 'X-API-KEY': 'e2b_00' } })
  assert.deepEqual(await r.json(), { code: 401, message: 'Invalid API key' })
  r = await fetch(API + '/v2/sandboxes', { method: 'PATCH', headers: { 'X-API-KEY': KEY } })
  assert.equal(r.status, 405)
  assert.equal((await r.json()).code, 405)
  r = await fetch(API + '/v2/sandboxes?limit=0', { headers: { 'X-API-KEY': KEY } })
  assert.equal((await r.json()).code, 400)
  // The native API keeps its own.
  r = await fetch(API + '/v1/no-such-route', { headers: { 'X-API-KEY': KEY } })
  assert.equal((await r.json()).error.code, 'not_found')
})

for (const [name, sdk] of SDKS) {
  const { Sandbox } = sdk

  test(`${name}: SDK errors carry the server's message`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      const now = new Date()
      const err = await sbx.getMetrics({ start: now, end: new Date(now.getTime() - 60_000) }).catch((e) => e)
      assert.ok(err instanceof Error)
      assert.match(err.message, /^400: start: after end/)
      assert.doesNotMatch(err.message, /object Object/)
    })
  })

  test(`${name}: list startedAfter is inclusive; an unknown template lists nothing`, async () => {
    const suite = randomUUID()
    await withSandbox(sdk, { metadata: { suite } }, async (sbx) => {
      const [info] = await Sandbox.list({ query: { metadata: { suite } } }).nextItems()
      const at = info.startedAt
      const same = await Sandbox.list({ query: { metadata: { suite }, startedAfter: at } }).nextItems()
      assert.deepEqual(same.map((s) => s.sandboxId), [sbx.sandboxId])
      const after = new Date(at.getTime() + 1)
      assert.equal((await Sandbox.list({ query: { metadata: { suite }, startedAfter: after } }).nextItems()).length, 0)
      const none = await Sandbox.list({ query: { metadata: { suite }, template: 'no-such-template' } }).nextItems()
      assert.deepEqual(none, [])
      const base = await Sandbox.list({ query: { metadata: { suite }, template: 'base' } }).nextItems()
      assert.equal(base.length, 1)
    })
  })

  test(`${name}: the host template is what E2B's base is: python, git, curl, sudo`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
      assert.equal((await sbx.commands.run('sudo whoami')).stdout, 'root\n')
      assert.match((await sbx.commands.run('python --version')).stdout, /^Python 3\./)
      assert.match((await sbx.commands.run('python3 -c "print(6*7)"')).stdout, /^42\n$/)
      assert.match((await sbx.commands.run('git --version')).stdout, /^git version /)
      assert.match((await sbx.commands.run('curl --version')).stdout, /^curl /)
      // Root inside the box only: no_new_privs holds for what sudo runs.
      // (Asked of the kernel, PR_GET_NO_NEW_PRIVS: gVisor's /proc/self/status has no such line.)
      const nnp = await sbx.commands.run(
        `sudo python3 -c "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"`,
      )
      assert.equal(nnp.stdout, '1\n')
      await sbx.commands.run('sudo touch /root/made-by-sudo')
      // (A glob, not ls: coreutils' ls fails on every path under gVisor 20221219, see README.)
      assert.equal((await sbx.commands.run("sudo sh -c 'echo /root/*'")).stdout, '/root/made-by-sudo\n')
    })
  })
}

test('e2b@2.45.0: getMetrics honours the window of the sampled history; disk figures are real', async () => {
  await withSandbox(v245, {}, async (sbx) => {
    const first = await sbx.getMetrics()
    assert.equal(first.length, 1)  // sampled on the first ask
    assert.ok(first[0].diskTotal > 0, `diskTotal ${first[0].diskTotal}`)
    assert.ok(first[0].memTotal > 0)
    const before = first[0].diskUsed
    await sbx.commands.run('head -c 8000000 /dev/urandom > /home/user/blob && sync')
    // The sampler runs every 5 s: wait for two more samples.
    const all = await until(async () => {
      const m = await sbx.getMetrics()
      return m.length >= 3 && m
    }, 'three metric samples')
    const times = all.map((m) => m.timestamp.getTime())
    for (let i = 1; i < times.length; i++) assert.ok(times[i] > times[i - 1], `${times}`)
    const last = all[all.length - 1]
    assert.ok(last.diskUsed >= before + 8_000_000, `diskUsed ${before} -> ${last.diskUsed}`)
    assert.ok(last.diskUsed <= last.diskTotal)
    // A window that starts after the first sample leaves it out (E2B's window is unix seconds).
    const start = new Date(Math.ceil((times[0] + 1000) / 1000) * 1000)
    const windowed = await sbx.getMetrics({ start })
    assert.ok(windowed.length >= 1, `${windowed.length} of ${all.length}`)
    for (const m of windowed) assert.ok(m.timestamp.getTime() >= start.getTime(), `${m.timestamp}`)
    assert.ok(!windowed.some((m) => m.timestamp.getTime() === times[0]))
    const ended = await sbx.getMetrics({ end: new Date(times[0] - 5000) })
    assert.deepEqual(ended, [])
  })
})

test('e2b@2.45.0: the key the daemon minted passes the SDK\'s own format check', async () => {
  assert.equal(process.env.E2B_VALIDATE_API_KEY, undefined)  // validation is on
  assert.match(KEY, /^e2b_[0-9a-f]+$/)
  await withSandbox(v245, {}, async (sbx) => {
    assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n')
    const listed = await v245.Sandbox.list().nextItems()
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
  })
  // An sbx_ key (what older sbx minted) is refused by the SDK before any request.
  await assert.rejects(v245.Sandbox.list({ apiKey: 'sbx_abc' }).nextItems(), /Invalid API key format/)
})

test('Template.exists knows the base template and the registered ones, and no other', async () => {
  assert.equal(await v245.Template.exists('base'), true)
  assert.equal(await v245.Template.exists('host'), true)
  assert.equal(await v245.Template.exists('no-such-template-' + randomUUID().slice(0, 8)), false)
})

test('a feature sbx does not have yet is a 501 in E2B\'s error shape, not "not found"', async () => {
  const r = await fetch(`${API}/volumes`, {
    headers: { 'X-API-KEY': process.env.E2B_API_KEY },
  })
  assert.equal(r.status, 501)
  const body = await r.json()
  assert.equal(body.code, 501)
  assert.match(body.message, /does not implement volumes/)
})
