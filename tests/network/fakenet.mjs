// The fake internet's servers (see fakenet.sh), run inside the "upstream" network namespace with
// Node's standard library only. Every DNS query and HTTP request is appended to DIR/dns.jsonl
// and DIR/http.jsonl before it is answered, so a test that got its answer can count what reached
// "the internet" (and a test that got NXDOMAIN from sbx can prove nothing did).
//
// usage: node fakenet.mjs DIR   (DIR holds ca.pem, server.pem, server.key; gets the logs)
import dgram from 'node:dgram'
import fs from 'node:fs'
import http from 'node:http'
import https from 'node:https'
import net from 'node:net'
import zlib from 'node:zlib'
import crypto from 'node:crypto'

const dir = process.argv[2]
const log = (file, entry) => fs.appendFileSync(`${dir}/${file}`, JSON.stringify(entry) + '\n')

// ---- Zone: name -> IPv4 address. "*.x" answers every name below x. ----
const zone = {
  'pypi.test': '198.18.1.10', // a Python package index (/simple/)
  '*.pypi.test': '198.18.1.11', // its file host (files.pypi.test)
  'registry.test': '198.18.1.20', // an npm registry
  'allowed.test': '198.18.1.30', // echoes requests (/headers)
  '*.allowed.test': '198.18.1.30',
  'denied.test': '198.18.2.10', // reachable, but no test policy allows it
  'exfil.test': '198.18.2.20', // what a DNS exfiltration would try to reach
  '*.exfil.test': '198.18.2.20',
  'private.test': '10.1.2.3', // an allowed name that resolves into a private range
  'loopback.test': '127.0.0.1',
  'metadata.test': '169.254.169.254',
}
// name -> IPv6 address (AAAA); a name in neither table is NXDOMAIN.
const zone6 = {
  'six.test': '2001:2:0:1::30', // IPv6 only: echoes requests as allowed.test does
}
function lookup(name, table = zone) {
  name = name.toLowerCase().replace(/\.$/, '')
  if (table[name]) return table[name]
  for (let i = name.indexOf('.'); i >= 0; i = name.indexOf('.', i + 1)) {
    const wild = table['*' + name.slice(i)]
    if (wild) return wild
  }
  return null
}

// The 16 bytes of an IPv6 address written with at most one '::'.
function v6Bytes(text) {
  const [head, tail] = text.includes('::') ? text.split('::') : [text, null]
  const groups = (s) => (s ? s.split(':').map((g) => parseInt(g, 16)) : [])
  const h = groups(head)
  const t = tail === null ? [] : groups(tail)
  const all = [...h, ...Array(8 - h.length - t.length).fill(0), ...t]
  const out = Buffer.alloc(16)
  all.forEach((g, i) => out.writeUInt16BE(g, 2 * i))
  return out
}

// ---- DNS (RFC 1035): one question, A, AAAA and TXT answered, the rest NXDOMAIN ----
function parseName(buf, off) {
  const labels = []
  for (let jumps = 0; jumps < 16; ) {
    const len = buf[off]
    if (len === undefined) throw new Error('short name')
    if (len === 0) return { name: labels.join('.'), end: off + 1 }
    if ((len & 0xc0) === 0xc0) throw new Error('compressed question') // never in a question
    labels.push(buf.subarray(off + 1, off + 1 + len).toString('latin1'))
    off += 1 + len
  }
  throw new Error('name too long')
}
function answer(query, proto) {
  const id = query.readUInt16BE(0)
  const { name, end } = parseName(query, 12)
  const qtype = query.readUInt16BE(end)
  const question = query.subarray(12, end + 4)
  log('dns.jsonl', { name, qtype, proto })
  const addr4 = lookup(name)
  const addr6 = lookup(name, zone6)
  const addr = addr4 || addr6
  const records = []
  if (addr4 && qtype === 1) {
    const rdata = Buffer.from(addr4.split('.').map(Number))
    records.push({ type: 1, rdata })
  } else if (addr6 && qtype === 28) {
    records.push({ type: 28, rdata: v6Bytes(addr6) })
  } else if (addr && qtype === 16) {
    const txt = Buffer.from('v=fake')
    records.push({ type: 16, rdata: Buffer.concat([Buffer.from([txt.length]), txt]) })
  }
  const rcode = addr ? 0 : 3
  const header = Buffer.alloc(12)
  header.writeUInt16BE(id, 0)
  header.writeUInt16BE(0x8180 | rcode, 2) // QR, RD, RA
  header.writeUInt16BE(1, 4)
  header.writeUInt16BE(records.length, 6)
  const rrs = records.map((r) => {
    const rr = Buffer.alloc(12)
    rr.writeUInt16BE(0xc00c, 0) // the question's name
    rr.writeUInt16BE(r.type, 2)
    rr.writeUInt16BE(1, 4)
    rr.writeUInt32BE(60, 6)
    rr.writeUInt16BE(r.rdata.length, 10)
    return Buffer.concat([rr, r.rdata])
  })
  return Buffer.concat([header, question, ...rrs])
}
const udp = dgram.createSocket('udp4')
udp.on('message', (msg, rinfo) => {
  try {
    udp.send(answer(msg, 'udp'), rinfo.port, rinfo.address)
  } catch (e) {
    log('dns.jsonl', { error: String(e), proto: 'udp' })
  }
})
const tcpDns = net.createServer((sock) => {
  let buf = Buffer.alloc(0)
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d])
    while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
      const msg = buf.subarray(2, 2 + buf.readUInt16BE(0))
      buf = buf.subarray(2 + msg.length)
      try {
        const a = answer(msg, 'tcp')
        const len = Buffer.alloc(2)
        len.writeUInt16BE(a.length)
        sock.write(Buffer.concat([len, a]))
      } catch (e) {
        sock.destroy()
      }
    }
  })
  sock.on('error', () => {})
})

// ---- Packages: one wheel for pip, one tarball for npm, made here ----
const crcTable = Array.from({ length: 256 }, (_, n) => {
  let c = n
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
  return c >>> 0
})
const crc32 = (b) => {
  let c = 0xffffffff
  for (const x of b) c = crcTable[(c ^ x) & 0xff] ^ (c >>> 8)
  return (c ^ 0xffffffff) >>> 0
}
function zip(files) {
  // Stored (uncompressed) entries: what a wheel needs.
  const locals = []
  const centrals = []
  let offset = 0
  for (const [name, text] of Object.entries(files)) {
    const data = Buffer.from(text)
    const fname = Buffer.from(name)
    const crc = crc32(data)
    const local = Buffer.alloc(30)
    local.writeUInt32LE(0x04034b50, 0)
    local.writeUInt16LE(20, 4)
    local.writeUInt32LE(crc, 14)
    local.writeUInt32LE(data.length, 18)
    local.writeUInt32LE(data.length, 22)
    local.writeUInt16LE(fname.length, 26)
    const central = Buffer.alloc(46)
    central.writeUInt32LE(0x02014b50, 0)
    central.writeUInt16LE(20, 4)
    central.writeUInt16LE(20, 6)
    central.writeUInt32LE(crc, 16)
    central.writeUInt32LE(data.length, 20)
    central.writeUInt32LE(data.length, 24)
    central.writeUInt16LE(fname.length, 28)
    central.writeUInt32LE(offset, 42)
    locals.push(local, fname, data)
    centrals.push(central, fname)
    offset += 30 + fname.length + data.length
  }
  const cd = Buffer.concat(centrals)
  const eocd = Buffer.alloc(22)
  eocd.writeUInt32LE(0x06054b50, 0)
  eocd.writeUInt16LE(Object.keys(files).length, 8)
  eocd.writeUInt16LE(Object.keys(files).length, 10)
  eocd.writeUInt32LE(cd.length, 12)
  eocd.writeUInt32LE(offset, 16)
  return Buffer.concat([...locals, cd, eocd])
}
function tgz(files) {
  const blocks = []
  for (const [name, text] of Object.entries(files)) {
    const data = Buffer.from(text)
    const h = Buffer.alloc(512)
    h.write(name, 0)
    h.write('0000644\0', 100)
    h.write('0000000\0', 108)
    h.write('0000000\0', 116)
    h.write(data.length.toString(8).padStart(11, '0') + '\0', 124)
    h.write('00000000000\0', 136)
    h.write('        ', 148)
    h.write('0', 156)
    h.write('ustar\0' + '00', 257)
    let sum = 0
    for (const x of h) sum += x
    h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148)
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512))
  }
  return zlib.gzipSync(Buffer.concat([...blocks, Buffer.alloc(1024)]))
}
const wheelName = 'sbxdemo-1.0-py3-none-any.whl'
const wheelFiles = {
  'sbxdemo/__init__.py': 'HELLO = "from the fake index"\n',
  'sbxdemo-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: sbxdemo\nVersion: 1.0\n',
  'sbxdemo-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: fakenet\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
}
const record = Object.entries(wheelFiles)
  .map(([n, t]) => {
    const h = crypto.createHash('sha256').update(t).digest('base64url')
    return `${n},sha256=${h},${Buffer.byteLength(t)}`
  })
  .join('\n')
wheelFiles['sbxdemo-1.0.dist-info/RECORD'] = record + '\nsbxdemo-1.0.dist-info/RECORD,,\n'
const wheel = zip(wheelFiles)
const wheelSha = crypto.createHash('sha256').update(wheel).digest('hex')
const npmTarball = tgz({
  'package/package.json': JSON.stringify({ name: 'sbxdemo', version: '1.0.0', main: 'index.js' }),
  'package/index.js': 'module.exports = "from the fake registry"\n',
})
const npmIntegrity = 'sha512-' + crypto.createHash('sha512').update(npmTarball).digest('base64')
const npmShasum = crypto.createHash('sha1').update(npmTarball).digest('hex')

// ---- HTTP and HTTPS: the same routes, chosen by Host ----
function handle(req, res, scheme) {
  const host = (req.headers.host || '').replace(/:\d+$/, '')
  log('http.jsonl', {
    scheme,
    host,
    sni: req.socket.servername || null,
    local: req.socket.localAddress.replace(/^::ffff:/, ''),
    method: req.method,
    url: req.url,
    headers: req.headers,
  })
  const send = (status, type, body) => {
    res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) })
    res.end(body)
  }
  if (req.url === '/headers')
    return send(200, 'application/json', JSON.stringify({ headers: req.headers, url: req.url }))
  if (req.url.startsWith('/headers?'))
    return send(200, 'application/json', JSON.stringify({ headers: req.headers, url: req.url }))
  if (host === 'pypi.test' && req.url.replace(/\/$/, '') === '/simple/sbxdemo')
    return send(
      200,
      'text/html',
      `<!DOCTYPE html><html><body><a href="${scheme}://files.pypi.test/packages/${wheelName}#sha256=${wheelSha}">${wheelName}</a></body></html>\n`,
    )
  if (host === 'files.pypi.test' && req.url === `/packages/${wheelName}`)
    return send(200, 'application/octet-stream', wheel)
  if (host === 'registry.test' && req.url === '/sbxdemo')
    return send(
      200,
      'application/json',
      JSON.stringify({
        name: 'sbxdemo',
        'dist-tags': { latest: '1.0.0' },
        versions: {
          '1.0.0': {
            name: 'sbxdemo',
            version: '1.0.0',
            dist: {
              tarball: `${scheme}://registry.test/sbxdemo/-/sbxdemo-1.0.0.tgz`,
              integrity: npmIntegrity,
              shasum: npmShasum,
            },
          },
        },
      }),
    )
  if (host === 'registry.test' && req.url === '/sbxdemo/-/sbxdemo-1.0.0.tgz')
    return send(200, 'application/octet-stream', npmTarball)
  if (req.url.startsWith('/bytes/')) {
    // /bytes/N: N bytes, for throughput.
    const n = Math.min(Number(req.url.slice(7)) || 0, 1 << 30)
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': n })
    const chunk = Buffer.alloc(1 << 16, 120)
    let left = n
    const pump = () => {
      while (left > 0) {
        const part = left >= chunk.length ? chunk : chunk.subarray(0, left)
        left -= part.length
        if (!res.write(part)) return res.once('drain', pump)
      }
      res.end()
    }
    return pump()
  }
  send(200, 'text/plain', `fake internet: ${host}${req.url}\n`)
}
const tls = { key: fs.readFileSync(`${dir}/server.key`), cert: fs.readFileSync(`${dir}/server.pem`) }
const plain = http.createServer((q, r) => handle(q, r, 'http'))
const secure = https.createServer(tls, (q, r) => handle(q, r, 'https'))
// Every TCP connection, before any byte of it is read: a test proves that none was made.
for (const [server, scheme] of [[plain, 'http'], [secure, 'https']])
  server.on('connection', (s) =>
    // (IPv4 peers of the dual-stack listeners are logged in their IPv4 form.)
    log('conn.jsonl', {
      scheme,
      local: s.localAddress.replace(/^::ffff:/, ''),
      from: s.remoteAddress.replace(/^::ffff:/, ''),
    }),
  )

// ---- UDP echo: what an explicit CIDR:port/udp rule lets through ----
const echo = dgram.createSocket('udp4')
echo.on('message', (msg, rinfo) => {
  log('http.jsonl', { scheme: 'udp', from: rinfo.address, bytes: msg.length })
  echo.send(msg, rinfo.port, rinfo.address)
})

const listening = (server, ...args) =>
  new Promise((resolve, reject) => {
    server.once('error', reject)
    if (server instanceof dgram.Socket) server.bind(...args, resolve)
    else server.listen(...args, resolve)
  })
await listening(udp, 53, '198.18.0.53')
await listening(tcpDns, 53, '198.18.0.53')
await listening(plain, 80, '::')
await listening(secure, 443, '::')
await listening(echo, 5000, '198.18.3.1')
fs.writeFileSync(`${dir}/fakenet.ready`, `${process.pid}\n`)
process.on('SIGTERM', () => process.exit(0))
