// Shared by the E2B compatibility tests: both pinned SDK versions, and a helper that kills a
// sandbox however the test ends.
import * as v251 from 'e2b-251'
import * as v250 from 'e2b-250'

// 2.51.0 uses the v2 create/connect routes, 2.50.0 the v1 routes (spec section 0).
export const SDKS = [
  ['e2b@2.51.0', v251],
  ['e2b@2.50.0', v250],
]

export async function withSandbox(sdk, opts, fn) {
  const sbx = await sdk.Sandbox.create(opts)
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// What the daemon's default template runs under (run.sh's E2E_RUNTIME; `sbx template runtime`).
// A test that cannot pass under it says why, as its skip reason.
export const RUNTIME = process.env.E2E_RUNTIME || 'native'
export const skipUnder = (runtime, why) => (RUNTIME === runtime ? `under ${runtime}: ${why}` : false)
