'use strict';
// Independent verification with sigstore-js (@sigstore/verify), fully offline.
//
//   node sigstore_js_verify.js JOBS.json
// JOBS.json: {"trusted_root": PATH, "jobs": [JOB, ...]} where JOB is
//   {"bundle": PATH, "artifact": PATH|null, "payload_file": PATH|null, "identity": STR, "issuer": STR}
//   or {"checksums": PATH} (every file listed in a SHA256SUMS file beside it must match).
// Prints one JSON line: {"results": [{"ok": bool, "error": str|null}, ...]}.
// A job without an artifact is a DSSE bundle: its envelope signature is verified, and
// with payload_file the envelope's payload must be exactly that file's bytes.
// Exit code 0 when every job verified, 1 otherwise, 2 on bad input.

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { bundleFromJSON } = require('@sigstore/bundle');
const { TrustedRoot } = require('@sigstore/protobuf-specs');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

function escapeRegExp(text) {
  return String(text).replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
}

function checkSums(file) {
  const dir = path.dirname(file);
  const text = fs.readFileSync(file, 'utf8');
  // As strict as the Python reader: one "HEX  NAME" line each, newline-terminated, no blank lines.
  if (!text.endsWith('\n')) return { ok: false, error: 'malformed: no final newline' };
  for (const line of text.slice(0, -1).split('\n')) {
    const m = /^([0-9a-f]{64})  ([A-Za-z0-9._+-]+)$/.exec(line);
    if (!m) return { ok: false, error: `malformed line: ${line}` };
    const file2 = path.join(dir, m[2]);
    if (!fs.existsSync(file2)) return { ok: false, error: `${m[2]}: missing` };
    const actual = crypto.createHash('sha256').update(fs.readFileSync(file2)).digest('hex');
    if (actual !== m[1]) return { ok: false, error: `${m[2]}: sha256 mismatch` };
  }
  return { ok: true, error: null };
}

function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const root = TrustedRoot.fromJSON(JSON.parse(fs.readFileSync(spec.trusted_root, 'utf8')));
  const verifier = new Verifier(toTrustMaterial(root), { tlogThreshold: 1, ctlogThreshold: 1, timestampThreshold: 1 });
  const results = spec.jobs.map((job) => {
    try {
      if (job.checksums) return checkSums(job.checksums);
      const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(job.bundle, 'utf8')));
      const artifact = job.artifact ? fs.readFileSync(job.artifact) : undefined;
      // @sigstore/verify matches subjectAlternativeName as an unanchored regular expression
      // ('.' any character, any suffix): the identity is escaped and anchored, and the signer it
      // returns is compared exactly as well.
      const signer = verifier.verify(toSignedEntity(bundle, artifact), {
        subjectAlternativeName: `^${escapeRegExp(job.identity)}$`,
        extensions: { issuer: job.issuer },
      });
      const signedAs = signer && signer.identity ? signer.identity.subjectAlternativeName : undefined;
      if (signedAs !== job.identity) {
        return { ok: false, error: `signed as ${signedAs}, not exactly ${job.identity}` };
      }
      if (job.payload_file) {
        const payload = bundle.content.dsseEnvelope?.payload;
        if (!payload || !Buffer.from(payload).equals(fs.readFileSync(job.payload_file))) {
          return { ok: false, error: `DSSE payload differs from ${path.basename(job.payload_file)}` };
        }
      }
      return { ok: true, error: null };
    } catch (e) {
      return { ok: false, error: `${e && e.name ? e.name : 'Error'}: ${e && e.message ? e.message : e}` };
    }
  });
  process.stdout.write(JSON.stringify({ results }) + '\n');
  process.exit(results.every((r) => r.ok) ? 0 : 1);
}

try {
  main();
} catch (e) {
  process.stderr.write(`sigstore-js verify: ${e && e.message ? e.message : e}\n`);
  process.exit(2);
}
