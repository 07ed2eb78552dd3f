'use strict';
// Independent verification with sigstore-js (@sigstore/verify), fully offline.
//
//   node sigstore_js_verify.js JOBS.json
// JOBS.json: {"trusted_root": PATH, "jobs": [JOB, ...]} where JOB is
//   {"bundle": PATH, "artifact": PATH|null, "payload_file": PATH|null, "identity": STR, "issuer": STR,
//    "workflow_repository": STR|null, "workflow_ref": STR|null}
//   or {"checksums": PATH} (every file listed in a SHA256SUMS file beside it must match).
// workflow_repository / workflow_ref: the caller of a reusable workflow, as Fulcio certifies it:
// both the GitHub workflow repository / ref extensions (1.3.6.1.4.1.57264.1.5 / .6, raw bytes)
// and the source repository URI / ref (.12 / .14, DER UTF8String) must be exactly these.
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

const GITHUB_SERVER = 'https://github.com';
const OID_WORKFLOW_REPOSITORY = '1.3.6.1.4.1.57264.1.5';
const OID_WORKFLOW_REF = '1.3.6.1.4.1.57264.1.6';
const OID_SOURCE_REPOSITORY_URI = '1.3.6.1.4.1.57264.1.12';
const OID_SOURCE_REPOSITORY_REF = '1.3.6.1.4.1.57264.1.14';

function derUtf8String(text) {
  const body = Buffer.from(String(text), 'utf8');
  let length;
  if (body.length < 0x80) {
    length = Buffer.from([body.length]);
  } else {
    const bytes = [];
    for (let n = body.length; n > 0; n = Math.floor(n / 256)) bytes.unshift(n % 256);
    length = Buffer.from([0x80 | bytes.length, ...bytes]);
  }
  return Buffer.concat([Buffer.from([0x0c]), length, body]);
}

function extension(oid, value) {
  return { oid: { id: oid.split('.').map(Number) }, value };
}

// The extensions a reusable workflow's caller must appear in (each compared byte for byte by
// @sigstore/verify's policy: an absent or different extension is an UNTRUSTED_SIGNER_ERROR).
function callerExtensions(job) {
  const oids = [];
  if (job.workflow_repository) {
    oids.push(extension(OID_WORKFLOW_REPOSITORY, Buffer.from(job.workflow_repository, 'utf8')));
    oids.push(extension(OID_SOURCE_REPOSITORY_URI, derUtf8String(`${GITHUB_SERVER}/${job.workflow_repository}`)));
  }
  if (job.workflow_ref) {
    oids.push(extension(OID_WORKFLOW_REF, Buffer.from(job.workflow_ref, 'utf8')));
    oids.push(extension(OID_SOURCE_REPOSITORY_REF, derUtf8String(job.workflow_ref)));
  }
  return oids;
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
      const oids = callerExtensions(job);
      const signer = verifier.verify(toSignedEntity(bundle, artifact), {
        subjectAlternativeName: `^${escapeRegExp(job.identity)}$`,
        extensions: { issuer: job.issuer },
        ...(oids.length ? { oids } : {}),
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
