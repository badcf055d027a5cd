// Unpack a UnixFS directory from a CAR with the JS reference tools (@ipld/car, ipfs-unixfs-exporter).
// Usage: node unpack.mjs FILE.car DIR_CID OUT_DIR
// Prints one JSON line: {"files": {name: size}, "blocks": N}. Exits non-zero on any error.
import { CarReader } from '@ipld/car'
import { exporter } from 'ipfs-unixfs-exporter'
import { CID } from 'multiformats/cid'
import { sha256 } from 'multiformats/hashes/sha2'
import { readFile, writeFile, mkdir } from 'node:fs/promises'
import { join } from 'node:path'

const [carPath, dirCid, outDir] = process.argv.slice(2)
const reader = await CarReader.fromBytes(await readFile(carPath))
const blocks = new Map()
for await (const { cid, bytes } of reader.blocks()) {
  // Verify every block against its CID (the exporter trusts its blockstore).
  const digest = await sha256.digest(bytes)
  if (!equal(digest.digest, cid.multihash.digest)) throw new Error(`block ${cid} does not match its CID`)
  blocks.set(cid.toString(), bytes)
}
const blockstore = {
  * get (cid) {
    const bytes = blocks.get(cid.toString())
    if (bytes === undefined) throw new Error(`block ${cid} is not in the CAR`)
    yield bytes
  }
}
const dir = await exporter(CID.parse(dirCid), blockstore)
if (dir.type !== 'directory') throw new Error(`${dirCid} is a ${dir.type}, not a directory`)
await mkdir(outDir, { recursive: true })
const files = {}
for await (const link of dir.entries()) {
  const entry = await exporter(link.cid, blockstore)
  if (entry.type !== 'file' && entry.type !== 'raw') throw new Error(`${entry.name} is a ${entry.type}`)
  const parts = []
  for await (const chunk of entry.content()) parts.push(chunk)
  const data = Buffer.concat(parts)
  await writeFile(join(outDir, link.name), data)
  files[link.name] = data.length
}
console.log(JSON.stringify({ files, blocks: blocks.size }))

function equal (a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i])
}
