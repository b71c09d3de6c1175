// Control plane through the official SDKs: create, getInfo, list (filters, paging), setTimeout,
// pause/connect, kill, wrong key, unknown sandbox.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { SDKS, withSandbox, sleep } from './helpers.mjs'

for (const [name, sdk] of SDKS) {
  const { Sandbox } = sdk

  test(`${name}: create with metadata, envs and timeout; getInfo`, async () => {
    const opts = { metadata: { owner: 'e2e', 'with space': 'a b&c=d' }, envs: { FOO: 'bar' }, timeoutMs: 120_000 }
    await withSandbox(sdk, opts, async (sbx) => {
      const info = await sbx.getInfo()
      assert.equal(info.sandboxId, sbx.sandboxId)
      assert.equal(info.state, 'running')
      assert.deepEqual(info.metadata, opts.metadata)
      const ttl = info.endAt.getTime() - info.startedAt.getTime()
      assert.ok(ttl > 110_000 && ttl <= 125_000, `ttl ${ttl}`)
      const r = await sbx.commands.run('echo $FOO')
      assert.equal(r.stdout, 'bar\n')
      assert.equal(await sbx.isRunning(), true)
      const metrics = await sbx.getMetrics()
      assert.ok(Array.isArray(metrics))
    })
  })

  test(`${name}: Sandbox.list with metadata and state filters and paging`, async () => {
    const suite = randomUUID()
    const boxes = []
    try {
      for (let i = 0; i < 3; i++)
        boxes.push(await Sandbox.create({ metadata: { suite, 'k&': 'v=1 x', i: String(i) } }))
      const page = Sandbox.list({ query: { metadata: { suite, 'k&': 'v=1 x' } }, limit: 2 })
      const first = await page.nextItems()
      assert.equal(first.length, 2)
      assert.equal(page.hasNext, true)
      const second = await page.nextItems()
      assert.equal(second.length, 1)
      assert.equal(page.hasNext, false)
      const ids = new Set([...first, ...second].map((s) => s.sandboxId))
      assert.deepEqual(ids, new Set(boxes.map((b) => b.sandboxId)))

      const one = await Sandbox.list({ query: { metadata: { suite, i: '1' } } }).nextItems()
      assert.deepEqual(one.map((s) => s.sandboxId), [boxes[1].sandboxId])
      const none = await Sandbox.list({ query: { metadata: { suite, 'k&': 'other' } } }).nextItems()
      assert.equal(none.length, 0)

      // Newest first by default; `order: 'asc'` is creation order, across pages too.
      const created = boxes.map((b) => b.sandboxId)
      const desc = await Sandbox.list({ query: { metadata: { suite } } }).nextItems()
      assert.deepEqual(desc.map((s) => s.sandboxId), [...created].reverse())
      const asc = Sandbox.list({ query: { metadata: { suite } }, order: 'asc', limit: 2 })
      const ascIds = [...(await asc.nextItems()), ...(await asc.nextItems())].map((s) => s.sandboxId)
      assert.deepEqual(ascIds, created)
      // startedAfter is inclusive, as E2B's: the sandbox started exactly then is listed too.
      const since = desc.find((s) => s.sandboxId === created[1]).startedAt
      const later = await Sandbox.list({ query: { metadata: { suite }, startedAfter: since }, order: 'asc' }).nextItems()
      assert.deepEqual(later.map((s) => s.sandboxId), created.slice(1))
      // E2B's default template name 'base' is an alias of sbx's host template, in list as in create.
      const base = await Sandbox.list({ query: { metadata: { suite }, template: 'base' } }).nextItems()
      assert.equal(base.length, 3)

      assert.equal(await boxes[0].pause(), true)
      const paused = await Sandbox.list({ query: { metadata: { suite }, state: ['paused'] } }).nextItems()
      assert.deepEqual(paused.map((s) => [s.sandboxId, s.state]), [[boxes[0].sandboxId, 'paused']])
      const running = await Sandbox.list({ query: { metadata: { suite }, state: ['running'] } }).nextItems()
      assert.equal(running.length, 2)
    } finally {
      for (const b of boxes) await b.kill().catch(() => {})
    }
  })

  test(`${name}: setTimeout ends the sandbox`, async () => {
    const sbx = await Sandbox.create({ timeoutMs: 60_000 })
    try {
      await sbx.setTimeout(1_000)
      await sleep(3_000)
      assert.equal(await sbx.isRunning(), false)
      await assert.rejects(Sandbox.connect(sbx.sandboxId), sdk.NotFoundError)
      assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    } finally {
      await sbx.kill().catch(() => {})
    }
  })

  test(`${name}: pause then connect keeps files and running processes`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.write('/home/user/kept.txt', 'still here')
      const bg = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true, timeoutMs: 0 })
      assert.equal(await sbx.pause(), true)
      assert.equal(await sbx.pause(), false) // 409: already paused
      assert.equal((await sbx.getInfo()).state, 'paused')
      const again = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await again.getInfo()).state, 'running')
      assert.equal(await again.files.read('/home/user/kept.txt'), 'still here')
      const procs = await again.commands.list()
      assert.ok(procs.some((p) => p.pid === bg.pid), 'background process survived')
      const h = await again.commands.connect(bg.pid)
      await again.commands.sendStdin(bg.pid, 'hello\n')
      const r = await h.wait()
      assert.equal(r.stdout, 'got hello\n')
    })
  })

  test(`${name}: kill`, async () => {
    const sbx = await Sandbox.create()
    assert.equal(await sbx.kill(), true)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.getInfo(), sdk.NotFoundError)
  })

  test(`${name}: wrong API key and unknown sandbox`, async () => {
    await assert.rejects(Sandbox.create({ apiKey: 'sbx_not_a_key' }), sdk.AuthenticationError)
    await assert.rejects(Sandbox.list({ apiKey: 'sbx_not_a_key' }).nextItems(), sdk.AuthenticationError)
    await assert.rejects(Sandbox.connect('doesnotexist00000000'), sdk.NotFoundError)
    await assert.rejects(Sandbox.getInfo('doesnotexist00000000'), sdk.NotFoundError)
    assert.equal(await Sandbox.kill('doesnotexist00000000'), false)
  })
}

test('envd routing by Host <port>-<id>.<domain> on the control-plane port', async () => {
  const { request } = await import('node:http')
  const get = (host, headers = {}) =>
    new Promise((resolve, reject) => {
      const url = new URL(process.env.E2B_API_URL)
      const req = request({ host: url.hostname, port: url.port, path: '/health', headers: { Host: host, ...headers } }, (res) => {
        res.resume()
        res.on('end', () => resolve(res.statusCode))
      })
      req.on('error', reject)
      req.end()
    })
  const [, sdk] = SDKS[0]
  await withSandbox(sdk, {}, async (sbx) => {
    assert.equal(await get(`49983-${sbx.sandboxId}.e2b.local`), 204)
    assert.equal(await get('49983-doesnotexist00000000.e2b.local'), 502)
    // Another port: relayed with the traffic token (nothing listens on 8080: 502), 403 without.
    assert.equal(await get(`8080-${sbx.sandboxId}.e2b.local`), 403)
    assert.equal(await get(`8080-${sbx.sandboxId}.e2b.local`, { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken }), 502)
  })
})
