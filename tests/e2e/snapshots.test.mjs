// Snapshots, forks and pause without memory (issue 14) through both pinned SDKs: createSnapshot,
// listSnapshots (paged), Sandbox.create(snapshotId), deleteSnapshot, fork, pause({keepMemory:
// false}) then connect (a new boot), and onTimeout pause without memory.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { SDKS, withSandbox, sleep } from './helpers.mjs'

const bootId = async (sbx) =>
  (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()

for (const [name, sdk] of SDKS) {
  const { Sandbox } = sdk

  test(`${name}: createSnapshot, create from it, listSnapshots, deleteSnapshot`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.write('/home/user/state.txt', 'from the source')
      const snapName = `snap-test-${name.replace(/[^a-z0-9]/g, '')}-${Date.now()}`
      const snap = await sbx.createSnapshot({ name: snapName })
      assert.match(snap.snapshotId, /^snap-[a-z0-9]{20}$/)
      assert.deepEqual(snap.names, [snapName])
      const second = await sbx.createSnapshot()
      assert.deepEqual(second.names, [])
      // The source runs on.
      assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')

      for (const template of [snap.snapshotId, snapName]) {
        await withSandbox(sdk, { template }, async (copy) => {
          assert.equal(await copy.files.read('/home/user/state.txt'), 'from the source')
        })
      }

      // Paged one at a time: both, newest first, then no next page.
      const pages = sbx.listSnapshots({ limit: 1 })
      const seen = []
      while (pages.hasNext) seen.push(...(await pages.nextItems()))
      assert.deepEqual(seen.map((s) => s.snapshotId), [second.snapshotId, snap.snapshotId])
      const named = await Sandbox.listSnapshots({ name: snapName }).nextItems()
      assert.deepEqual(named.map((s) => s.snapshotId), [snap.snapshotId])

      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
      assert.equal(await Sandbox.deleteSnapshot(second.snapshotId), true)
      await assert.rejects(Sandbox.create(snap.snapshotId))
    })
  })

  test(`${name}: fork gives each fork the source's files while the source keeps running`, async () => {
    await withSandbox(sdk, { envs: { ROLE: 'source' } }, async (sbx) => {
      await sbx.files.write('/home/user/work.txt', 'half done')
      await sbx.commands.run('sleep 600', { background: true })
      const forks = await sbx.fork({ count: 2 })
      assert.equal(forks.length, 2)
      try {
        const ids = new Set()
        for (const f of forks) {
          assert.ok(f instanceof Sandbox, `a fork failed: ${f}`)
          ids.add(f.sandboxId)
          assert.notEqual(f.sandboxId, sbx.sandboxId)
          assert.equal(await f.files.read('/home/user/work.txt'), 'half done')
          assert.equal((await f.commands.run('echo $ROLE')).stdout, 'source\n')
          assert.notEqual(await bootId(f), await bootId(sbx))
        }
        assert.equal(ids.size, 2)
        assert.equal((await sbx.commands.run('pgrep -c sleep')).stdout, '1\n')
      } finally {
        for (const f of forks) if (f instanceof Sandbox) await f.kill().catch(() => {})
      }
      await assert.rejects(Sandbox.fork('doesnotexist00000000', { count: 1 }), sdk.NotFoundError)
    })
  })

  test(`${name}: pause without memory keeps the files, and connect boots it again`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.write('/home/user/kept.txt', 'kept')
      const before = await bootId(sbx)
      assert.equal(await sbx.pause({ keepMemory: false }), true)
      assert.equal((await sbx.getInfo()).state, 'paused')
      assert.equal(await sbx.pause({ keepMemory: false }), false) // already paused
      const again = await Sandbox.connect(sbx.sandboxId)
      assert.equal(await again.files.read('/home/user/kept.txt'), 'kept')
      assert.notEqual(await bootId(again), before)
    })
  })

  test(`${name}: onTimeout pause without memory`, async () => {
    await withSandbox(
      sdk,
      { timeoutMs: 2000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } },
      async (sbx) => {
        await sbx.files.write('/home/user/kept.txt', 'kept')
        // The TTL scan pauses it once the timeout has passed: wait for that state.
        let state = 'running'
        for (let i = 0; i < 300 && state !== 'paused'; i++) {
          state = (await sbx.getInfo()).state
          if (state !== 'paused') await sleep(100)
        }
        assert.equal(state, 'paused')
        const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60000 })
        assert.equal(await again.files.read('/home/user/kept.txt'), 'kept')
      },
    )
  })
}

for (const [name, sdk] of SDKS) {
  const { Sandbox } = sdk

  test(`${name}: autoResume resumes a paused sandbox on its next command`, async () => {
    await withSandbox(
      sdk,
      { lifecycle: { onTimeout: 'pause', autoResume: true } },
      async (sbx) => {
        await sbx.files.write('/home/user/kept.txt', 'kept')
        const bg = await sbx.commands.run('sleep 600', { background: true })
        assert.equal(await sbx.pause(), true)
        assert.equal((await sbx.getInfo()).state, 'paused')
        assert.equal(await sbx.isRunning(), false) // a health check carries no token: no resume
        // A command (with its envd token) resumes it, memory and all.
        assert.equal((await sbx.commands.run('cat /home/user/kept.txt')).stdout, 'kept')
        assert.equal((await sbx.getInfo()).state, 'running')
        assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
        // Without memory it cannot be: E2B's rule, checked by the daemon too.
        const r = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes`, {
          method: 'POST',
          headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
          body: JSON.stringify({
            templateID: 'base',
            autoPause: true,
            autoPauseMemory: false,
            autoResume: { enabled: true },
          }),
        })
        assert.equal(r.status, 400)
      },
    )
  })
}
