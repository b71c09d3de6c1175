// E2B template builds through the official SDK (spec section 6, "Template build"; docs/api.md
// "E2B's template API"): Template.build() of a template made fromTemplate('base') with copy, runCmd,
// setEnvs and setWorkdir, then Sandbox.create(name) on it; a failing runCmd and an image base
// (no registry here) end in BuildError with the reason; Template.exists; another key can neither
// replace nor delete the template.
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
