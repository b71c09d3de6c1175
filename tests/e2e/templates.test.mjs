// E2B template builds through the official SDK (spec section 6, "Template build"; docs/api.md
// "E2B's template API"): Template.build() of a template made fromTemplate('base') with copy, runCmd,
// setEnvs and setWorkdir, then Sandbox.create(name) on it; a failing runCmd and an image base
// (no registry here) end in BuildError with the reason; Template.exists; another key can neither
// replace nor delete the template; tags; the build log route; start and ready commands.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import * as sdk from 'e2b-251'

const { Template, Sandbox } = sdk
const base = process.env.E2B_API_URL

function context() {
  const dir = mkdtempSync(join(tmpdir(), 'sbx-e2e-template-'))
  writeFileSync(join(dir, 'hello.txt'), 'hello from the context\n')
  return dir
}

// A second tenant, made with the CLI on the daemon's data directory (run.sh exports both).
function otherKey() {
  return execFileSync(process.env.SBX_BIN, [
    '--data-dir', process.env.SBX_DATA_DIR, 'key', 'create', '--name', `b-${randomUUID().slice(0, 6)}`,
  ]).toString().trim()
}

async function del(name, key) {
  const r = await fetch(`${base}/templates/${name}`, { method: 'DELETE', headers: { 'X-API-KEY': key } })
  return r.status
}

test('Template.build fromTemplate(base) with copy, runCmd, setEnvs, setWorkdir; Sandbox.create runs on it', async () => {
  const dir = context()
  const name = `e2e-${randomUUID().slice(0, 8)}`
  try {
    assert.equal(await Template.exists(name), false)
    const tpl = Template({ fileContextPath: dir })
      .fromTemplate('base')
      .copy('hello.txt', '/app/')
      .runCmd('cat /app/hello.txt > /app/built.txt')
      .setEnvs({ GREETING: 'hi there' })
      .setWorkdir('/app')
    const logs = []
    const info = await Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e.message) })
    assert.equal(info.templateId, name)
    assert.ok(info.buildId)
    assert.ok(logs.length > 0)
    assert.equal(await Template.exists(name), true)

    const sbx = await Sandbox.create(name)
    try {
      const r = await sbx.commands.run('cat /app/built.txt /app/hello.txt; echo "$GREETING"; pwd')
      assert.equal(r.stdout, 'hello from the context\nhello from the context\nhi there\n/app\n')
    } finally {
      await sbx.kill().catch(() => {})
    }

    // A second build of the same name by the same key replaces it; the cache makes it quick.
    await Template.build(tpl, name)

    // Another key may neither replace nor delete it.
    const b = otherKey()
    await assert.rejects(
      Template.build(Template().fromTemplate('base').runCmd('true'), name, { apiKey: b }),
      (e) => e instanceof sdk.BuildError && /another key/.test(e.message),
    )
    assert.equal(await del(name, b), 403)
    assert.equal(await Template.exists(name), true)
    // Nor the built-ins.
    assert.equal(await del('base', b), 403)
    assert.equal(await del(name, process.env.E2B_API_KEY), 204)
    assert.equal(await Template.exists(name), false)
    assert.equal(await del(name, process.env.E2B_API_KEY), 404)
  } finally {
    await del(name, process.env.E2B_API_KEY).catch(() => {})
    rmSync(dir, { recursive: true, force: true })
  }
})

test('a failing runCmd ends the build in error with the reason', async () => {
  const name = `e2e-fail-${randomUUID().slice(0, 8)}`
  try {
    const tpl = Template().fromTemplate('base').runCmd('echo about to fail; exit 3')
    await assert.rejects(Template.build(tpl, name), (e) => {
      assert.ok(e instanceof sdk.BuildError, String(e))
      assert.match(e.message, /non-zero code: 3/)
      return true
    })
    // The raw status says the same, in E2B's shape.
    const h = { 'X-API-KEY': process.env.E2B_API_KEY }
    const t = await (await fetch(`${base}/templates/${name}`, { headers: h })).json()
    assert.equal(t.builds.length, 1)
    assert.equal(t.builds[0].status, 'error')
    const st = await (await fetch(`${base}/templates/${name}/builds/${t.builds[0].buildID}/status`, { headers: h })).json()
    assert.equal(st.status, 'error')
    assert.match(st.reason.message, /non-zero code: 3/)
    assert.ok(st.logEntries.some((e) => /about to fail/.test(e.message)), JSON.stringify(st.logEntries))
  } finally {
    await del(name, process.env.E2B_API_KEY).catch(() => {})
  }
})

test('fromImage needs a registry: the build ends in error saying so', async () => {
  const name = `e2e-img-${randomUUID().slice(0, 8)}`
  try {
    await assert.rejects(Template.build(Template().fromImage('python:3.12').runCmd('true'), name), (e) => {
      assert.ok(e instanceof sdk.BuildError, String(e))
      assert.match(e.message, /registry/)
      return true
    })
  } finally {
    await del(name, process.env.E2B_API_KEY).catch(() => {})
  }
})

// Tags (E2B's semantics, infra id.ParseName / register_build.go): a build gets its name's tag
// and `tags` (none: `default`, the bare name); POST /templates/tags points more tags at the build
// a name runs; each tag keeps its build when another tag of the template is rebuilt.
test('tags: name:tag builds, assignTags, getTags, removeTags, and each tag runs its own build', async () => {
  const name = `e2e-tags-${randomUUID().slice(0, 8)}`
  const key = process.env.E2B_API_KEY
  try {
    const v1 = await Template.build(Template().fromTemplate('base').runCmd('echo one > /v'), `${name}:v1`,
      { tags: ['stable'] })
    assert.equal(v1.templateId, name)
    assert.equal(await Template.exists(name), false, 'no default tag was built')
    const assigned = await Template.assignTags(`${name}:v1`, ['Production', 'default'])
    assert.equal(assigned.buildId, v1.buildId)
    assert.deepEqual(assigned.tags, ['production', 'default'])
    // A second build of the same template, tagged v2 only: v1, stable, production stay on v1.
    const v2 = await Template.build(Template().fromTemplate('base').runCmd('echo two > /v'), `${name}:v2`)
    assert.notEqual(v2.buildId, v1.buildId)
    const tags = await Template.getTags(name)
    const byTag = Object.fromEntries(tags.map((t) => [t.tag, t.buildId]))
    assert.deepEqual(byTag, {
      default: v1.buildId, production: v1.buildId, stable: v1.buildId, v1: v1.buildId, v2: v2.buildId,
    })
    assert.ok(tags.every((t) => t.createdAt instanceof Date && !isNaN(t.createdAt)))
    for (const [ref, want] of [[name, 'one'], [`${name}:default`, 'one'], [`${name}:production`, 'one'],
      [`${name}:v2`, 'two']]) {
      const sbx = await Sandbox.create(ref)
      try {
        assert.equal((await sbx.commands.run('cat /v')).stdout, `${want}\n`, ref)
      } finally {
        await sbx.kill().catch(() => {})
      }
    }
    // Bad tags, as E2B's own tests: a leading ':' and "name:".
    await assert.rejects(Template.assignTags(`${name}:v1`, ':invalid-tag'))
    await assert.rejects(Template.assignTags(`${name}:v1`, `${name}:`))
    await assert.rejects(Template.assignTags(`${name}:nope`, 'x'), /not found/)
    // Another key may not tag or untag it, nor tag a built-in.
    const b = otherKey()
    await assert.rejects(Template.assignTags(`${name}:v1`, 'theirs', { apiKey: b }), /another key/)
    await assert.rejects(Template.removeTags(name, 'stable', { apiKey: b }), /another key/)
    await assert.rejects(Template.assignTags('base', 'mine'), /built in/)
    // The default tag is never removed; others are, and a missing one is no error.
    await assert.rejects(Template.removeTags(name, 'default'), /default/)
    await Template.removeTags(name, ['stable', 'production', 'never-was'])
    assert.deepEqual((await Template.getTags(name)).map((t) => t.tag).sort(), ['default', 'v1', 'v2'])
    await assert.rejects(Sandbox.create(`${name}:stable`), /not found/)
    await assert.rejects(Template.removeTags(`nonexistent-${randomUUID().slice(0, 6)}`, 'x'), /not found/)
    // Deleting the template takes all its tags.
    assert.equal(await del(name, key), 204)
    assert.equal(await Template.exists(name), false)
    await assert.rejects(Template.getTags(name), /not found/)
  } finally {
    await del(name, key).catch(() => {})
  }
})

test('build logs: GET /templates/{id}/builds/{buildID}/logs with cursor, direction, limit and level', async () => {
  const name = `e2e-logs-${randomUUID().slice(0, 8)}`
  const h = { 'X-API-KEY': process.env.E2B_API_KEY }
  try {
    const info = await Template.build(Template().fromTemplate('base').runCmd('echo out-line; echo err-line >&2'), name)
    const url = `${base}/templates/${name}/builds/${info.buildId}/logs`
    const get = async (q = '') => {
      const r = await fetch(url + q, { headers: h })
      assert.equal(r.status, 200, await r.clone().text())
      return (await r.json()).logs
    }
    const all = await get()
    const messages = all.map((e) => e.message)
    assert.ok(messages.includes('out-line') && messages.includes('err-line'), messages.join('\n'))
    assert.ok(all.every((e) => e.timestamp && e.level && typeof e.message === 'string'))
    const last = await get('?direction=backward&limit=1')
    assert.deepEqual(last, [all[all.length - 1]])
    const from = Date.parse(all[all.length - 1].timestamp)
    const tail = await get(`?cursor=${from}`)
    assert.ok(tail.length >= 1 && tail.every((e) => Date.parse(e.timestamp) >= from))
    assert.ok((await get('?level=error')).every((e) => e.level === 'error'))
    assert.equal((await get('?limit=2')).length, 2)
    assert.equal((await fetch(url + '?direction=sideways', { headers: h })).status, 400)
    assert.equal((await fetch(`${base}/templates/${name}/builds/bld_00000000000000000000/logs`, { headers: h })).status, 404)
  } finally {
    await del(name, process.env.E2B_API_KEY).catch(() => {})
  }
})

// Start and ready commands: sbx has no memory snapshot, so they run at every create (docs/api.md).
test('setStartCmd with waitForPort / waitForFile: every Sandbox.create answers once ready, the start command still running', async () => {
  const name = `e2e-start-${randomUUID().slice(0, 8)}`
  const bad = `e2e-start-bad-${randomUUID().slice(0, 8)}`
  try {
    const tpl = Template().fromTemplate('base').setWorkdir('/tmp').setEnvs({ MARK: 'started' })
      .setStartCmd('sleep 0.3; echo "$MARK in $PWD" > /tmp/mark; exec sleep 3600', sdk.waitForFile('/tmp/mark'))
    await Template.build(tpl, name)
    for (let i = 0; i < 2; i++) {
      const sbx = await Sandbox.create(name)
      try {
        assert.equal((await sbx.commands.run('cat /tmp/mark')).stdout, 'started in /tmp\n')
        assert.equal((await sbx.commands.run('pgrep -f "sleep 3600" >/dev/null && echo running')).stdout, 'running\n')
      } finally {
        await sbx.kill().catch(() => {})
      }
    }
    // A start command that fails: the create fails naming it and its output, and leaves no box.
    // (Other files' sandboxes come and go meanwhile: only this template's are counted.)
    await Template.build(Template().fromTemplate('base')
      .setStartCmd('echo no such server; exit 4', sdk.waitForPort(8080)), bad)
    await assert.rejects(Sandbox.create(bad), (e) =>
      /start command 'echo no such server; exit 4' exited with code 4/.test(e.message) && /no such server/.test(e.message))
    assert.deepEqual((await Sandbox.list().nextItems()).filter((s) => s.templateId === bad), [])
  } finally {
    await del(name, process.env.E2B_API_KEY).catch(() => {})
    await del(bad, process.env.E2B_API_KEY).catch(() => {})
  }
})
