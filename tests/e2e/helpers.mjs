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
