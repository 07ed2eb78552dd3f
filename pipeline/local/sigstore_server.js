'use strict';
// A private Sigstore instance on 127.0.0.1 for local releases and tests.
//
// Built from @sigstore/mock (sigstore-js's own test doubles): its CA (with CT log)
// issues Fulcio certificates and its TSA answers RFC 3161 requests. This server adds
// what the mock leaves to its callers, so that unmodified sigstore-python, sigstore-js
// and cosign clients can sign and verify against it:
//   * an OIDC issuer that mints ES256 identity tokens, and a Fulcio front that VERIFIES
//     them (signature, issuer, audience, expiry) and the CSR's proof of possession;
//   * two append-only transparency logs (Rekor v1 and Rekor v2 APIs) over real RFC 6962
//     Merkle trees, with the entry bodies real Rekor would store (the mock logs the raw
//     request), signed checkpoints and inclusion proofs, and v1 signed entry timestamps;
//   * a DER RFC 3161 front for the mock TSA (the mock expects JSON), with whole-second
//     times and the client's nonce kept exactly;
//   * trusted_root.json and client trust configs (one per Rekor API version).
//
// Usage: node server.js --state DIR [--port N]
// Writes DIR/instance.json (atomically) once it listens; exits on SIGTERM/SIGINT.

const crypto = require('crypto');
const fs = require('fs');
const http = require('http');
const path = require('path');

require('reflect-metadata');
const asn1js = require('asn1js');
const canonicalize = require('canonicalize');
const jose = require('jose');
const pkijs = require('pkijs');
const x509 = require('@peculiar/x509');
const mock = require('@sigstore/mock');

const LOCAL_ISSUER = 'https://oidc.benchseal.invalid';
const LOCAL_IDENTITY = 'https://benchseal.invalid/signers/local';
// GitHub-shaped identities: the same issuer string and certificate contents that public-good
// Fulcio gives a GitHub Actions job, valid only under this instance's trusted root.
const GITHUB_ISSUER = 'https://token.actions.githubusercontent.com';
const GITHUB_REQUIRED_CLAIMS = ['repository', 'ref', 'sha', 'job_workflow_ref', 'workflow_ref', 'event_name', 'runner_environment'];
const AUDIENCE = 'sigstore';
const SESSION_TTL_MS = 6 * 3600 * 1000;
const MAX_BODY = 4 * 1024 * 1024;

function args(argv) {
  const out = { port: 0, state: null };
  for (let i = 2; i < argv.length; i += 2) {
    if (argv[i] === '--state') out.state = argv[i + 1];
    else if (argv[i] === '--port') out.port = Number(argv[i + 1]);
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  if (!out.state) throw new Error('--state DIR is required');
  return out;
}

function wholeSecondNow() {
  return new Date(Math.floor(Date.now() / 1000) * 1000);
}

function writeAtomic(file, text) {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, text, { mode: 0o644 });
  fs.renameSync(tmp, file);
}

function ecKeyPair() {
  return crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
}

function spkiDer(publicKey) {
  return publicKey.export({ format: 'der', type: 'spki' });
}

function sha256(...parts) {
  const h = crypto.createHash('sha256');
  for (const p of parts) h.update(p);
  return h.digest();
}

// --- RFC 6962 Merkle tree ---------------------------------------------------------
class MerkleLog {
  // ``treeId``: a Rekor v1 log's checkpoint names its tree after the log ("<log> - <tree id>", as
  // rekor.sigstore.dev's do). sigstore-go (inside gh) tells a v1 checkpoint from a v2 one by that
  // suffix alone and verifies a checkpoint without it as Rekor v2's (origin = the log's host name):
  // without it, `gh attestation verify` refused every entry that cosign and sigstore-python accept.
  constructor(name, origin, keyPair, { treeId = false } = {}) {
    this.name = name;
    this.privateKey = keyPair.privateKey;
    this.publicDer = spkiDer(keyPair.publicKey);
    this.logId = sha256(this.publicDer);
    this.signer = origin;
    // The tree id: the log id's first 8 bytes as a positive 63-bit integer (stable for one key); entry
    // IDs start with it as 16 hex digits (Rekor's sharding.TreeIDHexStringLen).
    const tree = this.logId.readBigUInt64BE(0) & 0x7fffffffffffffffn;
    this.treeIdHex = tree.toString(16).padStart(16, '0');
    this.origin = treeId ? `${origin} - ${tree}` : origin;
    this.leaves = [];
    // Some verifiers (sigstore-go) treat log index 0 as "unset": start the log with a
    // genesis leaf so every client entry has an index >= 1.
    this.append(Buffer.from(canonicalize({ genesis: name, origin, at: new Date().toISOString() })));
  }

  append(body) {
    this.leaves.push(sha256(Buffer.from([0]), body));
    return this.leaves.length - 1;
  }

  root(lo, hi) {
    const n = hi - lo;
    if (n === 1) return this.leaves[lo];
    const k = largestPowerOfTwoBelow(n);
    return sha256(Buffer.from([1]), this.root(lo, lo + k), this.root(lo + k, hi));
  }

  // PATH(m, D[lo:hi]) from RFC 6962 2.1.1, leaf to root.
  path(m, lo, hi) {
    const n = hi - lo;
    if (n === 1) return [];
    const k = largestPowerOfTwoBelow(n);
    if (m < k) return [...this.path(m, lo, lo + k), this.root(lo + k, hi)];
    return [...this.path(m - k, lo + k, hi), this.root(lo, lo + k)];
  }

  proof(index) {
    const size = this.leaves.length;
    const rootHash = this.root(0, size);
    return { index, size, rootHash, hashes: this.path(index, 0, size), checkpoint: this.checkpoint(size, rootHash) };
  }

  checkpoint(size, rootHash) {
    const note = `${this.origin}\n${size}\n${rootHash.toString('base64')}\n`;
    const sig = crypto.sign('sha256', Buffer.from(note), this.privateKey);
    const hintAndSig = Buffer.concat([this.logId.subarray(0, 4), sig]);
    return `${note}\n\u2014 ${this.signer} ${hintAndSig.toString('base64')}\n`;
  }
}

function largestPowerOfTwoBelow(n) {
  let k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}

// --- Rekor v1 -------------------------------------------------------------------
// Rekor v1 stores, for hashedrekord, the canonicalized proposed entry; for dsse it
// stores hashes of the envelope and payload plus the signatures, not the envelope.
function rekorV1Body(proposed) {
  if (proposed.kind === 'hashedrekord' && proposed.apiVersion === '0.0.1') {
    const spec = proposed.spec;
    if (!spec?.signature?.content || !spec?.signature?.publicKey?.content || !spec?.data?.hash?.value) {
      throw new Error('hashedrekord: missing signature, public key or data hash');
    }
    return { apiVersion: '0.0.1', kind: 'hashedrekord', spec };
  }
  if (proposed.kind === 'dsse' && proposed.apiVersion === '0.0.1') {
    const content = proposed.spec?.proposedContent;
    if (!content?.envelope || !Array.isArray(content.verifiers) || content.verifiers.length === 0) {
      throw new Error('dsse: missing envelope or verifiers');
    }
    const envelope = JSON.parse(content.envelope);
    const payload = Buffer.from(envelope.payload, 'base64');
    return {
      apiVersion: '0.0.1',
      kind: 'dsse',
      spec: {
        envelopeHash: { algorithm: 'sha256', value: sha256(Buffer.from(content.envelope)).toString('hex') },
        payloadHash: { algorithm: 'sha256', value: sha256(payload).toString('hex') },
        signatures: envelope.signatures.map((s) => ({ signature: s.sig, verifier: content.verifiers[0] })),
      },
    };
  }
  throw new Error(`unsupported entry kind ${proposed.kind}/${proposed.apiVersion}`);
}

// The answer is what real Rekor's createLogEntry gives: 201, the entry keyed by its entry ID (the
// tree id as 16 hex digits, then the leaf hash), and that ID again as the ETag header and at the end
// of the Location header. sigstore-go (cosign 3's signer) reads the entry as payload[ETag]: without
// the header it read a nil entry and cosign panicked.
function rekorV1Entry(log, tlog, proposed, requestPath) {
  const body = Buffer.from(canonicalize(rekorV1Body(proposed)));
  const index = log.append(body);
  const integratedTime = Math.floor(Date.now() / 1000);
  const logID = log.logId;
  // The mock TLog signs the SET exactly as Rekor does; its key is this log's key.
  const set = tlog.calculateSET({ body, timestamp: integratedTime, logIndex: index, logID });
  const proof = log.proof(index);
  const entryId = log.treeIdHex + sha256(Buffer.from([0]), body).toString('hex');
  const entry = {
    [entryId]: {
      body: body.toString('base64'),
      integratedTime,
      logID: logID.toString('hex'),
      logIndex: index,
      verification: {
        inclusionProof: {
          logIndex: index,
          treeSize: proof.size,
          rootHash: proof.rootHash.toString('hex'),
          hashes: proof.hashes.map((h) => h.toString('hex')),
          checkpoint: proof.checkpoint,
        },
        signedEntryTimestamp: set.toString('base64'),
      },
    },
  };
  return {
    statusCode: 201,
    contentType: 'application/json',
    headers: { ETag: entryId, Location: `${requestPath}/${entryId}` },
    response: JSON.stringify(entry),
  };
}

// --- Rekor v2 -------------------------------------------------------------------
// The client sends a CreateEntryRequest; the log stores the Entry built from it.
function rekorV2Body(request) {
  const hr = request.hashedRekordRequestV002;
  if (hr) {
    if (!hr.digest || !hr.signature?.content || !hr.signature?.verifier) {
      throw new Error('hashedRekordRequestV002: missing digest, signature or verifier');
    }
    if (Buffer.from(hr.digest, 'base64').length !== 32) throw new Error('digest must be a SHA-256 digest');
    return {
      kind: 'hashedrekord',
      apiVersion: '0.0.2',
      spec: {
        hashedRekordV002: {
          data: { algorithm: 'SHA2_256', digest: hr.digest },
          signature: hr.signature,
        },
      },
    };
  }
  const dr = request.dsseRequestV002;
  if (dr) {
    const env = dr.envelope;
    if (!env?.payload || !Array.isArray(env.signatures) || !Array.isArray(dr.verifiers)) {
      throw new Error('dsseRequestV002: missing envelope or verifiers');
    }
    return {
      kind: 'dsse',
      apiVersion: '0.0.2',
      spec: {
        dsseV002: {
          payloadHash: { algorithm: 'SHA2_256', digest: sha256(Buffer.from(env.payload, 'base64')).toString('base64') },
          signatures: env.signatures.map((s) => ({ content: s.sig, verifier: dr.verifiers[0] })),
        },
      },
    };
  }
  throw new Error('unsupported Rekor v2 request');
}

function rekorV2Entry(log, request) {
  const entry = rekorV2Body(request);
  const body = Buffer.from(canonicalize(entry));
  const index = log.append(body);
  const proof = log.proof(index);
  return {
    logIndex: String(index),
    logId: { keyId: log.logId.toString('base64') },
    kindVersion: { kind: entry.kind, version: entry.apiVersion },
    integratedTime: '0',
    inclusionProof: {
      logIndex: String(index),
      rootHash: proof.rootHash.toString('base64'),
      treeSize: String(proof.size),
      hashes: proof.hashes.map((h) => h.toString('base64')),
      checkpoint: { envelope: proof.checkpoint },
    },
    canonicalizedBody: body.toString('base64'),
  };
}

// --- TSA ------------------------------------------------------------------------
function patchTsa(tsa) {
  // Whole seconds: sigstore-js rejects fractional seconds other than 3 digits.
  tsa.getCurrentTime = wholeSecondNow;
  // The mock builds the nonce from a JS number; clients send 64-bit nonces. Keep the
  // request's INTEGER as is.
  const tstInfo = tsa.tstInfo.bind(tsa);
  tsa.tstInfo = (req) => {
    const info = tstInfo({ ...req, nonce: 0 });
    info.nonce = req.nonceInteger;
    if (!req.nonceInteger) delete info.nonce;
    return info;
  };
}

async function timestamp(tsa, der) {
  const asn = asn1js.fromBER(new Uint8Array(der).buffer);
  if (asn.offset === -1) throw new Error('TimeStampReq is not DER');
  const req = new pkijs.TimeStampReq({ schema: asn.result });
  const hashed = Buffer.from(req.messageImprint.hashedMessage.valueBlock.valueHexView);
  return tsa.timestamp({
    artifactHash: hashed,
    hashAlgorithmOID: req.messageImprint.hashAlgorithm.algorithmId,
    nonce: 0,
    nonceInteger: req.nonce,
    policyOID: req.reqPolicy || '1.3.6.1.4.1.57264.2',
    certReq: req.certReq ?? false,
  });
}

// --- Fulcio front ---------------------------------------------------------------
// Fulcio's v2 API (sigstore-python, sigstore-js, cosign 3 through sigstore-go). Real Fulcio answers
// it 200 (only the legacy v1 route sets 201), and sigstore-go accepts nothing else. A public key
// must come with its proof of possession: a signature over the token's subject, as Fulcio checks
// it (``proven``: the v1 front checked its own form of it already).
async function signingCert(ctx, headers, text, { proven = false } = {}) {
  const auth = headers.authorization || '';
  const match = /^Bearer (\S+)$/.exec(auth);
  const json = JSON.parse(text);
  const token = match ? match[1] : json.credentials?.oidcIdentityToken;
  if (!token) return { statusCode: 401, response: JSON.stringify({ message: 'missing bearer token' }) };
  let claims;
  try {
    ({ payload: claims } = await jose.jwtVerify(token, ctx.oidcPublicKey, {
      issuer: [LOCAL_ISSUER, GITHUB_ISSUER], audience: AUDIENCE, algorithms: ['ES256'],
    }));
  } catch (e) {
    return { statusCode: 401, response: JSON.stringify({ message: `identity token rejected: ${e.message}` }) };
  }
  let san;
  try {
    san = subjectAltName(claims);
  } catch (e) {
    return { statusCode: 400, response: JSON.stringify({ message: `identity token rejected: ${e.message}` }) };
  }
  let pem;
  if (json.certificateSigningRequest) {
    // sigstore-python sends base64(PEM); the mock expects the PEM itself.
    const raw = Buffer.from(json.certificateSigningRequest, 'base64').toString('utf8');
    pem = raw.includes('BEGIN') ? raw : json.certificateSigningRequest;
    const csr = new x509.Pkcs10CertificateRequest(pem);
    if (!(await csr.verify())) {
      return { statusCode: 400, response: JSON.stringify({ message: 'CSR signature (proof of possession) is invalid' }) };
    }
  } else if (!proven) {
    const problem = possessionProblem(json.publicKeyRequest, claims.sub);
    if (problem) return { statusCode: 400, response: JSON.stringify({ message: problem }) };
  }
  // The mock CA reads (does not verify) the token it is given: hand it the verified claims
  // plus the certificate SAN, so it writes the Fulcio extensions (OIDs 1.3.6.1.4.1.57264.1.*)
  // that public-good Fulcio derives from the same claims.
  // A test job may ask for a certificate without some claims' extensions (a certificate a
  // verifier must refuse): the claims are still required and signed, only not certified.
  const certified = { ...claims };
  for (const name of String(claims[OMIT_CLAIM] || '').split(',').filter(Boolean)) delete certified[name];
  delete certified[OMIT_CLAIM];
  const forwarded = {
    credentials: { oidcIdentityToken: unsignedJwt({ ...certified, [SAN_CLAIM]: san }) },
    ...(pem ? { certificateSigningRequest: pem } : { publicKeyRequest: json.publicKeyRequest }),
  };
  const answer = await ctx.fulcio.fn(JSON.stringify(forwarded));
  return answer.statusCode === 201 ? { ...answer, statusCode: 200 } : answer;
}

// Why a v2 publicKeyRequest does not prove possession of its key (null when it does): the request
// must carry a signature (proofOfPossession, base64) over the token's subject by that key.
function possessionProblem(request, subject) {
  const content = request?.publicKey?.content;
  const proof = request?.proofOfPossession;
  if (!content || !proof) return 'publicKeyRequest needs publicKey.content and proofOfPossession';
  let key;
  try {
    key = crypto.createPublicKey(content);
  } catch {
    return 'publicKeyRequest.publicKey.content is not a PEM public key';
  }
  let ok = false;
  try {
    ok = crypto.verify('sha256', Buffer.from(String(subject)), key, Buffer.from(proof, 'base64'));
  } catch {
    ok = false;
  }
  return ok ? null : 'proof of possession (signature over the token subject) is invalid';
}

const SAN_CLAIM = 'benchseal_certificate_san';
const OMIT_CLAIM = 'benchseal_certificate_omits';

// Fulcio's rule: a GitHub Actions token's certificate identity is the job's workflow ref as a
// URL; any other issuer's is its subject.
function subjectAltName(claims) {
  if (claims.iss === GITHUB_ISSUER) {
    for (const name of GITHUB_REQUIRED_CLAIMS) {
      if (typeof claims[name] !== 'string' || claims[name] === '') throw new Error(`GitHub token lacks the ${name} claim`);
    }
    return `https://github.com/${claims.job_workflow_ref}`;
  }
  if (typeof claims.sub !== 'string' || claims.sub === '') throw new Error('token lacks the sub claim');
  return claims.sub;
}

function unsignedJwt(claims) {
  const part = (obj) => Buffer.from(JSON.stringify(obj)).toString('base64url');
  return `${part({ alg: 'none' })}.${part(claims)}.`;
}

async function signToken(ctx, issuer, sub, claims, ttl) {
  return new jose.SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', kid: ctx.oidcKid })
    .setIssuer(issuer)
    .setSubject(sub)
    .setAudience(AUDIENCE)
    .setIssuedAt()
    .setNotBefore(Math.floor(Date.now() / 1000) - 5)
    .setExpirationTime(Math.floor(Date.now() / 1000) + ttl)
    .sign(ctx.oidcPrivateKey);
}

// GitHub's Actions token claims for one job; `sub` is built the way GitHub builds it.
function githubClaims(job) {
  const claims = {};
  for (const name of GITHUB_REQUIRED_CLAIMS) {
    if (typeof job[name] !== 'string' || job[name] === '') throw new Error(`job.${name} is required`);
    claims[name] = job[name];
  }
  const optional = ['repository_owner', 'repository_id', 'repository_owner_id', 'workflow', 'workflow_sha',
    'job_workflow_sha', 'run_id', 'run_attempt', 'actor', 'repository_visibility', 'environment', OMIT_CLAIM];
  for (const name of optional) {
    if (job[name] !== undefined) claims[name] = String(job[name]);
  }
  if (!claims.repository_owner) claims.repository_owner = claims.repository.split('/')[0];
  const sub = job.environment ? `repo:${claims.repository}:environment:${job.environment}` : `repo:${claims.repository}:ref:${claims.ref}`;
  return { sub, claims };
}

// Actions' token endpoint: a job gets ACTIONS_ID_TOKEN_REQUEST_URL and _TOKEN; a GET with the
// bearer request token and ?audience= answers {"value": <JWT>} for that job's claims.
function openSession(ctx, text) {
  const req = text ? JSON.parse(text) : {};
  const job = githubClaims(req.job || {});
  const requestToken = crypto.randomBytes(24).toString('hex');
  const id = crypto.randomBytes(8).toString('hex');
  ctx.sessions.set(id, { requestToken, job, expires: Date.now() + SESSION_TTL_MS });
  return {
    statusCode: 201,
    contentType: 'application/json',
    response: JSON.stringify({
      id,
      request_url: `${ctx.base}/actions/${id}/idtoken?api-version=2.0`,
      request_token: requestToken,
    }),
  };
}

async function sessionToken(ctx, req, url, id) {
  const session = ctx.sessions.get(id);
  const auth = req.headers.authorization || '';
  const bearer = /^bearer (\S+)$/i.exec(auth);
  if (!session || session.expires < Date.now() || !bearer || !timingSafeEqualText(bearer[1], session.requestToken)) {
    return { statusCode: 401, contentType: 'application/json', response: JSON.stringify({ message: 'bad request token' }) };
  }
  const audience = url.searchParams.get('audience') || AUDIENCE;
  if (audience !== AUDIENCE) {
    return { statusCode: 400, contentType: 'application/json', response: JSON.stringify({ message: 'audience must be sigstore' }) };
  }
  const jwt = await signToken(ctx, GITHUB_ISSUER, session.job.sub, session.job.claims, 600);
  return { statusCode: 200, contentType: 'application/json', response: JSON.stringify({ count: 1, value: jwt }) };
}

function timingSafeEqualText(a, b) {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && crypto.timingSafeEqual(x, y);
}

// Fulcio's v1 API (what cosign sign calls): a public key plus a signature over the token's
// subject as proof of possession, or a CSR; the answer is the PEM chain, leaf first, with
// the SCT embedded in the leaf.
async function signingCertV1(ctx, headers, text) {
  const json = JSON.parse(text);
  const match = /^Bearer (\S+)$/.exec(headers.authorization || '');
  if (!match) return { statusCode: 401, response: JSON.stringify({ message: 'missing bearer token' }) };
  let claims;
  try {
    ({ payload: claims } = await jose.jwtVerify(match[1], ctx.oidcPublicKey, {
      issuer: [LOCAL_ISSUER, GITHUB_ISSUER], audience: AUDIENCE, algorithms: ['ES256'],
    }));
  } catch (e) {
    return { statusCode: 401, response: JSON.stringify({ message: `identity token rejected: ${e.message}` }) };
  }
  let v2;
  if (json.certificateSigningRequest) {
    v2 = { certificateSigningRequest: json.certificateSigningRequest };
  } else {
    const content = json.publicKey?.content;
    const proof = json.signedEmailAddress;
    if (!content || !proof) return { statusCode: 400, response: JSON.stringify({ message: 'publicKey and signedEmailAddress are required' }) };
    const raw = Buffer.from(content, 'base64');
    const key = raw.toString('utf8').includes('BEGIN')
      ? crypto.createPublicKey(raw.toString('utf8'))
      : crypto.createPublicKey({ key: raw, format: 'der', type: 'spki' });
    if (!crypto.verify('sha256', Buffer.from(String(claims.sub)), key, Buffer.from(proof, 'base64'))) {
      return { statusCode: 400, response: JSON.stringify({ message: 'proof of possession (signature over sub) is invalid' }) };
    }
    v2 = { publicKeyRequest: { publicKey: { content: key.export({ format: 'pem', type: 'spki' }).toString() } } };
  }
  const answer = await signingCert(ctx, headers, JSON.stringify(v2), { proven: true });
  if (answer.statusCode !== 200) return answer;
  const chain = JSON.parse(answer.response).signedCertificateEmbeddedSct.chain.certificates;
  return { statusCode: 201, response: chain.join(''), contentType: 'application/pem-certificate-chain' };
}

async function mintToken(ctx, text) {
  const req = text ? JSON.parse(text) : {};
  const ttl = Math.min(Number(req.ttl_seconds || 600), 3600);
  let jwt;
  if (req.github_job) {
    const job = githubClaims(req.github_job);
    jwt = await signToken(ctx, GITHUB_ISSUER, job.sub, job.claims, ttl);
  } else {
    const claims = { ...(req.claims || {}) };
    jwt = await signToken(ctx, LOCAL_ISSUER, req.sub || LOCAL_IDENTITY, claims, ttl);
  }
  return { statusCode: 200, response: JSON.stringify({ token: jwt }), contentType: 'application/json' };
}

// --- trust material -------------------------------------------------------------
function trustMaterial(ctx, base, started, previousRootFile) {
  const start = new Date(started.getTime() - 60_000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  const key = (log) => ({
    rawBytes: log.publicDer.toString('base64'),
    keyDetails: 'PKIX_ECDSA_P256_SHA_256',
    validFor: { start },
  });
  const tlog = (log, url) => ({
    baseUrl: url,
    hashAlgorithm: 'SHA2_256',
    publicKey: key(log),
    logId: { keyId: log.logId.toString('base64') },
  });
  const ctPublic = ctx.ctlog.publicKey;
  const fresh = {
    mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
    tlogs: [tlog(ctx.rekor1, `${base}/rekor`), tlog(ctx.rekor2, `${base}/rekor2`)],
    certificateAuthorities: [
      {
        subject: { organization: 'sigstore.mock', commonName: 'sigstore' },
        uri: base,
        certChain: { certificates: [{ rawBytes: Buffer.from(ctx.ca.rootCertificate).toString('base64') }] },
        validFor: { start },
      },
    ],
    ctlogs: [
      {
        baseUrl: `${base}/ct`,
        hashAlgorithm: 'SHA2_256',
        publicKey: { rawBytes: Buffer.from(ctPublic).toString('base64'), keyDetails: 'PKIX_ECDSA_P256_SHA_256', validFor: { start } },
        logId: { keyId: Buffer.from(ctx.ctlog.logID).toString('base64') },
      },
    ],
    timestampAuthorities: [
      {
        subject: { organization: 'sigstore.mock', commonName: 'tsa' },
        uri: `${base}/tsa`,
        certChain: {
          certificates: [
            { rawBytes: Buffer.from(ctx.tsa.intCertificate).toString('base64') },
            { rawBytes: Buffer.from(ctx.tsa.rootCertificate).toString('base64') },
          ],
        },
        validFor: { start },
      },
    ],
  };
  const trustedRoot = mergePrevious(fresh, previousRootFile);
  const service = (url, version) => ({ url, majorApiVersion: version, validFor: { start }, operator: 'benchseal.local' });
  const signingConfig = (rekorVersion) => ({
    mediaType: 'application/vnd.dev.sigstore.signingconfig.v0.2+json',
    caUrls: [service(base, 1)],
    oidcUrls: [service(`${base}/oidc`, 1)],
    rekorTlogUrls: [rekorVersion === 2 ? service(`${base}/rekor2`, 2) : service(`${base}/rekor`, 1)],
    rekorTlogConfig: { selector: 'ANY' },
    tsaUrls: [service(`${base}/tsa/api/v1/timestamp`, 1)],
    tsaConfig: { selector: 'ANY' },
  });
  const clientConfig = (rekorVersion) => ({
    mediaType: 'application/vnd.dev.sigstore.clienttrustconfig.v0.1+json',
    trustedRoot,
    signingConfig: signingConfig(rekorVersion),
  });
  return { trustedRoot, clientConfig };
}

// Earlier instances of this state dir stay trusted for what they signed: their keys and
// certificates are kept in the new trusted root with a validity end of now (the way
// Sigstore itself rotates keys), at most MAX_GENERATIONS of them.
const MAX_GENERATIONS = 20;

function retire(entry, endIso) {
  const copy = JSON.parse(JSON.stringify(entry));
  const holder = copy.publicKey ? copy.publicKey : copy;
  holder.validFor = holder.validFor || {};
  if (!holder.validFor.end) holder.validFor.end = endIso;
  return copy;
}

function mergePrevious(trustedRoot, file) {
  let previous;
  try {
    previous = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch {
    return trustedRoot;
  }
  // Round up: what the old instance signed within this second must stay inside its validity.
  const end = new Date(Math.ceil(Date.now() / 1000) * 1000 + 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  const keep = (list) => (list || []).slice(-MAX_GENERATIONS * 2).map((e) => retire(e, end));
  return {
    ...trustedRoot,
    tlogs: [...keep(previous.tlogs), ...trustedRoot.tlogs],
    certificateAuthorities: [...keep(previous.certificateAuthorities).slice(-MAX_GENERATIONS), ...trustedRoot.certificateAuthorities],
    ctlogs: [...keep(previous.ctlogs).slice(-MAX_GENERATIONS), ...trustedRoot.ctlogs],
    timestampAuthorities: [...keep(previous.timestampAuthorities).slice(-MAX_GENERATIONS), ...trustedRoot.timestampAuthorities],
  };
}

// --- HTTP -----------------------------------------------------------------------
function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size > MAX_BODY) {
        reject(new Error('request body too large'));
        req.destroy();
      } else chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

async function route(ctx, req, body) {
  const url = new URL(req.url, 'http://127.0.0.1');
  const p = url.pathname;
  const json = (obj, statusCode = 200) => ({ statusCode, response: JSON.stringify(obj), contentType: 'application/json' });
  if (req.method === 'GET' && p === '/healthz') return json({ ok: true, pid: process.pid, counts: ctx.counts });
  if (req.method === 'GET' && p === '/trusted_root.json') return json(ctx.trust.trustedRoot);
  const idtoken = /^\/actions\/([0-9a-f]{16})\/idtoken$/.exec(p);
  if (req.method === 'GET' && idtoken) return sessionToken(ctx, req, url, idtoken[1]);
  if (req.method !== 'POST') return json({ message: 'not found' }, 404);
  const text = body.toString('utf8');
  try {
    switch (p) {
      case '/oidc/token':
        return await mintToken(ctx, text);
      case '/actions/sessions':
        return openSession(ctx, text);
      case '/api/v1/signingCert':
        ctx.counts.fulcio += 1;
        return await signingCertV1(ctx, req.headers, text);
      case '/api/v2/signingCert':
        ctx.counts.fulcio += 1;
        return await signingCert(ctx, req.headers, text);
      case '/rekor/api/v1/log/entries':
        ctx.counts.rekor1 += 1;
        return rekorV1Entry(ctx.rekor1, ctx.rekor1Mock, JSON.parse(text), p);
      case '/rekor2/api/v2/log/entries':
        ctx.counts.rekor2 += 1;
        return json(rekorV2Entry(ctx.rekor2, JSON.parse(text)), 201);
      case '/tsa/api/v1/timestamp':
        ctx.counts.tsa += 1;
        return { statusCode: 201, response: Buffer.from(await timestamp(ctx.tsa, body)), contentType: 'application/timestamp-reply' };
      default:
        return json({ message: 'not found' }, 404);
    }
  } catch (e) {
    return json({ message: String(e && e.message ? e.message : e) }, 400);
  }
}

async function main() {
  const opts = args(process.argv);
  fs.mkdirSync(opts.state, { recursive: true });
  const started = wholeSecondNow();

  const ctlog = await mock.initializeCTLog(ecKeyPair());
  const ca = await mock.initializeCA(ecKeyPair(), ctlog);
  ca.getCurrentTime = wholeSecondNow;
  const tsa = await mock.initializeTSA(ecKeyPair());
  patchTsa(tsa);
  const oidcKeys = ecKeyPair();
  const rekor1Keys = ecKeyPair();
  const rekor2Keys = ecKeyPair();

  const server = http.createServer();
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, '127.0.0.1', resolve);
  });
  const port = server.address().port;
  const base = `http://127.0.0.1:${port}`;
  const ctx = {
    ca,
    ctlog,
    tsa,
    fulcio: mock.fulcioHandler(ca, { subjectClaim: SAN_CLAIM }),
    base,
    sessions: new Map(),
    oidcPrivateKey: oidcKeys.privateKey,
    oidcPublicKey: oidcKeys.publicKey,
    oidcKid: sha256(spkiDer(oidcKeys.publicKey)).toString('hex').slice(0, 16),
    rekor1: new MerkleLog('rekor', `127.0.0.1:${port}/rekor`, rekor1Keys, { treeId: true }),
    rekor1Mock: await mock.initializeTLog(`${base}/rekor`, rekor1Keys),
    rekor2: new MerkleLog('rekor2', `127.0.0.1:${port}/rekor2`, rekor2Keys),
    counts: { fulcio: 0, rekor1: 0, rekor2: 0, tsa: 0 },
  };
  ctx.trust = trustMaterial(ctx, base, started, path.join(opts.state, 'trusted_root.json'));

  server.on('request', (req, res) => {
    readBody(req)
      .then((body) => route(ctx, req, body))
      .then(({ statusCode, response, contentType, headers }) => {
        res.writeHead(statusCode, { ...(headers || {}), 'Content-Type': contentType || 'application/json' });
        res.end(response);
      })
      .catch((e) => {
        res.writeHead(500, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ message: String(e) }));
      });
  });

  const file = (name) => path.join(opts.state, name);
  writeAtomic(file('trusted_root.json'), JSON.stringify(ctx.trust.trustedRoot, null, 2) + '\n');
  // The same root as JSON Lines: the form `gh attestation verify --custom-trusted-root` reads.
  writeAtomic(file('trusted_root.jsonl'), JSON.stringify(ctx.trust.trustedRoot) + '\n');
  writeAtomic(file('client_trust_config.json'), JSON.stringify(ctx.trust.clientConfig(1), null, 2) + '\n');
  writeAtomic(file('client_trust_config_rekor2.json'), JSON.stringify(ctx.trust.clientConfig(2), null, 2) + '\n');
  writeAtomic(
    file('instance.json'),
    JSON.stringify(
      {
        pid: process.pid,
        url: base,
        port,
        started_at: started.toISOString(),
        issuer: LOCAL_ISSUER,
        identity: LOCAL_IDENTITY,
        github_issuer: GITHUB_ISSUER,
        actions_sessions_url: `${base}/actions/sessions`,
        token_url: `${base}/oidc/token`,
        trusted_root: file('trusted_root.json'),
        client_trust_config: { 1: file('client_trust_config.json'), 2: file('client_trust_config_rekor2.json') },
      },
      null,
      2,
    ) + '\n',
  );

  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((e) => {
  process.stderr.write(`sigstore-local: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
