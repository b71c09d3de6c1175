// filesystem.Filesystem and /files through the official SDKs.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { SDKS, withSandbox, sleep, skipUnder } from './helpers.mjs'

// A unary envd call in Connect's JSON codec, as an SDK without its own client for it would make.
async function envdRpc(sbx, method, body) {
  const res = await fetch(`${process.env.E2B_SANDBOX_URL}/filesystem.Filesystem/${method}`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      'Connect-Protocol-Version': '1',
      'E2b-Sandbox-Id': sbx.sandboxId,
      'E2b-Sandbox-Port': '49983',
      'X-Access-Token': sbx.envdAccessToken,
    },
    body: JSON.stringify(body),
  })
  return { status: res.status, body: await res.json() }
}

for (const [name, sdk] of SDKS) {
  test(`${name}: write, read, list, makeDir, rename, remove, exists, getInfo`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      const info = await sbx.files.write('/home/user/a.txt', 'hello')
      assert.equal(info.path, '/home/user/a.txt')
      assert.equal(info.name, 'a.txt')
      assert.equal(await sbx.files.read('/home/user/a.txt'), 'hello')

      const many = await sbx.files.write([
        { path: '/home/user/m/one.txt', data: 'one' },
        { path: 'rel.txt', data: 'relative' },
      ])
      assert.deepEqual(many.map((w) => w.path), ['/home/user/m/one.txt', '/home/user/rel.txt'])
      assert.equal(await sbx.files.read('/home/user/rel.txt'), 'relative')

      const bytes = new Uint8Array([0, 1, 2, 250, 255])
      await sbx.files.write('/home/user/b.bin', bytes.buffer)
      assert.deepEqual(await sbx.files.read('/home/user/b.bin', { format: 'bytes' }), bytes)
      await sbx.files.write('/home/user/o.txt', 'octet', { useOctetStream: true })
      assert.equal(await sbx.files.read('/home/user/o.txt'), 'octet')
      await sbx.files.write('/home/user/g.txt', 'zipped '.repeat(1000), { gzip: true })
      assert.equal(await sbx.files.read('/home/user/g.txt'), 'zipped '.repeat(1000))
      // Downloads honour Accept-Encoding: gzip (the SDK asks with `gzip: true`).
      assert.equal(await sbx.files.read('/home/user/g.txt', { gzip: true }), 'zipped '.repeat(1000))
      const down = await fetch(await sbx.downloadUrl('/home/user/g.txt'), { headers: { 'Accept-Encoding': 'gzip' } })
      assert.equal(down.headers.get('content-encoding'), 'gzip')
      assert.equal(down.headers.get('content-type'), 'text/plain; charset=utf-8')
      assert.equal(await down.text(), 'zipped '.repeat(1000))
      await sbx.files.write('/home/user/empty.txt', '')
      assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
      await assert.rejects(sbx.files.read('/home/user/missing.txt'), sdk.FileNotFoundError)

      assert.equal(await sbx.files.makeDir('/home/user/d/sub'), true)
      assert.equal(await sbx.files.makeDir('/home/user/d/sub'), false)
      await sbx.files.write('/home/user/d/sub/f.txt', 'deep')
      const top = await sbx.files.list('/home/user/d')
      assert.deepEqual(top.map((e) => [e.name, e.type]), [['sub', 'dir']])
      const deep = await sbx.files.list('/home/user/d', { depth: 2 })
      assert.deepEqual(deep.map((e) => e.path).sort(), ['/home/user/d/sub', '/home/user/d/sub/f.txt'])

      const st = await sbx.files.getInfo('/home/user/d/sub/f.txt')
      assert.equal(st.type, 'file')
      assert.equal(st.size, 4)
      assert.equal(st.owner, 'user')
      assert.equal((await sbx.files.getInfo('/home/user/d')).type, 'dir')
      assert.equal(await sbx.files.exists('/home/user/d/sub/f.txt'), true)
      assert.equal(await sbx.files.exists('/home/user/nope'), false)

      const moved = await sbx.files.rename('/home/user/d/sub/f.txt', '/home/user/d/g.txt')
      assert.equal(moved.path, '/home/user/d/g.txt')
      assert.equal(await sbx.files.read('/home/user/d/g.txt'), 'deep')
      await sbx.files.remove('/home/user/d')
      assert.equal(await sbx.files.exists('/home/user/d'), false)
      // A name that is not UTF-8 does not break the listing; its bad byte reads as U+FFFD.
      await sbx.commands.run("touch $'/home/user/bad\\xff'")
      const names = (await sbx.files.list('/home/user')).map((e) => e.name)
      assert.ok(names.includes('bad\ufffd'), names.join(' '))
      await assert.rejects(sbx.files.list('/home/user/d'), sdk.NotFoundError)
    })
  })

  test(`${name}: watchDir reports create, write and remove`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.makeDir('/home/user/w')
      const events = []
      const handle = await sbx.files.watchDir('/home/user/w', (e) => events.push(`${e.type}:${e.name}`))
      await sbx.files.write('/home/user/w/x.txt', 'x')
      await sbx.commands.run('echo more >> /home/user/w/x.txt')
      await sbx.files.remove('/home/user/w/x.txt')
      for (let i = 0; i < 50 && !events.some((e) => e.startsWith('remove')); i++) await sleep(100)
      await handle.stop()
      assert.ok(events.includes('create:x.txt'), events.join(' '))
      assert.ok(events.includes('write:x.txt'), events.join(' '))
      assert.ok(events.includes('remove:x.txt'), events.join(' '))
    })
  })

  test(`${name}: file metadata on write, getInfo, list, rename and watch entries`, {
    // sbx keeps E2B's file metadata in user.* extended attributes; gVisor 20221219's gofer has none.
    skip: skipUnder('gvisor', "the gofer's files take no user.* extended attributes"),
  }, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      // Header names are case-insensitive: keys come back lower-cased, as from envd.
      const w = await sbx.files.write('/home/user/m.txt', 'meta', { metadata: { Owner: 'alice', stage: 'draft 1' } })
      assert.deepEqual(w.metadata, { owner: 'alice', stage: 'draft 1' })
      assert.deepEqual((await sbx.files.getInfo('/home/user/m.txt')).metadata, { owner: 'alice', stage: 'draft 1' })
      // Stored as user.e2b.* xattrs on the file itself.
      const xattr = await sbx.commands.run(
        `python3 -c 'import os; print(os.getxattr("/home/user/m.txt", "user.e2b.owner").decode())'`)
      assert.equal(xattr.stdout.trim(), 'alice')

      const many = await sbx.files.write(
        [{ path: '/home/user/mm/a.txt', data: 'a' }, { path: '/home/user/mm/b.txt', data: 'b' }],
        { metadata: { batch: '7' } })
      assert.deepEqual(many.map((f) => f.metadata), [{ batch: '7' }, { batch: '7' }])
      const listed = await sbx.files.list('/home/user/mm')
      assert.deepEqual(listed.map((e) => [e.name, e.metadata]), [['a.txt', { batch: '7' }], ['b.txt', { batch: '7' }]])
      const octet = await sbx.files.write('/home/user/o.txt', 'o', { metadata: { via: 'octet' }, useOctetStream: true })
      assert.deepEqual(octet.metadata, { via: 'octet' })

      // An overwrite replaces the whole set; one without metadata clears it.
      await sbx.files.write('/home/user/m.txt', 'v2', { metadata: { stage: 'final' } })
      assert.deepEqual((await sbx.files.getInfo('/home/user/m.txt')).metadata, { stage: 'final' })
      const moved = await sbx.files.rename('/home/user/m.txt', '/home/user/n.txt')
      assert.deepEqual(moved.metadata, { stage: 'final' })
      await sbx.files.write('/home/user/n.txt', 'v3')
      assert.equal((await sbx.files.getInfo('/home/user/n.txt')).metadata, undefined)

      // Set inside the sandbox, out of band: reported too.
      await sbx.commands.run(`python3 -c 'import os; os.setxattr("/home/user/n.txt", "user.e2b.tool", b"cli")'`)
      assert.deepEqual((await sbx.files.getInfo('/home/user/n.txt')).metadata, { tool: 'cli' })

      // Over envd's 4096-byte budget: refused, and nothing is written.
      await assert.rejects(
        sbx.files.write('/home/user/big.txt', 'x', { metadata: { k: 'v'.repeat(5000) } }),
        sdk.InvalidArgumentError)
      assert.equal(await sbx.files.exists('/home/user/big.txt'), false)

      await sbx.files.makeDir('/home/user/we')
      const entries = []
      const handle = await sbx.files.watchDir('/home/user/we', (e) => { if (e.entry) entries.push(e) }, { includeEntry: true })
      await sbx.files.write('/home/user/we/f.txt', 'watched', { metadata: { seen: 'yes' } })
      for (let i = 0; i < 50 && !entries.some((e) => e.entry.metadata); i++) await sleep(100)
      await handle.stop()
      const withMeta = entries.find((e) => e.entry.metadata)
      assert.ok(withMeta, JSON.stringify(entries))
      assert.equal(withMeta.entry.path, '/home/user/we/f.txt')
      assert.deepEqual(withMeta.entry.metadata, { seen: 'yes' })
    })
  })

  test(`${name}: polled watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher)`, async () => {
    // The JS SDK streams WatchDir; Python's synchronous SDK polls with these three RPCs.
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.makeDir('/home/user/pw/sub')
      const created = await envdRpc(sbx, 'CreateWatcher', { path: '/home/user/pw', recursive: true, includeEntry: true })
      assert.equal(created.status, 200, JSON.stringify(created.body))
      const watcherId = created.body.watcherId
      assert.ok(watcherId)
      await sbx.files.write('/home/user/pw/sub/f.txt', 'polled')
      await sbx.commands.run('rm /home/user/pw/sub/f.txt')
      let events = []
      for (let i = 0; i < 50 && !events.some((e) => e.type === 'EVENT_TYPE_REMOVE'); i++) {
        const got = await envdRpc(sbx, 'GetWatcherEvents', { watcherId })
        assert.equal(got.status, 200, JSON.stringify(got.body))
        events = events.concat(got.body.events)
        await sleep(100)
      }
      const kinds = events.map((e) => `${e.type}:${e.name}`)
      assert.ok(kinds.includes('EVENT_TYPE_CREATE:sub/f.txt'), kinds.join(' '))
      assert.ok(kinds.includes('EVENT_TYPE_REMOVE:sub/f.txt'), kinds.join(' '))
      assert.ok(events.some((e) => e.entry && e.entry.path === '/home/user/pw/sub/f.txt'))
      // Taken events are gone; a removed watcher is unknown.
      assert.deepEqual((await envdRpc(sbx, 'GetWatcherEvents', { watcherId })).body.events ?? [], [])
      assert.equal((await envdRpc(sbx, 'RemoveWatcher', { watcherId })).status, 200)
      const gone = await envdRpc(sbx, 'GetWatcherEvents', { watcherId })
      assert.equal(gone.status, 404)
      assert.equal(gone.body.code, 'not_found')
      const notDir = await envdRpc(sbx, 'CreateWatcher', { path: '/home/user/pw/none' })
      assert.equal(notDir.body.code, 'not_found')
    })
  })

  test(`${name}: a 256 MiB upload streams through the daemon`, async () => {
    // VmHWM is the daemon's peak resident memory: a buffered upload would raise it by 256 MiB.
    const peakKiB = () => {
      const status = readFileSync(`/proc/${process.env.SBX_DAEMON_PID}/status`, 'utf8')
      return Number(/VmHWM:\s+(\d+)/.exec(status)[1])
    }
    await withSandbox(sdk, {}, async (sbx) => {
      const size = 256 << 20
      const data = new Uint8Array(size)
      for (let i = 0; i < size; i += 4096) data[i] = i % 251
      const before = peakKiB()
      await sbx.files.write('/home/user/big.bin', data.buffer)
      const grew = peakKiB() - before
      assert.ok(grew < 64 * 1024, `daemon peak RSS grew by ${grew} KiB`)
      const sum = await sbx.commands.run('wc -c < /home/user/big.bin && od -An -tu1 -j 8192 -N1 /home/user/big.bin')
      assert.deepEqual(sum.stdout.trim().split(/\s+/), [String(size), String(8192 % 251)])
    })
  })

  test(`${name}: pre-signed upload and download URLs`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      const up = await sbx.uploadUrl('/home/user/u.txt', { useSignatureExpiration: 60 })
      const form = new FormData()
      form.append('file', new Blob(['via url']), '/home/user/u.txt')
      const res = await fetch(up, { method: 'POST', body: form })
      assert.equal(res.status, 200)
      assert.equal(await sbx.files.read('/home/user/u.txt'), 'via url')

      const down = await sbx.downloadUrl('/home/user/u.txt')
      const got = await fetch(down)
      assert.equal(got.status, 200)
      assert.equal(await got.text(), 'via url')

      const forged = new URL(down)
      forged.searchParams.set('path', '/etc/shadow')
      assert.equal((await fetch(forged)).status, 401)
    })
  })
}
