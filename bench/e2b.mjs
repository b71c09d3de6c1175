// Create to first command through the official E2B JS SDK (e2b@2.51.0) against sbx's E2B
// facade: from Sandbox.create() until commands.run('true') has returned. The sandbox is killed
// after each run, outside the timed window. Prints one JSON object: {"samples_ms": [...],
// "errors": {...}}. Usage: node e2b.mjs RUNS CONCURRENCY (E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set by the caller).
import { Sandbox } from 'e2b-251'

const runs = Number(process.argv[2] || 30)
const concurrency = Number(process.argv[3] || 1)
const samples = []
const errors = {}

async function one() {
  const t0 = performance.now()
  let sbx
  try {
    sbx = await Sandbox.create({ timeoutMs: 120_000 })
    await sbx.commands.run('true')
    samples.push(performance.now() - t0)
  } catch (e) {
    const k = String(e && e.message ? e.message : e).slice(0, 120)
    errors[k] = (errors[k] || 0) + 1
  } finally {
    if (sbx) await sbx.kill().catch(() => {})
  }
}

async function worker(n) {
  for (let i = 0; i < n; i++) await one()
}

const per = Math.ceil(runs / concurrency)
await one() // warm-up: module loading, first connection
samples.length = 0
await Promise.all(Array.from({ length: concurrency }, () => worker(per)))
console.log(JSON.stringify({ samples_ms: samples, errors }))
