// What an agent does, through the official SDK over both transports: create -> run_command ->
// write/read/list files -> expose_port (a server in the box reached through the returned URL and
// headers) -> kill; capped output with its note; a timeout; progress of a long command.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { TRANSPORTS, call, text, withSandbox } from './helpers.mjs'

// Listens before it forks, so the port is open once run_command returns; the child leaves the
// command's process group and output pipes and serves /tmp/site.
const SERVER = `
import functools, http.server, os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8000))
s.listen(16)
if os.fork() == 0:
    os.setsid()
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    class H(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(('127.0.0.1', 8000), functools.partial(H, directory='/tmp/site'),
                                 bind_and_activate=False)
    srv.socket.close()
    srv.socket = s
    srv.serve_forever()
`

for (const [name, connect] of TRANSPORTS) {
  test(`${name}: create -> run_command -> files -> expose_port -> kill`, async () => {
    const { client, close } = await connect()
    try {
      await withSandbox(client, async (id) => {
        // A shell line: exit code and both streams.
        const sh = await call(client, 'run_command', { sandbox_id: id, command: 'echo hello; echo oops >&2; exit 3' })
        assert.equal(sh.structuredContent.exit_code, 3)
        assert.equal(sh.structuredContent.stdout, 'hello\n')
        assert.equal(sh.structuredContent.stderr, 'oops\n')
        assert.equal(sh.structuredContent.timed_out, false)
        assert.match(text(sh), /exited with code 3/)
        // argv, env, cwd and stdin.
        const py = await call(client, 'run_command', {
          sandbox_id: id, argv: ['python3', '-c', 'import os,sys; print(os.getcwd(), os.environ["X"], sys.stdin.read())'],
          env: { X: 'fromenv' }, cwd: '/tmp', stdin: 'fromstdin',
        })
        assert.equal(py.structuredContent.stdout, '/tmp fromenv fromstdin\n')
        // A program that does not exist: 127, as a shell says.
        const missing = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, argv: ['/no/such/program'] } })
        assert.equal(missing.isError, true)
        assert.equal(missing.structuredContent.exit_code, 127)

        // Files: write (parents made), read back, list.
        await call(client, 'write_file', { sandbox_id: id, path: '/tmp/site/hello.txt', content: 'hi there\n' })
        const read = await call(client, 'read_file', { sandbox_id: id, path: '/tmp/site/hello.txt' })
        assert.equal(read.structuredContent.content, 'hi there\n')
        assert.equal(text(read), 'hi there\n')
        const partial = await call(client, 'read_file', { sandbox_id: id, path: '/tmp/site/hello.txt', max_bytes: 3 })
        assert.equal(partial.structuredContent.content, 'hi ')
        assert.match(text(partial), /\[\.\.\. 6 more bytes not shown: read again with offset 3 \.\.\.\]/)
        const rest = await call(client, 'read_file', { sandbox_id: id, path: '/tmp/site/hello.txt', offset: 3 })
        assert.equal(rest.structuredContent.content, 'there\n')
        // Binary: refused as text, returned as base64.
        const bytes = Buffer.from([0, 1, 2, 0xff, 0xfe])
        await call(client, 'write_file', { sandbox_id: id, path: '/tmp/site/bin', content: bytes.toString('base64'), encoding: 'base64', mode: '0600' })
        const asText = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: '/tmp/site/bin' } })
        assert.equal(asText.isError, true)
        assert.match(text(asText), /base64/)
        const asB64 = await call(client, 'read_file', { sandbox_id: id, path: '/tmp/site/bin', encoding: 'base64' })
        assert.deepEqual(Buffer.from(asB64.structuredContent.content, 'base64'), bytes)
        const listed = await call(client, 'list_files', { sandbox_id: id, path: '/tmp/site' })
        const entries = Object.fromEntries(listed.structuredContent.entries.map((e) => [e.name, e]))
        assert.equal(entries['hello.txt'].size, 9)
        assert.equal(entries['hello.txt'].type, 'file')
        assert.equal(entries.bin.mode, 0o600)
        assert.match(text(listed), /hello\.txt/)
        const dir = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: '/tmp/site' } })
        assert.equal(dir.isError, true)
        assert.match(text(dir), /is a directory/)
        const gone = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: '/tmp/nope' } })
        assert.equal(gone.isError, true)

        // A server in the box, reached through expose_port's URL and headers.
        await call(client, 'write_file', { sandbox_id: id, path: '/tmp/serve.py', content: SERVER })
        await call(client, 'run_command', { sandbox_id: id, argv: ['python3', '/tmp/serve.py'] })
        const port = await call(client, 'expose_port', { sandbox_id: id, port: 8000 })
        const { url, headers } = port.structuredContent
        assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/$/)
        const res = await fetch(new URL('hello.txt', url), { headers })
        assert.equal(res.status, 200)
        assert.equal(await res.text(), 'hi there\n')
        const { 'E2B-Traffic-Access-Token': token, ...noToken } = headers
        assert.match(token, /^[0-9a-f]{64}$/)
        assert.equal((await fetch(new URL('hello.txt', url), { headers: noToken })).status, 403)
      })
    } finally {
      await close()
    }
  })

  test(`${name}: capped output, timeout, background, progress`, async () => {
    const { client, close } = await connect()
    try {
      await withSandbox(client, async (id) => {
        const flood = await call(client, 'run_command', {
          sandbox_id: id, command: "head -c 200000 /dev/zero | tr '\\0' a; printf END", max_output: 2048,
        })
        const r = flood.structuredContent
        assert.equal(r.stdout_bytes, 200003)
        assert.equal(r.stdout_cut_bytes, 200003 - 2048)
        assert.match(text(flood), /\[\.\.\. 197955 bytes of stdout cut \.\.\.\]/)
        assert.ok(r.stdout.startsWith('a'.repeat(1024)))
        assert.ok(r.stdout.endsWith('END'))

        const slow = await call(client, 'run_command', { sandbox_id: id, command: 'echo started; sleep 30', timeout: 1 })
        assert.equal(slow.structuredContent.timed_out, true)
        assert.equal(slow.structuredContent.stdout, 'started\n')
        assert.match(text(slow), /timed out after 1 s/)

        const bg = await call(client, 'run_command', { sandbox_id: id, command: 'sleep 300', background: true })
        assert.ok(bg.structuredContent.pid > 0)

        // A command longer than the progress period reports progress to a client that asks.
        const progress = []
        const long = await call(client, 'run_command', { sandbox_id: id, command: 'sleep 3; echo done' },
          { onprogress: (p) => progress.push(p) })
        assert.equal(long.structuredContent.stdout, 'done\n')
        assert.ok(progress.length >= 1, 'progress notifications')
        assert.match(progress[0].message, /running for/)
      })
    } finally {
      await close()
    }
  })
}
