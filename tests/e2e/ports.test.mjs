// Other ports of a sandbox through the daemon, as E2B's edge proxy relays them: addressed by the
// E2b-Sandbox-Id/E2b-Sandbox-Port headers (what @e2b/code-interpreter sends on E2B_SANDBOX_URL) or
// by a Host `<port>-<id>.<domain>` (what sandbox.getHost(port) names), and only with the
// sandbox's traffic token (threats.md row 37).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { request } from 'node:http'
import { SDKS, withSandbox, sleep } from './helpers.mjs'

// An HTTP server for the sandbox: echoes requests as JSON, serves /big (5 MiB), and turns an
// `Upgrade: echo` request into a raw echo of whatever follows the 101.
const SERVER = `
import json, socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def reply(self):
        if self.headers.get('Upgrade') == 'echo':
            self.send_response(101)
            self.send_header('Upgrade', 'echo')
            self.send_header('Connection', 'Upgrade')
            self.end_headers()
            self.wfile.flush()
            while True:
                b = self.rfile.read1(65536)
                if not b:
                    return
                self.wfile.write(b)
                self.wfile.flush()
        n = int(self.headers.get('Content-Length') or 0)
        if self.headers.get('Transfer-Encoding') == 'chunked':
            body = b''
            while True:
                size = int(self.rfile.readline().strip(), 16)
                chunk = self.rfile.read(size + 2)[:size]
                if size == 0:
                    break
                body += chunk
        else:
            body = self.rfile.read(n)
        if self.path == '/big':
            out = b'0123456789abcdef' * (5 * 65536)
        else:
            out = json.dumps({'method': self.command, 'path': self.path, 'body': body.decode(),
                              'host': self.headers.get('Host'), 'x': self.headers.get('X-Test'),
                              'key': self.headers.get('X-API-KEY')}).encode()
        self.send_response(201)
        self.send_header('Content-Length', str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = reply
    def log_message(self, *a):
        pass

ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()
`

const base = new URL(process.env.E2B_SANDBOX_URL)

// One request to the daemon with raw control of Host and the body; resolves {status, headers, body}.
function call({ path = '/', method = 'GET', headers = {}, body, chunked = false }) {
  return new Promise((resolve, reject) => {
    const req = request({ host: base.hostname, port: base.port, path, method, headers }, (res) => {
      const parts = []
      res.on('data', (d) => parts.push(d))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts) }))
    })
    req.on('error', reject)
    if (body !== undefined) {
      if (chunked) for (const piece of body) req.write(piece)
      else req.write(body)
    }
    req.end()
  })
}

const [name, sdk] = SDKS[0]

test(`${name}: sandbox ports through the daemon (headers and Host), bodies, upgrades, 502s`, async () => {
  await withSandbox(sdk, {}, async (sbx) => {
    await sbx.files.write('/home/user/server.py', SERVER)
    await sbx.commands.run('python3 /home/user/server.py', { background: true })
    assert.ok(sbx.trafficAccessToken)
    const to = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000', 'E2B-Traffic-Access-Token': sbx.trafficAccessToken }
    let up
    for (let i = 0; i < 100; i++) {
      up = await call({ path: '/ping', headers: to })
      if (up.status === 201) break
      await sleep(100)
    }
    assert.equal(up.status, 201, up.body.toString())
    assert.equal(JSON.parse(up.body).path, '/ping')

    // The tenant's API key, if a client sends it along, does not reach the sandbox.
    const post = await call({ path: '/p?q=1', method: 'POST', headers: { ...to, 'X-Test': 'yes', 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'text/plain' }, body: 'hello body' })
    assert.deepEqual(JSON.parse(post.body), { method: 'POST', path: '/p?q=1', body: 'hello body', host: `${base.hostname}:${base.port}`, x: 'yes', key: null })
    const chunked = await call({ path: '/c', method: 'PUT', headers: to, body: ['one ', 'two ', 'three'], chunked: true })
    assert.equal(JSON.parse(chunked.body).body, 'one two three')
    const big = await call({ path: '/big', headers: to })
    assert.equal(big.body.length, 5 * 1024 * 1024)
    assert.ok(big.body.equals(Buffer.from('0123456789abcdef'.repeat(5 * 65536))))

    // sandbox.getHost(port) names `<port>-<id>.<domain>`; with a DNS entry for it, a plain Host works.
    const host = sbx.getHost(8000)
    assert.equal(host, `8000-${sbx.sandboxId}.${sbx.sandboxDomain ?? 'e2b.app'}`)
    const byHost = await call({ path: '/by-host', headers: { Host: `8000-${sbx.sandboxId}.sbx.test`, 'E2B-Traffic-Access-Token': sbx.trafficAccessToken } })
    assert.equal(byHost.status, 201)
    assert.equal(JSON.parse(byHost.body).host, `8000-${sbx.sandboxId}.sbx.test`)

    // An upgrade passes through: after the 101 the bytes go both ways.
    const echoed = await new Promise((resolve, reject) => {
      const req = request({ host: base.hostname, port: base.port, path: '/ws', headers: { ...to, Connection: 'Upgrade', Upgrade: 'echo' } })
      req.on('upgrade', (res, socket) => {
        assert.equal(res.statusCode, 101)
        let got = ''
        socket.on('data', (d) => {
          got += d
          if (got.length >= 10) { socket.destroy(); resolve(got) }
        })
        socket.write('ping-')
        setTimeout(() => socket.write('pong!'), 50)
      })
      req.on('error', reject)
      req.end()
    })
    assert.equal(echoed, 'ping-pong!')

    // Knowing the id is not enough: no token, a wrong one or another sandbox's is refused; the
    // envd access token works too.
    const id = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' }
    assert.equal((await call({ headers: id })).status, 403)
    assert.equal((await call({ headers: { ...id, 'E2B-Traffic-Access-Token': 'x'.repeat(64) } })).status, 403)
    assert.equal((await call({ headers: { Host: `8000-${sbx.sandboxId}.sbx.test` } })).status, 403)
    await withSandbox(sdk, {}, async (other) => {
      assert.equal((await call({ headers: { ...id, 'E2B-Traffic-Access-Token': other.trafficAccessToken } })).status, 403)
    })
    assert.equal((await call({ path: '/envd-token', headers: { ...id, 'X-Access-Token': sbx.envdAccessToken } })).status, 201)

    const closed = await call({ headers: { ...to, 'E2b-Sandbox-Port': '8001' } })
    assert.equal(closed.status, 502)
    assert.equal(JSON.parse(closed.body).message, 'The sandbox is running but port is not open')
    const unknown = await call({ headers: { 'E2b-Sandbox-Id': 'doesnotexist00000000', 'E2b-Sandbox-Port': '8000' } })
    assert.equal(unknown.status, 502)
    assert.equal(JSON.parse(unknown.body).message, 'The sandbox was not found')

    // A sandbox made with allowPublicTraffic: true has no traffic token and open ports.
    await withSandbox(sdk, { network: { allowPublicTraffic: true } }, async (pub) => {
      assert.equal(pub.trafficAccessToken, undefined)
      assert.equal((await sdk.Sandbox.getInfo(pub.sandboxId)).sandboxId, pub.sandboxId)
      await pub.commands.run('python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
      const open = { 'E2b-Sandbox-Id': pub.sandboxId, 'E2b-Sandbox-Port': '8000' }
      let status = 0
      for (let i = 0; i < 100 && status !== 200; i++) {
        status = (await call({ headers: open })).status
        if (status !== 200) await sleep(100)
      }
      assert.equal(status, 200)
    })

    // A paused sandbox's ports are not reachable.
    await sbx.pause()
    assert.equal((await call({ path: '/ping', headers: to })).status, 502)
  })
})
