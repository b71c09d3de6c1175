// Shared by the MCP tests: clients of the official SDK over both transports, and small helpers.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'

export const URL_BASE = process.env.SBX_TEST_URL
export const KEY = process.env.SBX_TEST_KEY

// An SDK client connected over streamable HTTP with the API key (initialize done).
export async function httpClient(headers = { Authorization: `Bearer ${KEY}` }) {
  const client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(`${URL_BASE}/mcp`), {
    requestInit: { headers },
  })
  await client.connect(transport)
  return { client, transport, close: async () => { await transport.terminateSession(); await client.close() } }
}

// An SDK client that spawns `sbx mcp`, which finds the daemon and its key in the data directory
// as every CLI verb does (the SDK passes the child only a minimal environment).
export async function stdioClient() {
  const transport = new StdioClientTransport({
    command: process.env.SBX_BIN,
    args: ['--data-dir', process.env.SBX_TEST_DATA_DIR, 'mcp'],
    stderr: 'pipe',
  })
  let stderr = ''
  transport.stderr?.on('data', (d) => { stderr += d })
  const client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' })
  await client.connect(transport)
  return { client, transport, stderr: () => stderr, close: () => client.close() }
}

export const TRANSPORTS = [
  ['http', httpClient],
  ['stdio', stdioClient],
]

// The text of a tool result (its one text block).
export function text(result) {
  return result.content.filter((c) => c.type === 'text').map((c) => c.text).join('')
}

// Calls a tool and fails unless it succeeded.
export async function call(client, name, args = {}, options) {
  const result = await client.callTool({ name, arguments: args }, undefined, options)
  if (result.isError) throw new Error(`${name} failed: ${text(result)}`)
  return result
}

// Runs `fn` with a fresh sandbox, always killing it afterwards.
export async function withSandbox(client, fn, args = {}) {
  const created = await call(client, 'create_sandbox', { timeout: 300, ...args })
  const id = created.structuredContent.id
  try {
    return await fn(id, created)
  } finally {
    await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } })
  }
}

// A raw POST to /mcp, for what the SDK would never send.
export async function post(body, headers = {}) {
  const res = await fetch(`${URL_BASE}/mcp`, {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${KEY}`,
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      ...headers,
    },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })
  const raw = await res.text()
  let json = null
  try { json = JSON.parse(raw) } catch {}
  return { status: res.status, headers: res.headers, json, raw }
}

// A session opened by hand at `version`; returns its id.
export async function rawSession(version = '2025-06-18') {
  const r = await post({
    jsonrpc: '2.0', id: 1, method: 'initialize',
    params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
  })
  if (r.status !== 200) throw new Error(`initialize: ${r.status} ${r.raw}`)
  return r.headers.get('mcp-session-id')
}
