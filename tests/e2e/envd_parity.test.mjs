// envd parity (issue 11): what E2B's envd answers where sbx used to answer otherwise, through the
// official SDKs: getInfo of a symlink, the two messages of a bad pre-signed URL, and a command
// whose sandbox is killed while it runs.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { SDKS, withSandbox } from './helpers.mjs'

// Nothing an SDK shows may name a path on the daemon's host (the data directory, agent sockets).
function assertNoHostPath(message) {
  assert.doesNotMatch(message, /agent\.sock|sbx-e2e\.|\/boxes\//, message)
}

for (const [name, sdk] of SDKS) {
  test(`${name}: getInfo of a symlink answers for its target, as envd does`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.write('/home/user/real/f.txt', 'hello')
      // A chain of links, one relative: symlinkTarget is where it resolves in the end.
      await sbx.commands.run(
        'chmod 600 /home/user/real/f.txt && ln -s real/f.txt /home/user/l1 && ' +
          'ln -s /home/user/l1 /home/user/l2 && ln -s /home/user/real /home/user/ldir && ' +
          'ln -s /nonexistent /home/user/dangling && ln -s /etc /home/user/etc-link'
      )
      const file = await sbx.files.getInfo('/home/user/l2')
      assert.equal(file.type, 'file')
      assert.equal(file.name, 'l2')
      assert.equal(file.path, '/home/user/l2')
      assert.equal(file.symlinkTarget, '/home/user/real/f.txt')
      assert.equal(file.mode, 0o600) // the target's
      assert.equal(file.permissions, 'Lrwxrwxrwx') // the link's own, as Go writes it
      const dir = await sbx.files.getInfo('/home/user/ldir')
      assert.equal(dir.type, 'dir')
      assert.equal(dir.symlinkTarget, '/home/user/real')
      // A link that does not resolve names itself and has no type, like envd's.
      const dangling = await sbx.files.getInfo('/home/user/dangling')
      assert.equal(dangling.symlinkTarget, '/home/user/dangling')
      assert.notEqual(dangling.type, 'file')
      assert.notEqual(dangling.type, 'dir')
      // Resolution stays inside the box: /etc is the box's.
      assert.equal((await sbx.files.getInfo('/home/user/etc-link')).symlinkTarget, '/etc')
      // A plain file has no symlinkTarget.
      assert.equal((await sbx.files.getInfo('/home/user/real/f.txt')).symlinkTarget, undefined)
    })
  })

  test(`${name}: an expired and a wrong URL signature get envd's two messages`, async () => {
    await withSandbox(sdk, {}, async (sbx) => {
      await sbx.files.write('/home/user/s.txt', 'signed')
      const ok = await sbx.downloadUrl('/home/user/s.txt', { useSignatureExpiration: 60 })
      assert.equal(await (await fetch(ok)).text(), 'signed')

      const expired = await fetch(await sbx.downloadUrl('/home/user/s.txt', { useSignatureExpiration: -60 }))
      assert.equal(expired.status, 401)
      assert.deepEqual(await expired.json(), { code: 401, message: 'signature is already expired' })

      const wrong = new URL(ok)
      wrong.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
      const bad = await fetch(wrong)
      assert.equal(bad.status, 401)
      assert.deepEqual(await bad.json(), { code: 401, message: 'invalid signature' })

      // An upload URL the same way.
      const up = new URL(await sbx.uploadUrl('/home/user/u.txt', { useSignatureExpiration: -60 }))
      const form = new FormData()
      form.append('file', new Blob(['x']), '/home/user/u.txt')
      const late = await fetch(up, { method: 'POST', body: form })
      assert.equal(late.status, 401)
      assert.equal((await late.json()).message, 'signature is already expired')
    })
  })

  test(`${name}: a command whose sandbox is killed ends as killed`, async () => {
    const sbx = await sdk.Sandbox.create()
    try {
      const handle = await sbx.commands.run('sleep 600', { background: true })
      const ended = handle.wait().then(
        () => null,
        (e) => e
      )
      await sbx.kill()
      const err = await ended
      assert.ok(err instanceof sdk.TimeoutError, `${err?.name}: ${err?.message}`)
      assert.match(err.message, /sandbox was killed/)
      assertNoHostPath(err.message)
    } finally {
      await sbx.kill().catch(() => {})
    }
  })
}
