// Fetch ipfs://CID[/PATH] through a trustless gateway with @helia/verified-fetch (the JS reference
// client, which verifies every block) and write the body to OUT.
// Usage: node verified_fetch.mjs GATEWAY_URL CID PATH OUT [ACCEPT]
// Prints one JSON line: {"status": N, "contentType": "...", "bytes": N}. Exits non-zero on error.
import { writeFile } from 'node:fs/promises'

// Node 20 lacks Promise.withResolvers (Node 22), which the helia stack uses.
Promise.withResolvers ??= function () {
  let resolve, reject
  const promise = new Promise((res, rej) => { resolve = res; reject = rej })
  return { promise, resolve, reject }
}
const { createVerifiedFetchWithHelia } = await import('@helia/verified-fetch')
const { createHeliaLight } = await import('helia')
const { fallbackRouter } = await import('@helia/fallback-router')
const { trustlessGatewayBlockBroker } = await import('@helia/trustless-gateway-client')
const dagCbor = await import('@ipld/dag-cbor')

const [gateway, cid, path, out, accept] = process.argv.slice(2)
// HTTP only: no libp2p, no delegated routing; the one gateway is the only provider.
// The gateway as the one (non-fallback) provider of every CID.
const fallback = fallbackRouter({ gateways: [gateway], shuffle: false })
const router = { name: 'cnode-test-gateway', findProviders: (cid, o) => fallback.findProviders(cid, o) }
const helia = await createHeliaLight({
  routers: [router],
  codecs: [dagCbor],
  blockBrokers: [trustlessGatewayBlockBroker({ allowLocal: true, allowInsecure: true })]
})
await helia.start()
const verifiedFetch = await createVerifiedFetchWithHelia(helia)
try {
  const url = path ? `ipfs://${cid}/${path}` : `ipfs://${cid}`
  const headers = accept ? { accept } : {}
  const response = await verifiedFetch(url, { headers, signal: AbortSignal.timeout(60000) })
  const body = Buffer.from(await response.arrayBuffer())
  await writeFile(out, body)
  console.log(JSON.stringify({
    status: response.status,
    contentType: response.headers.get('content-type'),
    bytes: body.length
  }))
} finally {
  await verifiedFetch.stop()
  await helia.stop()
}
