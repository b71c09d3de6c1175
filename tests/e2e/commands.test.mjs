// process.Process through the official SDKs: commands.run, background commands, PTY.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { SDKS, withSandbox, sleep } from './helpers.mjs'

for (const [name, sdk] of SDKS) {
  test(`${name}: commands.run output, exit codes, envs, cwd, user, timeout`, async () => {
    await withSandbox(sdk, { envs: { BOXVAR: 'box' } }, async (sbx) => {
      const r = await sbx.commands.run('echo out; echo err >&2; whoami; pwd')
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'out\nuser\n/home/user\n')
      assert.equal(r.stderr, 'err\n')

      const e = await sbx.commands.run('echo partial; exit 3').catch((x) => x)
      assert.ok(e instanceof sdk.CommandExitError, `got ${e}`)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stdout, 'partial\n')

      const env = await sbx.commands.run('echo $BOXVAR $X', { envs: { X: 'cmd' } })
      assert.equal(env.stdout, 'box cmd\n')
      assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
      assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
      await assert.rejects(sbx.commands.run('sleep 20', { timeoutMs: 1_000 }), sdk.TimeoutError)

      const chunks = []
      await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => chunks.push(d) })
      assert.equal(chunks.join(''), '1\n2\n3\n')
    })
  })

  test(`${name}: background commands: stdin, closeStdin, list, kill, connect`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      const cat = await sbx.commands.run('cat', { background: true, stdin: true })
      assert.ok(cat.pid > 0)
      assert.ok((await sbx.commands.list()).some((p) => p.pid === cat.pid))
      await sbx.commands.sendStdin(cat.pid, 'line one\n')
      await sbx.commands.closeStdin(cat.pid)
      const done = await cat.wait()
      assert.equal(done.stdout, 'line one\n')

      const sleeper = await sbx.commands.run('sleep 100', { background: true })
      assert.equal(await sbx.commands.kill(sleeper.pid), true)
      await assert.rejects(sleeper.wait(), sdk.CommandExitError)
      assert.equal(await sbx.commands.kill(sleeper.pid), false)
      assert.ok(!(await sbx.commands.list()).some((p) => p.pid === sleeper.pid))

      // As with envd, connect follows from now on: what was written before is not replayed.
      const late = await sbx.commands.run(
        'echo before; touch /tmp/ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished',
        { background: true })
      for (let i = 0; i < 100 && !(await sbx.files.exists('/tmp/ready')); i++) await sleep(50)
      const attached = await sbx.commands.connect(late.pid)
      await sbx.files.write('/tmp/go', '')
      const r = await attached.wait()
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'finished\n')
    })
  })

  test(`${name}: PTY create, input, resize, kill`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      let out = ''
      const dec = new TextDecoder()
      const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
      const enc = new TextEncoder()
      await sbx.pty.sendInput(pty.pid, enc.encode('echo $((6*7))\n'))
      for (let i = 0; i < 50 && !out.includes('42'); i++) await sleep(100)
      assert.ok(out.includes('42'), out)
      await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
      await sbx.pty.sendInput(pty.pid, enc.encode('stty size\n'))
      for (let i = 0; i < 50 && !out.includes('30 100'); i++) await sleep(100)
      assert.ok(out.includes('30 100'), out)
      assert.equal(await sbx.pty.kill(pty.pid), true)
      await assert.rejects(pty.wait())
    })
  })
}

// StreamInput is client streaming, which fetch cannot send, so no SDK calls it; a Connect client
// with a streaming HTTP body (Go, curl) can. Sent here by hand: envelopes in a chunked body.
test('process.StreamInput: start, data and keepalive envelopes feed a process', async () => {
  const { request } = await import('node:http')
  const envelope = (msg) => {
    const payload = Buffer.from(JSON.stringify(msg))
    const head = Buffer.alloc(5)
    head.writeUInt32BE(payload.length, 1)
    return Buffer.concat([head, payload])
  }
  const [, sdk] = SDKS[0]
  await withSandbox(sdk, {}, async (sbx) => {
    const cat = await sbx.commands.run('cat', { background: true, stdin: true })
    const base = new URL(process.env.E2B_SANDBOX_URL)
    const b64 = (s) => Buffer.from(s).toString('base64')
    const res = await new Promise((resolve, reject) => {
      const req = request({
        host: base.hostname, port: base.port, method: 'POST', path: '/process.Process/StreamInput',
        headers: {
          'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1',
          'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': sbx.envdAccessToken,
        },
      }, (r) => {
        const parts = []
        r.on('data', (d) => parts.push(d))
        r.on('end', () => resolve({ status: r.statusCode, body: Buffer.concat(parts) }))
      })
      req.on('error', reject)
      req.write(envelope({ start: { process: { pid: cat.pid } } }))
      req.write(envelope({ data: { input: { stdin: b64('abc\n') } } }))
      setTimeout(() => {
        req.write(envelope({ keepalive: {} }))
        // One envelope split across two writes.
        const last = envelope({ data: { input: { stdin: b64('def\n') } } })
        req.write(last.subarray(0, 3))
        req.end(last.subarray(3))
      }, 100)
    })
    assert.equal(res.status, 200)
    // A response message, then the end-stream envelope (flag 2) without an error.
    assert.equal(res.body[0], 0)
    const n = res.body.readUInt32BE(1)
    assert.equal(res.body[5 + n], 2)
    assert.deepEqual(JSON.parse(res.body.subarray(10 + n).toString()), {})
    await sbx.commands.closeStdin(cat.pid)
    assert.equal((await cat.wait()).stdout, 'abc\ndef\n')
  })
})
