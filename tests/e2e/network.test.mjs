// The network fields through the official SDKs (issue 12) on a daemon started without networking
// (run.sh): allowInternetAccess: false is what such a box is (loopback only) and is accepted;
// E2B's own validation rules answer 400 and the SDK reports them; getInfo shows the policy.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { SDKS, withSandbox } from './helpers.mjs'

for (const [name, sdk] of SDKS) {
  const { Sandbox } = sdk

  test(`${name}: allowInternetAccess false works without networking`, async () => {
    await withSandbox(sdk, { allowInternetAccess: false }, async (sbx) => {
      const r = await sbx.commands.run('echo ok')
      assert.equal(r.stdout, 'ok\n')
      const info = await sbx.getInfo()
      assert.equal(info.allowInternetAccess, false)
      assert.deepEqual(info.network.denyOut, ['0.0.0.0/0'])
    })
  })

  test(`${name}: a domain in allowOut without denyOut 0.0.0.0/0 is an error`, async () => {
    await assert.rejects(
      Sandbox.create({ network: { allowOut: ['x.com'] } }),
      (e) => /0\.0\.0\.0\/0/.test(e.message) && /x\.com/.test(e.message),
    )
    await assert.rejects(
      Sandbox.create({ network: { denyOut: ['evil.example'] } }),
      (e) => /denyOut/.test(e.message),
    )
  })

  test(`${name}: a network on a daemon without networking is refused, saying so`, async () => {
    await assert.rejects(
      Sandbox.create({ network: { allowOut: ['x.com'], denyOut: ['0.0.0.0/0'] } }),
      (e) => /networking is not enabled on this daemon/.test(e.message),
    )
  })
}

// SDKs send allow_internet_access: true on every create (E2B's default): on a daemon without
// networking that is a box without a network, as before.
for (const [name, sdk] of SDKS) {
  test(`${name}: allowInternetAccess true (the default) works without networking`, async () => {
    await withSandbox(sdk, { allowInternetAccess: true }, async (sbx) => {
      const r = await sbx.commands.run('echo ok')
      assert.equal(r.stdout, 'ok\n')
    })
  })
}
