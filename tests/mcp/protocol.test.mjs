// The transport and protocol rules of /mcp, with raw requests where the SDK would never err:
// authentication, Origin (DNS rebinding), sessions, version negotiation, batches, Accept.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { McpError, ErrorCode } from '@modelcontextprotocol/sdk/types.js'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { URL_BASE, KEY, httpClient, post, rawSession, text } from './helpers.mjs'

const ping = (id = 2) => ({ jsonrpc: '2.0', id, method: 'ping' })

test('unauthenticated and wrongly keyed requests are refused', async () => {
  for (const headers of [{ Authorization: '' }, { Authorization: 'Bearer sbx_nope' }, { 'X-API-Key': 'nope', Authorization: '' }]) {
    const r = await post(ping(), headers)
    assert.equal(r.status, 401, JSON.stringify(headers))
    assert.equal(r.json.jsonrpc, '2.0')
    assert.match(r.json.error.message, /API key/)
  }
  // The SDK's client sees the refusal as an error at connect.
  await assert.rejects(httpClient({ Authorization: 'Bearer sbx_wrong' }), /401|API key/)
  // X-API-Key works as well as Bearer.
  const r = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18' } },
    { Authorization: '', 'X-API-Key': KEY })
  assert.equal(r.status, 200)
})

test('a browser Origin is refused (DNS rebinding), before the key is even looked at', async () => {
  for (const origin of ['http://evil.example', URL_BASE, 'null']) {
    const r = await post(ping(), { Origin: origin })
    assert.equal(r.status, 403, origin)
  }
  const get = await fetch(`${URL_BASE}/mcp`, { headers: { Origin: 'http://evil.example' } })
  assert.equal(get.status, 403)
})

test('initialize negotiates the version and opens a session; others need it', async () => {
  for (const [asked, answered] of [['2025-06-18', '2025-06-18'], ['2025-03-26', '2025-03-26'], ['2024-11-05', '2024-11-05'], ['2099-01-01', '2025-11-25']]) {
    const r = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: asked, capabilities: {}, clientInfo: { name: 'x', version: '1' } } })
    assert.equal(r.status, 200)
    assert.equal(r.json.result.protocolVersion, answered)
    assert.equal(r.json.result.serverInfo.name, 'sbx')
    assert.ok(r.json.result.capabilities.tools)
    assert.match(r.headers.get('mcp-session-id'), /^[a-z0-9]{25}$/)
  }
  const bad = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} })
  assert.equal(bad.json.error.code, ErrorCode.InvalidParams)

  assert.equal((await post(ping())).status, 400)  // no session
  assert.equal((await post(ping(), { 'Mcp-Session-Id': 'nosuchsession' })).status, 404)
  const sid = await rawSession()
  const ok = await post(ping(), { 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '2025-06-18' })
  assert.equal(ok.status, 200)
  assert.deepEqual(ok.json, { jsonrpc: '2.0', id: 2, result: {} })
  const unsupported = await post(ping(), { 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '1.0' })
  assert.equal(unsupported.status, 400)
  // Notifications are accepted without a body.
  const note = await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, { 'Mcp-Session-Id': sid })
  assert.equal(note.status, 202)
  assert.equal(note.raw, '')
  // DELETE ends it.
  const del = await fetch(`${URL_BASE}/mcp`, { method: 'DELETE', headers: { Authorization: `Bearer ${KEY}`, 'Mcp-Session-Id': sid } })
  assert.equal(del.status, 204)
  assert.equal((await post(ping(), { 'Mcp-Session-Id': sid })).status, 404)
  // GET offers no stream.
  const get = await fetch(`${URL_BASE}/mcp`, { headers: { Authorization: `Bearer ${KEY}`, Accept: 'text/event-stream' } })
  assert.equal(get.status, 405)
})

test('malformed messages get JSON-RPC errors', async () => {
  const sid = await rawSession()
  const h = { 'Mcp-Session-Id': sid }
  const parse = await post('{"jsonrpc":', h)
  assert.equal(parse.status, 400)
  assert.equal(parse.json.error.code, ErrorCode.ParseError)
  const invalid = await post({ jsonrpc: '1.0', id: 3, method: 'ping' }, h)
  assert.equal(invalid.json.error.code, ErrorCode.InvalidRequest)
  assert.equal(invalid.json.id, 3)
  const unknown = await post({ jsonrpc: '2.0', id: 4, method: 'resources/list' }, h)
  assert.equal(unknown.json.error.code, ErrorCode.MethodNotFound)
  const again = await post({ jsonrpc: '2.0', id: 5, method: 'initialize', params: { protocolVersion: '2025-06-18' } }, { ...h, 'Content-Type': 'text/plain' })
  assert.equal(again.status, 415)
  const accept = await post(ping(), { ...h, Accept: 'text/html' })
  assert.equal(accept.status, 406)
})

test('batches: refused from 2025-06-18 on, answered item by item before', async () => {
  const batch = [ping(1), { jsonrpc: '2.0', method: 'notifications/initialized' }, ping(2), 7]
  const newer = await rawSession('2025-06-18')
  assert.equal((await post(batch, { 'Mcp-Session-Id': newer })).status, 400)
  const older = await rawSession('2025-03-26')
  const r = await post(batch, { 'Mcp-Session-Id': older })
  assert.equal(r.status, 200)
  assert.equal(r.json.length, 3)
  assert.deepEqual(r.json[0], { jsonrpc: '2.0', id: 1, result: {} })
  assert.deepEqual(r.json[1], { jsonrpc: '2.0', id: 2, result: {} })
  assert.equal(r.json[2].error.code, ErrorCode.InvalidRequest)
  const init = await post([{ jsonrpc: '2.0', id: 9, method: 'initialize', params: { protocolVersion: '2025-03-26' } }], { 'Mcp-Session-Id': older })
  assert.equal(init.json[0].error.code, ErrorCode.InvalidRequest)
})

test('another key cannot use a session', async () => {
  const other = process.env.SBX_TEST_OTHER_KEY
  assert.match(other, /\S/)
  const sid = await rawSession()
  assert.equal((await post(ping(), { 'Mcp-Session-Id': sid, Authorization: `Bearer ${other}` })).status, 404)
  const del = await fetch(`${URL_BASE}/mcp`, { method: 'DELETE', headers: { Authorization: `Bearer ${other}`, 'Mcp-Session-Id': sid } })
  assert.equal(del.status, 404)
  assert.equal((await post(ping(), { 'Mcp-Session-Id': sid })).status, 200)
})

test('a bad argument is a tool error the model can read; an unknown tool a protocol error', async () => {
  const { client, close } = await httpClient()
  try {
    const bad = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: 42 } })
    assert.equal(bad.isError, true)
    assert.match(text(bad), /sandbox_id: must be a string/)
    const extra = await client.callTool({ name: 'list_sandboxes', arguments: { colour: 'red' } })
    assert.equal(extra.isError, true)
    assert.match(text(extra), /unknown argument "colour"/)
    const range = await client.callTool({ name: 'create_sandbox', arguments: { timeout: 0 } })
    assert.equal(range.isError, true)
    assert.match(text(range), /timeout: must be an integer from 1 to/)
    const missing = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: 'nosuchbox' } })
    assert.equal(missing.isError, true)
    assert.match(text(missing), /nosuchbox/)
    await assert.rejects(client.callTool({ name: 'no_such_tool', arguments: {} }),
      (e) => e instanceof McpError && e.code === ErrorCode.InvalidParams)
  } finally {
    await close()
  }
})

test('stdio: a daemon that cannot be reached is an error the client sees, on stderr too', async () => {
  const transport = new StdioClientTransport({
    command: process.env.SBX_BIN,
    // Port 1 on loopback: nothing listens there.
    args: ['mcp', '--url', 'http://127.0.0.1:1', '--api-key', 'sbx_unused'],
    stderr: 'pipe',
  })
  let stderr = ''
  // The whole of it: the pipe may still hold the message when connect() has failed.
  const ended = new Promise((resolve) => transport.stderr.on('end', resolve))
  transport.stderr.on('data', (d) => { stderr += d })
  const client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' })
  await assert.rejects(client.connect(transport), /cannot reach the sbx daemon at http:\/\/127\.0\.0\.1:1/)
  await client.close()
  await ended
  assert.match(stderr, /cannot reach the sbx daemon/)
})
