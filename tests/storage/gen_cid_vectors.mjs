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

// --- folders ---------------------------------------------------------------------------
//
//   node gen_cid_vectors.mjs --folders > /work/main/tests/storage/folder_vectors.json
//
// Folders as `ipfs add -r --cid-version=1` stores them: UnixFS directories (dag-pb, links
// sorted by name), sharded as a HAMT (fanout 256, murmur3-x64-64 of the name) once the
// directory's estimate (sum of link name bytes + CID bytes, kubo's and this importer's
// "links-bytes" rule) passes 262144 bytes. Each vector lists its files (path and size)
// and empty folders; a `generated` entry adds `count` files named
// pad4(i) + "-" + "x" * name_pad (plus `suffix`), of i % 50 bytes, under `dir`.
// File content: the UTF-8 bytes of (path + "\n") repeated, cut to the size. Both sides
// compute the same listing (tests/storage/test_unixfs.py), so the JSON stays small.
function contentOf (path, size) {
  const unit = new TextEncoder().encode(path + '\n')
  const out = new Uint8Array(size)
  for (let i = 0; i < size; i++) out[i] = unit[i % unit.length]
  return out
}

function generated (g) {
  const files = []
  for (let i = 0; i < g.count; i++) {
    const name = String(i).padStart(4, '0') + '-' + 'x'.repeat(g.name_pad) + (i === 0 ? (g.first_extra ?? '') : '') + (g.suffix ?? '')
    files.push([g.dir === '' ? name : `${g.dir}/${name}`, i % 50])
  }
  return files
}

function listing (spec) {
  let files = [...(spec.files ?? [])]
  for (const g of spec.generated ?? []) files = files.concat(generated(g))
  return files
}

async function folderCid (root, spec) {
  const source = []
  for (const [path, size] of listing(spec)) {
    source.push({ path: `${root}/${path}`, content: contentOf(path, size) })
  }
  for (const dir of spec.empty_dirs ?? []) source.push({ path: `${root}/${dir}` })
  if (source.length === 0) source.push({ path: root })
  let rootCid = null
  for await (const entry of importer(source, new MemoryBlockstore(), {
    cidVersion: 1,
    rawLeaves: true,
    chunker: fixedSize({ chunkSize: CHUNK }),
    layout: balanced({ maxChildrenPerNode: MAX_LINKS }),
    reduceSingleLeafToSelf: true,
    wrapWithDirectory: false,
    shardSplitThresholdBytes: 262144,
    shardSplitStrategy: 'links-bytes',
    shardFanoutBits: 8
  })) {
    if (entry.path === root) rootCid = entry.cid.toString()
  }
  if (rootCid == null) throw new Error(`no root entry for ${root}`)
  return rootCid
}

const folders = [
  {
    name: 'nested folders, an empty folder, an empty file, a file of three chunks',
    files: [['a.txt', 12], ['b/c.txt', 100], ['b/d/e.txt', 3], ['b/d/zero', 0], ['big.bin', 2 * CHUNK + 1000], ['Z.md', 5]],
    empty_dirs: ['empty', 'b/d/also-empty']
  },
  { name: 'an empty folder', files: [], empty_dirs: [] },
  { name: 'only an empty subfolder', files: [], empty_dirs: ['inner'] },
  {
    name: 'unicode names (sorted by UTF-8 bytes)',
    files: [
      ['naïve.txt', 40], ['Ünïcödé/データ.txt', 77], ['Ünïcödé/z', 1], ['emoji 🎉.txt', 9],
      ['résumé.md', 20], ['a b c.txt', 4], ['Zebra', 2], ['zebra', 3], ['日本語/中文/한국어.txt', 30]
    ],
    empty_dirs: ['空のフォルダ']
  },
  {
    // 1024 names of 220 bytes: 1024 x (220 + 36) = 262144, exactly the threshold.
    name: 'exactly at the sharding threshold (stays a basic directory)',
    generated: [{ dir: '', count: 1024, name_pad: 215 }]
  },
  {
    name: 'one byte over the sharding threshold (a HAMT)',
    generated: [{ dir: '', count: 1024, name_pad: 215, first_extra: 'y' }]
  },
  {
    // Sub-shards (slots shared by several names), unicode names hashed, a folder inside
    // a HAMT, and a HAMT inside a basic directory.
    name: 'many entries: a HAMT with sub-shards inside a basic folder',
    files: [['readme.txt', 10], ['many/ünï-🎉.txt', 11], ['many/inner/x.txt', 5]],
    generated: [{ dir: 'many', count: 1500, name_pad: 200 }, { dir: 'many', count: 300, name_pad: 20, suffix: '-ü' }]
  }
]

if (process.argv.includes('--folders')) {
  const out = []
  for (const spec of folders) {
    out.push({ ...spec, cid: await folderCid('root', spec) })
  }
  process.stdout.write(JSON.stringify({
    generator: 'tests/storage/gen_cid_vectors.mjs --folders',
    implementation: 'ipfs-unixfs-importer@17.1.1 (ipfs-unixfs@13.1.1, @ipld/dag-pb@4.2.0, hamt-sharding, @multiformats/murmur3), node v20.20.2',
    options: {
      cidVersion: 1, rawLeaves: true, chunkSize: CHUNK, maxChildrenPerNode: MAX_LINKS,
      shardSplitThresholdBytes: 262144, shardSplitStrategy: 'links-bytes', shardFanoutBits: 8
    },
    content: 'file bytes: UTF-8 of (path + "\\n") repeated, cut to size',
    vectors: out
  }, null, 2) + '\n')
  process.exit(0)
}

if (!process.argv.includes('--folders')) {
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
}
