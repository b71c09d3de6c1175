// Sandbox lifecycle through the tools, with the official SDK over both transports.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { TRANSPORTS, call, text, withSandbox, httpClient } from './helpers.mjs'

const TOOLS = ['create_sandbox', 'list_sandboxes', 'kill_sandbox', 'run_command', 'read_file',
  'write_file', 'list_files', 'expose_port']

for (const [name, connect] of TRANSPORTS) {
  test(`${name}: initialize, tools/list, create -> list -> kill`, async () => {
    const { client, close } = await connect()
    try {
      assert.equal(client.getServerVersion().name, 'sbx')
      assert.ok(client.getServerCapabilities().tools)
      assert.match(client.getInstructions(), /create_sandbox/)
      const { tools } = await client.listTools()
      const names = tools.map((t) => t.name)
      for (const t of TOOLS) assert.ok(names.includes(t), `${t} in ${names}`)
      for (const t of tools) {
        assert.equal(t.inputSchema.type, 'object')
        assert.ok(t.description.length > 20, t.name)
      }
      await withSandbox(client, async (id, created) => {
        assert.match(id, /^[a-z0-9]+$/)
        assert.equal(created.structuredContent.state, 'running')
        assert.match(text(created), new RegExp(id))
        const listed = await call(client, 'list_sandboxes', { metadata: { test: name } })
        assert.deepEqual(listed.structuredContent.sandboxes.map((s) => s.id), [id])
      }, { metadata: { test: name } })
      const after = await call(client, 'list_sandboxes', { metadata: { test: name } })
      assert.deepEqual(after.structuredContent.sandboxes, [])
      assert.match(text(after), /No sandboxes/)
      const killedAgain = await client.callTool({ name: 'list_sandboxes', arguments: { state: 'all', metadata: { test: name } } })
      assert.equal(killedAgain.structuredContent.sandboxes[0].state, 'killed')
    } finally {
      await close()
    }
  })
}

test('another key sees none of my sandboxes', async () => {
  const mine = await httpClient()
  const theirs = await httpClient({ Authorization: `Bearer ${process.env.SBX_TEST_OTHER_KEY}` })
  try {
    await withSandbox(mine.client, async (id) => {
      const killed = await theirs.client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } })
      assert.equal(killed.isError, true)
      const port = await theirs.client.callTool({ name: 'expose_port', arguments: { sandbox_id: id, port: 8000 } })
      assert.equal(port.isError, true)
      const listed = await call(theirs.client, 'list_sandboxes')
      assert.ok(!listed.structuredContent.sandboxes.some((s) => s.id === id))
    })
  } finally {
    await mine.close()
    await theirs.close()
  }
})
