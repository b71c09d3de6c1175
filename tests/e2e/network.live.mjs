// E2B's network settings through the official SDKs against the fake internet (run.sh with
// FAKENET: the daemon has networking, its upstream DNS and CA are the fake internet's). What
// E2B's own network tests check, with test hosts: 198.18.1.30 (allowed.test) and 198.18.2.10
// (denied.test), both serving HTTPS with a certificate of the fake internet's CA (curl -k: the
// policy is what is under test, not the certificate).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { SDKS, withSandbox } from './helpers.mjs'

const reach = (url) => `curl -ksS --connect-timeout 5 --max-time 10 -o /dev/null -w '%{http_code}' ${url}`

for (const [name, sdk] of SDKS) {
  const { Sandbox, CommandExitError } = sdk
  const ALL_TRAFFIC = '0.0.0.0/0'

  test(`${name}: allowOut with denyOut ALL_TRAFFIC reaches only what it allows`, async () => {
    await withSandbox(sdk, { network: { denyOut: [ALL_TRAFFIC], allowOut: ['198.18.1.30'] } }, async (sbx) => {
      const ok = await sbx.commands.run(reach('https://198.18.1.30/headers'))
      assert.equal(ok.stdout.trim(), '200')
      await assert.rejects(sbx.commands.run(reach('https://198.18.2.10/')), CommandExitError)
    })
  })

  test(`${name}: denyOut of one address leaves the rest open`, async () => {
    await withSandbox(sdk, { network: { denyOut: ['198.18.2.10'] } }, async (sbx) => {
      await assert.rejects(sbx.commands.run(reach('https://198.18.2.10/')), CommandExitError)
      const ok = await sbx.commands.run(reach('https://allowed.test/headers'))
      assert.equal(ok.stdout.trim(), '200')
    })
  })

  test(`${name}: a domain in allowOut resolves and is reached; others do not resolve`, async () => {
    await withSandbox(sdk, { network: { denyOut: [ALL_TRAFFIC], allowOut: ['allowed.test'] } }, async (sbx) => {
      const ok = await sbx.commands.run(reach('https://allowed.test/headers'))
      assert.equal(ok.stdout.trim(), '200')
      const err = await sbx.commands.run(reach('https://denied.test/')).catch((e) => e)
      assert.ok(err instanceof CommandExitError)
      assert.equal(err.exitCode, 6) // curl: could not resolve host
    })
  })

  test(`${name}: allowInternetAccess false reaches nothing`, async () => {
    await withSandbox(sdk, { allowInternetAccess: false }, async (sbx) => {
      await assert.rejects(sbx.commands.run(reach('https://198.18.1.30/')), CommandExitError)
    })
  })

  test(`${name}: updateNetwork applies to the next connection, and {} clears it`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      const ok = await sbx.commands.run(reach('https://198.18.1.30/headers'))
      assert.equal(ok.stdout.trim(), '200')
      await sbx.updateNetwork({ denyOut: ['198.18.1.30'] })
      await assert.rejects(sbx.commands.run(reach('https://198.18.1.30/headers')), CommandExitError)
      await sbx.updateNetwork({})
      const again = await sbx.commands.run(reach('https://198.18.1.30/headers'))
      assert.equal(again.stdout.trim(), '200')
    })
  })
}
