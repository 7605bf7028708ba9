// Generates tests/storage/cid_vectors.json with an independent implementation of
// `ipfs add --cid-version=1` (the JS UnixFS importer used by Helia), so that our
// Python CID code (src/aitbc/storage/cid.py) is checked against someone else's.
//
// NOT run by the test suite (the tests need no node). How it was run:
//
//   mkdir /tmp/cidgen && cd /tmp/cidgen && npm init -y
//   npm install ipfs-unixfs-importer@17.1.1 blockstore-core@7.0.1
//   cp /work/main/tests/storage/gen_cid_vectors.mjs . && node gen_cid_vectors.mjs \
//       > /work/main/tests/storage/cid_vectors.json
//
// with node v20.20.2; resolved: ipfs-unixfs 13.1.1, @ipld/dag-pb 4.2.0,
// multiformats 14.0.5.
//
// Options are kubo's defaults for --cid-version=1, spelled out rather than trusted:
// raw leaves, fixed 262144-byte chunks, balanced layout with at most 174 links per node,
// a single-chunk file reduced to its raw leaf, no mtime/mode metadata.
//
// Content pattern "p31": byte i = (i*31 + (i >> 8) + (i >> 18) * 101) & 0xff. The
// (i >> 18) term makes every 262144-byte chunk different, so a tree that reorders or
// repeats chunks gets a different CID. tests/storage/conftest.py computes the same bytes.
import { createHash } from 'node:crypto'
import { importer } from 'ipfs-unixfs-importer'
import { fixedSize } from 'ipfs-unixfs-importer/chunker'
import { balanced } from 'ipfs-unixfs-importer/layout'
import { MemoryBlockstore } from 'blockstore-core/memory'

const CHUNK = 262144
const MAX_LINKS = 174

function patternByte (i) {
  // Numbers stay below 2^53 for every size used here, so plain arithmetic is exact.
  return (i * 31 + Math.floor(i / 256) + Math.floor(i / CHUNK) * 101) & 0xff
}

// Yields the pattern in odd-sized pieces, so the chunker (not our piece size) sets blocks.
function * pattern (size, piece = 100003) {
  for (let start = 0; start < size; start += piece) {
    const n = Math.min(piece, size - start)
    const buf = new Uint8Array(n)
    for (let j = 0; j < n; j++) buf[j] = patternByte(start + j)
    yield buf
  }
}

function sha256Hex (size) {
  const h = createHash('sha256')
  for (const buf of pattern(size)) h.update(buf)
  return h.digest('hex')
}

async function cidOf (size, chunkSize = CHUNK, maxLinks = MAX_LINKS) {
  const entries = []
  const source = [{ content: pattern(size) }]
  for await (const entry of importer(source, new MemoryBlockstore(), {
    cidVersion: 1,
    rawLeaves: true,
    chunker: fixedSize({ chunkSize }),
    layout: balanced({ maxChildrenPerNode: maxLinks }),
    reduceSingleLeafToSelf: true,
    wrapWithDirectory: false
  })) {
    entries.push(entry)
  }
  if (entries.length !== 1) throw new Error(`expected one entry, got ${entries.length}`)
  return entries[0].cid.toString()
}

const sizes = [
  ['empty', 0],
  ['one byte', 1],
  ['under one chunk', 12],
  ['exactly one chunk', CHUNK],
  ['one chunk plus one byte', CHUNK + 1],
  ['irregular 1000000', 1000000],
  ['five chunks plus 7', 5 * CHUNK + 7],
  ['exactly 174 chunks (one full node)', MAX_LINKS * CHUNK],
  ['174 chunks plus one byte (two levels)', MAX_LINKS * CHUNK + 1],
  ['200 chunks plus 12345 (two levels)', 200 * CHUNK + 12345]
]

// Literal contents, for the vectors people recognise.
async function cidOfBytes (bytes) {
  const out = []
  for await (const e of importer([{ content: bytes }], new MemoryBlockstore(), {
    cidVersion: 1, rawLeaves: true, chunker: fixedSize({ chunkSize: CHUNK }),
    layout: balanced({ maxChildrenPerNode: MAX_LINKS }), reduceSingleLeafToSelf: true
  })) out.push(e)
  return out[0].cid.toString()
}

// Deep trees with kubo's parameters need more than 174*174 chunks (7.9 GB), so the
// tree-building logic for three and more levels is checked with tiny parameters.
const small = [
  ['tiny: 2 chunks', 2 * 1024, 1024, 4],
  ['tiny: exactly 4 chunks (one full node)', 4 * 1024, 1024, 4],
  ['tiny: 5 chunks (two levels)', 5 * 1024, 1024, 4],
  ['tiny: exactly 16 chunks (two full levels)', 16 * 1024, 1024, 4],
  ['tiny: 17 chunks (three levels)', 16 * 1024 + 1, 1024, 4],
  ['tiny: 70 chunks plus 3 (four levels)', 69 * 1024 + 3, 1024, 4],
  ['tiny: 3 links, 30 chunks minus 1', 30 * 1000 - 1, 1000, 3]
]

const vectors = []
for (const [name, size] of sizes) {
  vectors.push({
    name, pattern: 'p31', size, chunk_size: CHUNK, max_links: MAX_LINKS,
    sha256: sha256Hex(size), cid: await cidOf(size)
  })
}
for (const [name, size, chunkSize, maxLinks] of small) {
  vectors.push({
    name, pattern: 'p31', size, chunk_size: chunkSize, max_links: maxLinks,
    sha256: sha256Hex(size), cid: await cidOf(size, chunkSize, maxLinks)
  })
}
for (const [name, text] of [['literal a', 'a'], ['literal hello world', 'hello world\n']]) {
  const bytes = new TextEncoder().encode(text)
  vectors.push({
    name,
    pattern: 'literal',
    literal: text,
    size: bytes.length,
    chunk_size: CHUNK,
    max_links: MAX_LINKS,
    sha256: createHash('sha256').update(bytes).digest('hex'),
    cid: await cidOfBytes(bytes)
  })
}

process.stdout.write(JSON.stringify({
  generator: 'tests/storage/gen_cid_vectors.mjs',
  implementation: 'ipfs-unixfs-importer@17.1.1 (ipfs-unixfs@13.1.1, @ipld/dag-pb@4.2.0, multiformats@14.0.5), node v20.20.2',
  options: { cidVersion: 1, rawLeaves: true, chunkSize: CHUNK, layout: 'balanced', maxChildrenPerNode: MAX_LINKS },
  pattern_p31: 'byte i = (i*31 + (i >> 8) + (i >> 18) * 101) & 0xff',
  vectors
}, null, 2) + '\n')
