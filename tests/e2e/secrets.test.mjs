// E2B secrets through the official SDKs' Secret API (spec section 6): create, getInfo by name and
// id, list with paging, update (a new version), exists, destroy; no answer holds a value.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { SDKS } from './helpers.mjs'

for (const [name, sdk] of SDKS) {
  const { Secret } = sdk

  test(`${name}: Secret create, getInfo, list, update, destroy; values never returned`, async () => {
    const suite = randomUUID().slice(0, 8)
    const value = `sk-e2e-REAL-${randomUUID()}`
    const names = [`a-${suite}`, `b-${suite}`, `c-${suite}`]
    const made = []
    for (const n of names) made.push(await Secret.create(n, value, { metadata: { suite } }))
    try {
      assert.equal(made[0].name, names[0])
      assert.equal(made[0].version, 1)
      assert.deepEqual(made[0].metadata, { suite })
      assert.ok(made[0].secretId)
      assert.ok(made[0].createdAt instanceof Date && !isNaN(made[0].createdAt))
      await assert.rejects(Secret.create(names[0], value), (e) => e instanceof sdk.SecretError)

      const byName = await Secret.getInfo(names[1])
      const byId = await Secret.getInfo(made[1].secretId)
      assert.equal(byName.secretId, made[1].secretId)
      assert.equal(byId.name, names[1])

      const paginator = Secret.list({ limit: 2 })
      const seen = []
      let pages = 0
      while (paginator.hasNext) {
        seen.push(...(await paginator.nextItems()))
        pages++
      }
      assert.ok(pages >= 2, `pages ${pages}`)
      for (const n of names) assert.ok(seen.some((s) => s.name === n), n)

      const updated = await Secret.update(names[2], value + '-v2')
      assert.equal(updated.version, 2)
      assert.equal(updated.secretId, made[2].secretId)
      assert.deepEqual(updated.metadata, { suite })

      // The raw answers of every read surface carry no value.
      const headers = { 'X-API-KEY': process.env.E2B_API_KEY }
      const base = process.env.E2B_API_URL
      for (const path of ['/secrets', `/secrets/${names[0]}`, `/secrets/${made[1].secretId}`]) {
        const r = await fetch(base + path, { headers })
        assert.equal(r.status, 200)
        const body = await r.text()
        assert.ok(!body.includes(value), `${path}: ${body}`)
      }
      assert.equal(await Secret.exists(names[0]), true)
      await assert.rejects(Secret.getInfo(`missing-${suite}`), (e) => e instanceof sdk.SecretNotFoundError)
    } finally {
      for (const n of names) await Secret.destroy(n).catch(() => {})
    }
    assert.equal(await Secret.exists(names[0]), false)
    assert.equal(await Secret.destroy(names[0]), false)
  })
}
