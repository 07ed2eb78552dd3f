'use strict';
// Independent verification with sigstore-js (@sigstore/verify), fully offline.
//
//   node sigstore_js_verify.js JOBS.json
// JOBS.json: {"trusted_root": PATH, "jobs": [{"bundle": PATH, "artifact": PATH|null,
//             "identity": STR, "issuer": STR}, ...]}
// Prints one JSON line: {"results": [{"ok": bool, "error": str|null}, ...]}.
// A job without an artifact is a DSSE bundle: its envelope signature is verified.
// Exit code 0 when every job verified, 1 otherwise, 2 on bad input.

const fs = require('fs');
const { bundleFromJSON } = require('@sigstore/bundle');
const { TrustedRoot } = require('@sigstore/protobuf-specs');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const root = TrustedRoot.fromJSON(JSON.parse(fs.readFileSync(spec.trusted_root, 'utf8')));
  const verifier = new Verifier(toTrustMaterial(root), { tlogThreshold: 1, ctlogThreshold: 1, timestampThreshold: 1 });
  const results = spec.jobs.map((job) => {
    try {
      const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(job.bundle, 'utf8')));
      const artifact = job.artifact ? fs.readFileSync(job.artifact) : undefined;
      verifier.verify(toSignedEntity(bundle, artifact), {
        subjectAlternativeName: job.identity,
        extensions: { issuer: job.issuer },
      });
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
