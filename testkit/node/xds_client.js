// gRPC's xDS client for Node (@grpc/grpc-js-xds), driven by the end-to-end tests over
// stdin/stdout with the same JSON commands as testkit/python/xds_client.py, so one test can
// run against both implementations (grpc-js-xds is stricter than C-core in places).
//
// GRPC_XDS_BOOTSTRAP names the bootstrap file. Each stdin line is a JSON command; each
// answer is one JSON line on stdout. Clients are kept per target, so configuration changes
// reach an already-connected client.
//
// Commands:
//   {"cmd": "rpcs", "target": "xds:///host:port", "count": N, "metadata": {...}, "timeout_s": 5}
//       -> {"counts": {backend name: n}, "errors": {status code name: n}, "details": [...]}
//   {"cmd": "until", "target": ..., "expect": "name", "metadata": {...}, "max_s": 30}
//       -> {"ok": true|false, "elapsed_ms": ms, "rpcs": n, "last": name-or-status}
//   {"cmd": "quit"}
'use strict';

const readline = require('node:readline');
const grpc = require('@grpc/grpc-js');
const grpcXds = require('@grpc/grpc-js-xds');

grpcXds.register();

const METHOD = '/pilotfish.test.Echo/Who';
const clients = new Map();
const statusName = new Map(Object.entries(grpc.status).map(([name, code]) => [code, name]));

function client(target) {
  if (!clients.has(target)) {
    clients.set(target, new grpc.Client(target, grpc.credentials.createInsecure()));
  }
  return clients.get(target);
}

function metadataOf(c) {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(c.metadata || {})) md.set(k, v);
  return md;
}

// One RPC: resolves to {name} or {code, details}; never rejects.
function oneRpc(target, md, timeoutS) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + timeoutS * 1000);
    client(target).makeUnaryRequest(
      METHOD,
      (b) => b,
      (b) => b,
      Buffer.alloc(0),
      md,
      { deadline },
      (err, reply) => {
        if (err) resolve({ code: statusName.get(err.code) || String(err.code), details: err.details });
        else resolve({ name: reply.toString() });
      },
    );
  });
}

async function cmdRpcs(c) {
  const md = metadataOf(c);
  const counts = {};
  const errors = {};
  const details = [];
  for (let i = 0; i < Number(c.count); i++) {
    const r = await oneRpc(c.target, md, Number(c.timeout_s ?? 5));
    if (r.name !== undefined) counts[r.name] = (counts[r.name] || 0) + 1;
    else {
      errors[r.code] = (errors[r.code] || 0) + 1;
      if (details.length < 5) details.push(`${r.code}: ${r.details}`);
    }
  }
  return { counts, errors, details };
}

async function cmdUntil(c) {
  const md = metadataOf(c);
  const start = performance.now();
  const deadline = start + Number(c.max_s ?? 30) * 1000;
  let rpcs = 0;
  let last = null;
  while (performance.now() < deadline) {
    const r = await oneRpc(c.target, md, 5);
    rpcs += 1;
    last = r.name !== undefined ? r.name : r.code;
    if (last === c.expect) {
      return { ok: true, elapsed_ms: performance.now() - start, rpcs, last };
    }
    await new Promise((res) => setTimeout(res, 5));
  }
  return { ok: false, elapsed_ms: performance.now() - start, rpcs, last };
}

async function main() {
  const pkg = require('@grpc/grpc-js-xds/package.json');
  process.stdout.write(JSON.stringify({ ready: true, grpc_js_xds: pkg.version }) + '\n');
  const lines = readline.createInterface({ input: process.stdin });
  for await (const raw of lines) {
    const line = raw.trim();
    if (!line) continue;
    const c = JSON.parse(line);
    if (c.cmd === 'quit') break;
    let answer;
    try {
      const handler = { rpcs: cmdRpcs, until: cmdUntil }[c.cmd];
      if (!handler) throw new Error(`unknown command ${c.cmd}`);
      answer = await handler(c);
    } catch (e) {
      answer = { exception: String(e && e.stack ? e.stack : e) };
    }
    process.stdout.write(JSON.stringify(answer) + '\n');
  }
  for (const cl of clients.values()) cl.close();
  process.exit(0);
}

main();
