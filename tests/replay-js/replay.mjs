// Replays the golden vectors (tests/vectors/*.json) against the state store
// component (`statestore:core/store@0.6.0`) in Node.js, through jco.
//
//   node replay.mjs <vectors dir> [--component <transpiled .js>]
//
// The component must have been transpiled with `jco transpile <wasm> -o
// component --name statestore_guest` (scripts/replay-js does it); by default
// it is loaded from ./component/statestore_guest.js next to this file, with
// the real WASI of @bytecodealliance/preview2-shim that jco links by default.
//
// Every vector is replayed twice, on a fresh store each time:
//   typed  through `handle(inputs, now)`, the WIT records converted here;
//   wire   through `handle-wire(batch, now)`, with the codec below, written
//          from wit/WIRE.md alone (batch version 4 out, output list
//          version 5 in, MQTT messages rebuilt as "Building the MQTT
//          messages" says).
// Each step's outputs (every field, exactly; bytes as hex) and the
// `next-deadline` after it are compared with the vector.
//
// Then a tamper self-check: for each vector one byte of one expected output
// (or the deadline, if the vector has no outputs) is changed in memory, and
// the comparison must notice it.
//
// Output: one line per failing vector x door with its first difference, then
// `tampered: K of K detected`, then `N passed, M failed` (vector x door runs).
// Exit code 0 only if nothing failed, something passed and every tamper was
// detected; 2 if the component is refused or the arguments are wrong.
//
//   node replay.mjs [<vectors dir>] --panic-check <transpiled faulty .js>
//
// Panic check, run first (before the vectors, so that `N passed, M failed`
// stays the last line): proves that a guest panic under real WASI (jco's
// preview2-shim) prints its message. The component must be the build with
// the guest's `fault-injection` feature (guest/src/fault.rs), transpiled the
// same way. This file runs itself as a child `node` process
// (`--panic-child <js>`, internal) that makes a fresh store and sends, through
// `handle-wire`, full request envelopes (QoS 1, response topic, correlation
// data, message expiry, `__ts`): `GET k` and `GET __fault/build` must be
// answered (the load works, and it is that build), then `SET __fault/trap x`
// must trap (a WebAssembly.RuntimeError, not an error result). The parent
// captures the child's stderr, which must contain the panic message
// `deliberate fault: SET __fault/trap`. It prints `panic check: message
// printed` or `panic check: FAILED: <why>`; a failed check makes the exit
// code 1 (after the vector replay, if a vectors dir was given too).

import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const BATCH_VERSION = 4;
const OUTPUTS_VERSION = 5;
const SEED_WIRE = 7n;
const SEED_TYPED = 0x9e3779b97f4a7c15n;
const NOTIFY_PREFIX = 'clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/';
const CONTENT_TYPE = 'application/octet-stream';
const U32_MAX = 0xffffffff;
const U64_MAX = (1n << 64n) - 1n;

// ---------------------------------------------------------------- arguments

function usage(message) {
  console.error(`replay.mjs: ${message}`);
  console.error('usage: node replay.mjs <vectors dir> [--component <transpiled component .js>] [--panic-check <transpiled faulty component .js>]');
  console.error('       node replay.mjs --panic-check <transpiled faulty component .js>');
  process.exit(2);
}

let vectorsDir;
let componentJs = join(HERE, 'component', 'statestore_guest.js');
let panicCheckJs; // --panic-check: the fault-injection build, checked in a child process
let panicChildJs; // --panic-child: this process is that child
{
  const args = process.argv.slice(2);
  const pathAfter = (i) => {
    if (i + 1 >= args.length) usage(`${args[i]} needs a path`);
    return resolve(args[i + 1]);
  };
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--component') {
      componentJs = pathAfter(i++);
    } else if (args[i] === '--panic-check') {
      panicCheckJs = pathAfter(i++);
    } else if (args[i] === '--panic-child') {
      panicChildJs = pathAfter(i++);
    } else if (args[i].startsWith('-')) {
      usage(`unknown option ${args[i]}`);
    } else if (vectorsDir === undefined) {
      vectorsDir = resolve(args[i]);
    } else {
      usage(`unexpected argument ${args[i]}`);
    }
  }
  if (panicChildJs === undefined) {
    if (vectorsDir === undefined && panicCheckJs === undefined) usage('no vectors directory given');
    if (vectorsDir !== undefined && !existsSync(vectorsDir)) usage(`no such directory: ${vectorsDir}`);
    if (vectorsDir !== undefined && !existsSync(componentJs)) usage(`no transpiled component at ${componentJs} (run scripts/replay-js)`);
    if (panicCheckJs !== undefined && !existsSync(panicCheckJs)) usage(`no transpiled component at ${panicCheckJs} (run scripts/replay-js)`);
  }
}

// ---------------------------------------------------------------- bytes

const utf8 = new TextEncoder();
// fatal: invalid UTF-8 is an error; ignoreBOM: a leading U+FEFF is content.
const utf8Strict = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function toHex(bytes) {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex');
}

function fromHex(hex, what) {
  if (typeof hex !== 'string' || hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) {
    throw new VectorError(`${what}: bad hex ${JSON.stringify(hex)}`);
  }
  return new Uint8Array(Buffer.from(hex, 'hex'));
}

function strBytes(s) {
  return utf8.encode(s);
}

// ---------------------------------------------------------------- vector JSON

class VectorError extends Error {}

/** A vector BYTES value: a string (its UTF-8 bytes) or {"hex": "..."}. */
function jsonBytes(v, what) {
  if (typeof v === 'string') {
    if (!v.isWellFormed()) throw new VectorError(`${what}: string with a lone surrogate`);
    return strBytes(v);
  }
  if (v !== null && typeof v === 'object' && Object.keys(v).length === 1 && 'hex' in v) {
    return fromHex(v.hex, what);
  }
  throw new VectorError(`${what}: not BYTES: ${JSON.stringify(v)}`);
}

function jsonOpt(v, f) {
  return v === null || v === undefined ? undefined : f(v);
}

function jsonInt(v, what, max) {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
    throw new VectorError(`${what}: not an unsigned integer: ${JSON.stringify(v)}`);
  }
  if (!Number.isSafeInteger(v)) throw new VectorError(`${what}: ${v} is beyond what JSON numbers carry exactly here`);
  if (max !== undefined && v > max) throw new VectorError(`${what}: ${v} is out of range`);
  return v;
}

function jsonU64(v, what) {
  return BigInt(jsonInt(v, what));
}

function jsonStr(v, what) {
  if (typeof v !== 'string') throw new VectorError(`${what}: not a string: ${JSON.stringify(v)}`);
  return v;
}

function requireKeys(obj, keys, what) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
    throw new VectorError(`${what}: not an object`);
  }
  const have = Object.keys(obj).sort();
  const want = [...keys].sort();
  if (have.join(',') !== want.join(',')) {
    throw new VectorError(`${what}: fields [${have}] are not [${want}]`);
  }
}

const INBOUND_KEYS = ['topic', 'payload', 'qos', 'response_topic', 'correlation_data',
  'message_expiry_interval', 'content_type', 'payload_format_indicator', 'user_properties',
  'client_id', 'received_at'];
const OUTBOUND_KEYS = ['kind', 'topic', 'payload', 'qos', 'retain', 'correlation_data',
  'message_expiry_interval', 'content_type', 'payload_format_indicator', 'response_topic',
  'user_properties', 'target_client'];

/** [name, value] pairs as WIT `user-property` records. */
function parsePairs(list, what) {
  if (!Array.isArray(list)) throw new VectorError(`${what}: not a list`);
  return list.map((p, i) => {
    if (!Array.isArray(p) || p.length !== 2) throw new VectorError(`${what}[${i}]: not a [name, value] pair`);
    return { name: jsonStr(p[0], `${what}[${i}][0]`), value: jsonStr(p[1], `${what}[${i}][1]`) };
  });
}

/** A vector's INBOUND, as plain JS values (bytes as Uint8Array, u64 as BigInt). */
function parseInbound(m, what) {
  // `username`, `attributes` and `via` are written only when set.
  const optional = ['username', 'attributes', 'via'].filter((k) => k in (m ?? {}));
  requireKeys(m, [...INBOUND_KEYS, ...optional], what);
  if (!Array.isArray(m.user_properties)) throw new VectorError(`${what}.user_properties: not a list`);
  return {
    topic: jsonStr(m.topic, `${what}.topic`),
    payload: jsonBytes(m.payload, `${what}.payload`),
    qos: jsonInt(m.qos, `${what}.qos`, 255),
    responseTopic: jsonOpt(m.response_topic, (v) => jsonStr(v, `${what}.response_topic`)),
    correlationData: jsonOpt(m.correlation_data, (v) => jsonBytes(v, `${what}.correlation_data`)),
    messageExpiryInterval: jsonOpt(m.message_expiry_interval, (v) => jsonInt(v, `${what}.message_expiry_interval`, U32_MAX)),
    contentType: jsonOpt(m.content_type, (v) => jsonStr(v, `${what}.content_type`)),
    payloadFormatIndicator: jsonOpt(m.payload_format_indicator, (v) => jsonInt(v, `${what}.payload_format_indicator`, 255)),
    userProperties: m.user_properties.map((p, i) => {
      if (!Array.isArray(p) || p.length !== 2) throw new VectorError(`${what}.user_properties[${i}]: not a [name, value] pair`);
      return { name: jsonStr(p[0], `${what}.user_properties[${i}][0]`), value: jsonStr(p[1], `${what}.user_properties[${i}][1]`) };
    }),
    clientId: jsonOpt(m.client_id, (v) => jsonStr(v, `${what}.client_id`)),
    receivedAt: jsonOpt(m.received_at, (v) => jsonU64(v, `${what}.received_at`)),
    username: jsonOpt(m.username, (v) => jsonStr(v, `${what}.username`)),
    attributes: parsePairs(m.attributes ?? [], `${what}.attributes`),
    via: jsonOpt(m.via, (v) => parseVia(v, `${what}.via`)),
  };
}

/** A vector's `via` (a replica and the start of its life) as a WIT `via` record. */
function parseVia(v, what) {
  requireKeys(v, ['replica', 'started'], what);
  return { replica: jsonU64(v.replica, `${what}.replica`), started: jsonU64(v.started, `${what}.started`) };
}

/** A vector config's `authorization` rules as WIT `auth-rule` records. */
function parseRules(rules) {
  if (rules === undefined || rules === null) return undefined;
  if (!Array.isArray(rules)) throw new VectorError('config.authorization: not a list');
  const strings = (v, what) => (v ?? []).map((s, i) => jsonStr(s, `${what}[${i}]`));
  return rules.map((r, i) => {
    const what = `config.authorization[${i}]`;
    const p = r.principals ?? {};
    return {
      principals: {
        clientIds: strings(p.client_ids, `${what}.principals.client_ids`),
        usernames: strings(p.usernames, `${what}.principals.usernames`),
        attributes: (p.attributes ?? []).map((set, j) => parsePairs(set, `${what}.principals.attributes[${j}]`)),
      },
      grants: (r.grants ?? []).map((g, j) => {
        const gw = `${what}.grants[${j}]`;
        const method = { read: 'read', write: 'write', read_write: 'read-write' }[g.method];
        if (method === undefined) throw new VectorError(`${gw}.method: ${JSON.stringify(g.method)}`);
        return {
          method,
          keys: (g.keys ?? []).map((k, n) => {
            const kw = `${gw}.keys[${n}]`;
            if (k !== null && typeof k === 'object' && 'pattern' in k) return { tag: 'pattern', val: jsonStr(k.pattern, kw) };
            if (k !== null && typeof k === 'object' && 'text' in k) return { tag: 'text', val: jsonStr(k.text, kw) };
            if (k !== null && typeof k === 'object' && 'binary' in k) return { tag: 'binary', val: jsonBytes(k.binary, kw) };
            throw new VectorError(`${kw}: not {pattern}, {text} or {binary}`);
          }),
        };
      }),
    };
  });
}

/**
 * A step's input: {kind: 'publish', message} | {kind: 'disconnect', clientId}
 * | {kind: 'disconnect-via', clientId, via} | {kind: 'replica-started', via}
 * | {kind: 'timeout'} | {kind: 'restore'}.
 */
function parseInput(input, what) {
  if (input === 'timeout') return { kind: 'timeout' };
  if (input === 'restore') return { kind: 'restore' };
  if (input !== null && typeof input === 'object' && Object.keys(input).length === 1) {
    if ('publish' in input) return { kind: 'publish', message: parseInbound(input.publish, `${what}.publish`) };
    if ('disconnect' in input) return { kind: 'disconnect', clientId: jsonStr(input.disconnect, `${what}.disconnect`) };
    if ('disconnect_via' in input) {
      const d = input.disconnect_via;
      requireKeys(d, ['client_id', 'via'], `${what}.disconnect_via`);
      return {
        kind: 'disconnect-via',
        clientId: jsonStr(d.client_id, `${what}.disconnect_via.client_id`),
        via: parseVia(d.via, `${what}.disconnect_via.via`),
      };
    }
    if ('replica_started' in input) return { kind: 'replica-started', via: parseVia(input.replica_started, `${what}.replica_started`) };
  }
  throw new VectorError(`${what}: unknown input ${JSON.stringify(input)}`);
}

/**
 * The comparable form of an output, built the same way from the vector and
 * from either door: fixed field order, bytes as lowercase hex, absent = null.
 */
function canonPublish(p) {
  return {
    publish: {
      kind: p.kind,
      topic: p.topic,
      payload: toHex(p.payload),
      qos: p.qos,
      retain: p.retain,
      correlation_data: p.correlationData === undefined ? null : toHex(p.correlationData),
      message_expiry_interval: p.messageExpiryInterval ?? null,
      content_type: p.contentType ?? null,
      payload_format_indicator: p.payloadFormatIndicator ?? null,
      response_topic: p.responseTopic ?? null,
      user_properties: p.userProperties.map(({ name, value }) => [name, value]),
      target_client: p.targetClient ?? null,
    },
  };
}

function canonJournal(bytes) {
  return { journal: toHex(bytes) };
}

function canonViolation(clientId, reason) {
  return { violation: { client_id: clientId ?? null, reason } };
}

function parseExpectedOutput(o, what) {
  if (o === null || typeof o !== 'object' || Object.keys(o).length !== 1) {
    throw new VectorError(`${what}: not a one-key object`);
  }
  if ('publish' in o) {
    const p = o.publish;
    const w = `${what}.publish`;
    requireKeys(p, OUTBOUND_KEYS, w);
    if (p.kind !== 'response' && p.kind !== 'notification') throw new VectorError(`${w}.kind: ${JSON.stringify(p.kind)}`);
    if (typeof p.retain !== 'boolean') throw new VectorError(`${w}.retain: not a boolean`);
    if (!Array.isArray(p.user_properties)) throw new VectorError(`${w}.user_properties: not a list`);
    return canonPublish({
      kind: p.kind,
      topic: jsonStr(p.topic, `${w}.topic`),
      payload: jsonBytes(p.payload, `${w}.payload`),
      qos: jsonInt(p.qos, `${w}.qos`, 255),
      retain: p.retain,
      correlationData: jsonOpt(p.correlation_data, (v) => jsonBytes(v, `${w}.correlation_data`)),
      messageExpiryInterval: jsonOpt(p.message_expiry_interval, (v) => jsonInt(v, `${w}.message_expiry_interval`, U32_MAX)),
      contentType: jsonOpt(p.content_type, (v) => jsonStr(v, `${w}.content_type`)),
      payloadFormatIndicator: jsonOpt(p.payload_format_indicator, (v) => jsonInt(v, `${w}.payload_format_indicator`, 255)),
      responseTopic: jsonOpt(p.response_topic, (v) => jsonStr(v, `${w}.response_topic`)),
      userProperties: p.user_properties.map((q, i) => {
        if (!Array.isArray(q) || q.length !== 2) throw new VectorError(`${w}.user_properties[${i}]: not a pair`);
        return { name: jsonStr(q[0], `${w}.user_properties[${i}][0]`), value: jsonStr(q[1], `${w}.user_properties[${i}][1]`) };
      }),
      targetClient: jsonOpt(p.target_client, (v) => jsonStr(v, `${w}.target_client`)),
    });
  }
  if ('journal' in o) return canonJournal(jsonBytes(o.journal, `${what}.journal`));
  if ('violation' in o) {
    const v = o.violation;
    requireKeys(v, ['client_id', 'reason'], `${what}.violation`);
    return canonViolation(jsonOpt(v.client_id, (c) => jsonStr(c, `${what}.violation.client_id`)),
      jsonStr(v.reason, `${what}.violation.reason`));
  }
  throw new VectorError(`${what}: unknown output ${JSON.stringify(Object.keys(o))}`);
}

function canonDeadline(d) {
  return d === undefined || d === null ? null : String(d);
}

/** A whole vector, checked and converted once. */
function parseVector(file) {
  const v = JSON.parse(readFileSync(file, 'utf8'));
  if (v.format !== 1) throw new VectorError(`format ${JSON.stringify(v.format)} is not 1`);
  const c = v.config;
  if (c === null || typeof c !== 'object') throw new VectorError('no config');
  const q = c.quota ?? {};
  const page = c.scan_page ?? { max_keys: 1000, max_bytes: 256 * 1024 };
  const config = {
    nodeId: jsonStr(c.node_id, 'config.node_id'),
    serverClientId: jsonOpt(c.server_client_id, (s) => jsonStr(s, 'config.server_client_id')),
    persist: c.persist ?? 'none',
    quota: {
      maxKeys: jsonOpt(q.max_keys, (n) => jsonU64(n, 'config.quota.max_keys')),
      maxBytes: jsonOpt(q.max_bytes, (n) => jsonU64(n, 'config.quota.max_bytes')),
      maxKeyBytes: jsonOpt(q.max_key_bytes, (n) => jsonInt(n, 'config.quota.max_key_bytes', U32_MAX)),
      maxValueBytes: jsonOpt(q.max_value_bytes, (n) => jsonInt(n, 'config.quota.max_value_bytes', U32_MAX)),
    },
    persistKeys: (c.persist_keys ?? []).map((m, i) => {
      const what = `config.persist_keys[${i}]`;
      if (m !== null && typeof m === 'object' && 'pattern' in m) return { tag: 'pattern', val: jsonStr(m.pattern, what) };
      if (m !== null && typeof m === 'object' && 'exact' in m) return { tag: 'exact', val: jsonBytes(m.exact, what) };
      throw new VectorError(`${what}: not {pattern} or {exact}`);
    }),
    sdkResponseTopics: (() => {
      const v = c.sdk_response_topics ?? false;
      if (typeof v !== 'boolean') throw new VectorError('config.sdk_response_topics: not a boolean');
      return v;
    })(),
    scanPage: {
      maxKeys: jsonInt(page.max_keys, 'config.scan_page.max_keys', U32_MAX),
      maxBytes: jsonInt(page.max_bytes, 'config.scan_page.max_bytes', U32_MAX),
    },
    authorization: parseRules(c.authorization),
  };
  if (!['none', 'all', 'flagged', 'custom'].includes(config.persist)) throw new VectorError(`config.persist: ${JSON.stringify(config.persist)}`);
  if (!Array.isArray(v.steps)) throw new VectorError('no steps');
  const steps = v.steps.map((s, i) => {
    const what = `steps[${i}]`;
    if (!Array.isArray(s.outputs)) throw new VectorError(`${what}.outputs: not a list`);
    const input = parseInput(s.input, `${what}.input`);
    if (input.kind === 'restore' && s.outputs.length !== 0) throw new VectorError(`${what}: a restore has no outputs`);
    return {
      now: jsonU64(s.now, `${what}.now`),
      input,
      outputs: s.outputs.map((o, j) => parseExpectedOutput(o, `${what}.outputs[${j}]`)),
      deadline: canonDeadline(jsonOpt(s.next_deadline, (d) => jsonU64(d, `${what}.next_deadline`))),
    };
  });
  return { name: v.name ?? file, config, steps };
}

// ---------------------------------------------------------------- wire codec (wit/WIRE.md)

class WireError extends Error {}

/** Little-endian writer of the WIRE.md common encodings. */
class Writer {
  constructor() { this.buf = new Uint8Array(256); this.len = 0; }
  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < this.len + n) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
  }
  u8(v) {
    if (!Number.isInteger(v) || v < 0 || v > 0xff) throw new WireError(`u8 out of range: ${v}`);
    this.reserve(1); this.buf[this.len++] = v;
  }
  u32(v) {
    if (!Number.isInteger(v) || v < 0 || v > U32_MAX) throw new WireError(`u32 out of range: ${v}`);
    this.reserve(4);
    new DataView(this.buf.buffer).setUint32(this.len, v, true);
    this.len += 4;
  }
  u64(v) {
    if (typeof v !== 'bigint' || v < 0n || v > U64_MAX) throw new WireError(`u64 out of range: ${v}`);
    this.reserve(8);
    new DataView(this.buf.buffer).setBigUint64(this.len, v, true);
    this.len += 8;
  }
  bytes(b) {
    this.u32(b.length);
    this.reserve(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }
  str(s) { this.bytes(strBytes(s)); }
  opt(v, write) {
    if (v === undefined || v === null) { this.u8(0); } else { this.u8(1); write.call(this, v); }
  }
  props(list) {
    this.u32(list.length);
    for (const { name, value } of list) { this.str(name); this.str(value); }
  }
  finish() { return this.buf.slice(0, this.len); }
}

/** Strict little-endian reader: every length checked, nothing may be left over. */
class Reader {
  constructor(bytes) {
    this.b = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  left() { return this.b.length - this.pos; }
  need(n, what) {
    if (n > this.left()) throw new WireError(`${what}: needs ${n} bytes at offset ${this.pos}, ${this.left()} left`);
  }
  u8(what = 'u8') { this.need(1, what); return this.b[this.pos++]; }
  u16(what = 'u16') { this.need(2, what); const v = this.view.getUint16(this.pos, true); this.pos += 2; return v; }
  u32(what = 'u32') { this.need(4, what); const v = this.view.getUint32(this.pos, true); this.pos += 4; return v; }
  bytes(what = 'bytes') {
    const n = this.u32(`${what} length`);
    this.need(n, what);
    const v = this.b.slice(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
  str(what = 'str') {
    const at = this.pos;
    const b = this.bytes(what);
    try { return utf8Strict.decode(b); } catch { throw new WireError(`${what} at offset ${at}: not UTF-8`); }
  }
  opt(read, what = 'opt') {
    const at = this.pos;
    const tag = this.u8(`${what} tag`);
    if (tag === 0) return undefined;
    if (tag === 1) return read.call(this, what);
    throw new WireError(`${what} at offset ${at}: option tag ${tag}`);
  }
  /** A u32 count of items at least `min` bytes each, refused if the rest cannot hold them. */
  count(min, what) {
    const at = this.pos;
    const n = this.u32(`${what} count`);
    if (n * min > this.left()) throw new WireError(`${what} at offset ${at}: count ${n} cannot fit in ${this.left()} bytes`);
    return n;
  }
  props(what = 'props') {
    const n = this.count(8, what);
    const list = [];
    for (let i = 0; i < n; i++) {
      const name = this.str(`${what}[${i}] name`);
      const value = this.str(`${what}[${i}] value`);
      list.push({ name, value });
    }
    return list;
  }
  end(what) {
    if (this.left() !== 0) throw new WireError(`${what}: ${this.left()} bytes after the last item`);
  }
}

/** The `handle-wire` input batch, version 4. */
function encodeBatch(inputs) {
  const w = new Writer();
  w.u8(BATCH_VERSION);
  w.u32(inputs.length);
  for (const input of inputs) {
    if (input.kind === 'publish') {
      const m = input.message;
      w.u8(0);
      w.str(m.topic);
      w.bytes(m.payload);
      w.u8(m.qos);
      w.opt(m.responseTopic, w.str);
      w.opt(m.correlationData, w.bytes);
      w.opt(m.messageExpiryInterval, w.u32);
      w.opt(m.contentType, w.str);
      w.opt(m.payloadFormatIndicator, w.u8);
      w.props(m.userProperties);
      w.opt(m.clientId, w.str);
      w.opt(m.receivedAt, w.u64);
      w.opt(m.username, w.str);
      w.props(m.attributes ?? []);
      w.opt(m.via, writeVia);
    } else if (input.kind === 'disconnect') {
      w.u8(1);
      w.str(input.clientId);
    } else if (input.kind === 'disconnect-via') {
      w.u8(2);
      w.str(input.clientId);
      writeVia.call(w, input.via);
    } else if (input.kind === 'replica-started') {
      w.u8(3);
      writeVia.call(w, input.via);
    } else {
      throw new WireError(`no batch item for a ${input.kind}`);
    }
  }
  return w.finish();
}

/** `via = u64 replica, u64 started` (a Writer method, for `opt`). */
function writeVia(via) {
  this.u64(via.replica);
  this.u64(via.started);
}

function upperHex(bytes) {
  return toHex(bytes).toUpperCase();
}

/**
 * The `handle-wire` output list, version 5, of a call with `batch`,
 * decoded and turned into the messages a host sends ("Building the MQTT
 * messages"), in comparable form. A last `more` output (tag 5) is returned
 * as `{ more: handled }` after the list: `{ outputs, more }`. A spliced
 * journal record (tag 6) takes its middle from `batch`.
 */
function decodeOutputs(bytes, batch) {
  const r = new Reader(bytes);
  const version = r.u8('outputs version');
  if (version !== OUTPUTS_VERSION) throw new WireError(`output list version ${version}, not ${OUTPUTS_VERSION}`);
  const n = r.count(1, 'outputs');
  const out = [];
  let more;
  let previousNotify; // {key, payload, timestamp, sourceId} of the last notify in this list
  for (let i = 0; i < n; i++) {
    const what = `output ${i}`;
    const at = r.pos;
    const tag = r.u8(`${what} tag`);
    switch (tag) {
      case 1: {
        out.push(canonJournal(r.bytes(`${what} journal record`)));
        break;
      }
      case 6: {
        const head = r.bytes(`${what} spliced record head`);
        const offset = r.u32(`${what} spliced record offset`);
        const length = r.u32(`${what} spliced record length`);
        const tail = r.bytes(`${what} spliced record tail`);
        if (offset + length > batch.length) throw new WireError(`${what} at offset ${at}: a spliced record names bytes past its batch`);
        const record = new Uint8Array(head.length + length + tail.length);
        record.set(head, 0);
        record.set(batch.subarray(offset, offset + length), head.length);
        record.set(tail, head.length + length);
        out.push(canonJournal(record));
        break;
      }
      case 2: {
        const clientId = r.opt(r.str, `${what} violation client-id`);
        const reason = r.str(`${what} violation reason`);
        out.push(canonViolation(clientId, reason));
        break;
      }
      case 3: {
        const topic = r.str(`${what} reply topic`);
        const correlationData = r.opt(r.bytes, `${what} reply correlation-data`);
        const messageExpiryInterval = r.opt(r.u32, `${what} reply message-expiry-interval`);
        const status = r.u16(`${what} reply status`);
        const payload = r.bytes(`${what} reply payload`);
        const timestamp = r.opt(r.str, `${what} reply timestamp`);
        const sourceId = r.opt(r.str, `${what} reply source-id`);
        const extra = r.props(`${what} reply extra`);
        const userProperties = [
          { name: '__stat', value: String(status) },
          { name: '__protVer', value: '1.0' },
        ];
        if (timestamp !== undefined) userProperties.push({ name: '__ts', value: timestamp });
        userProperties.push(...extra);
        if (sourceId !== undefined) userProperties.push({ name: '__srcId', value: sourceId });
        userProperties.push({ name: '$high_priority', value: '' });
        out.push(canonPublish({
          kind: 'response',
          topic,
          payload,
          qos: 1,
          retain: false,
          correlationData,
          messageExpiryInterval,
          contentType: CONTENT_TYPE,
          payloadFormatIndicator: 0,
          responseTopic: undefined,
          userProperties,
          targetClient: undefined,
        }));
        break;
      }
      case 4: {
        const targetClient = r.str(`${what} notify target-client`);
        const formAt = r.pos;
        const form = r.u8(`${what} notify form`);
        let change;
        if (form === 0) {
          const key = r.bytes(`${what} notify key`);
          const payload = r.bytes(`${what} notify payload`);
          const timestamp = r.str(`${what} notify timestamp`);
          const sourceId = r.opt(r.str, `${what} notify source-id`);
          change = { key, payload, timestamp, sourceId };
        } else if (form === 1) {
          if (previousNotify === undefined) throw new WireError(`${what} at offset ${formAt}: notify form 1 with no notify before it`);
          change = previousNotify;
        } else {
          throw new WireError(`${what} at offset ${formAt}: notify form ${form}`);
        }
        previousNotify = change;
        const userProperties = [
          { name: '__ts', value: change.timestamp },
          { name: '__protVer', value: '1.0' },
        ];
        if (change.sourceId !== undefined) userProperties.push({ name: '__srcId', value: change.sourceId });
        out.push(canonPublish({
          kind: 'notification',
          topic: `${NOTIFY_PREFIX}${upperHex(strBytes(targetClient))}/command/notify/${upperHex(change.key)}`,
          payload: change.payload,
          qos: 1,
          retain: false,
          correlationData: undefined,
          messageExpiryInterval: undefined,
          contentType: CONTENT_TYPE,
          payloadFormatIndicator: 0,
          responseTopic: undefined,
          userProperties,
          targetClient,
        }));
        break;
      }
      case 5: {
        more = r.u32(`${what} more handled`);
        if (i !== n - 1) throw new WireError(`${what} at offset ${at}: more is not the last output`);
        break;
      }
      default:
        throw new WireError(`${what} at offset ${at}: output tag ${tag}`);
    }
  }
  r.end('output list');
  return { outputs: out, more };
}

// ---------------------------------------------------------------- the component

let instanceCount = 0;

/** Imports the transpiled component; a fresh instance each time (after a trap). */
async function loadComponent(js = componentJs) {
  const url = pathToFileURL(js);
  if (instanceCount++ > 0) url.search = `?instance=${instanceCount}`;
  const mod = await import(url.href);
  const api = mod.store ?? mod['statestore:core/store@0.6.0'];
  if (!api || typeof api.Store !== 'function') {
    throw new Error(`${js} exports no \`store\` interface with a Store resource (exports: ${Object.keys(mod).join(', ')})`);
  }
  return api;
}

/** The load-time check of WIRE.md: the formats, or {refused: why}. */
function checkFormats(api, js) {
  if (typeof api.formats !== 'function') {
    return { refused: `${js} has no formats() (not statestore:core/store@0.6.0?)` };
  }
  const f = api.formats();
  const batchVersions = Array.from(f.batchVersions ?? []);
  if (!batchVersions.includes(BATCH_VERSION) || f.outputsVersion !== OUTPUTS_VERSION) {
    return { refused: `the component accepts batch versions [${batchVersions}] and returns output list version ${f.outputsVersion}; this replayer writes batch version ${BATCH_VERSION} and reads output list version ${OUTPUTS_VERSION}` };
  }
  return { ...f, batchVersions };
}

function errorText(e) {
  if (e && typeof e === 'object' && 'payload' in e && e.payload && typeof e.payload === 'object' && 'tag' in e.payload) {
    return `error.${e.payload.tag}(${JSON.stringify(e.payload.val, (_, v) => (typeof v === 'bigint' ? String(v) : v))})`;
  }
  if (e instanceof WireError) return `wire: ${e.message}`;
  return `${e && e.name ? e.name + ': ' : ''}${e && e.message !== undefined ? e.message : String(e)}`;
}

function typedConfig(config, seed) {
  return {
    nodeId: config.nodeId,
    serverClientId: config.serverClientId,
    persist: config.persist,
    hashSeed: seed,
    quota: { ...config.quota },
    persistKeys: config.persistKeys,
    scanPage: { ...config.scanPage },
    sdkResponseTopics: config.sdkResponseTopics ?? false,
    authorization: config.authorization,
  };
}

/** Typed door: the inputs as WIT `input` variants, the outputs back in comparable form. */
const typedDoor = {
  name: 'typed',
  seed: SEED_TYPED,
  handle(store, inputs, now) {
    const typed = inputs.map((input) => {
      if (input.kind === 'publish') return { tag: 'message', val: { ...input.message } };
      if (input.kind === 'disconnect') return { tag: 'disconnected', val: input.clientId };
      if (input.kind === 'disconnect-via') return { tag: 'disconnected-via', val: { clientId: input.clientId, via: input.via } };
      if (input.kind === 'replica-started') return { tag: 'replica-started', val: input.via };
      throw new Error(`no typed input for a ${input.kind}`);
    });
    const outputs = store.handle(typed, now);
    if (!Array.isArray(outputs)) throw new Error(`handle returned ${typeof outputs}, not a list`);
    return outputs.map((o, i) => {
      switch (o.tag) {
        case 'publish': return canonPublish(o.val);
        case 'journal': return canonJournal(o.val);
        case 'violation': return canonViolation(o.val.clientId, o.val.reason);
        default: throw new Error(`output ${i}: unknown variant ${JSON.stringify(o.tag)}`);
      }
    });
  },
};

/** Wire door: this file's codec around `handle-wire`. */
const wireDoor = {
  name: 'wire',
  seed: SEED_WIRE,
  handle(store, inputs, now) {
    // A call may stop early (`more`: it handled the first n inputs): call
    // again with the rest. After a call with no inputs, `more` says more is
    // due now, which `next-deadline` says too.
    const all = [];
    let rest = inputs;
    for (;;) {
      const batch = encodeBatch(rest);
      const result = store.handleWire(batch, now);
      if (!(result instanceof Uint8Array)) throw new Error(`handle-wire returned ${typeof result}, not bytes`);
      const { outputs, more } = decodeOutputs(result, batch);
      all.push(...outputs);
      if (more === undefined || rest.length === 0) return all;
      if (more < 1 || more > rest.length) throw new WireError(`more ${more} of ${rest.length} inputs`);
      rest = rest.slice(more);
      if (rest.length === 0) return all;
    }
  },
};

function dispose(store) {
  if (store && typeof store[Symbol.dispose] === 'function') {
    try { store[Symbol.dispose](); } catch { /* already gone */ }
  }
}

/**
 * Replays `vector` through `door` on a fresh store. Returns the actual result
 * of every step reached, and the error that stopped the run, if any.
 */
function runDoor(api, vector, door) {
  const config = typedConfig(vector.config, door.seed);
  const actual = [];
  let store;
  try {
    store = new api.Store(config);
    for (const step of vector.steps) {
      let outputs = [];
      if (step.input.kind === 'restore') {
        const snapshot = store.snapshot('everything');
        if (door === wireDoor) {
          // In parts (small ones, so that items are cut): the same bytes,
          // and a restore from pieces that cut items anywhere.
          const parts = [];
          for (let start = true; ; start = false) {
            const part = store.snapshotPart('everything', start, 64);
            if (part.length === 0) break;
            parts.push(part);
          }
          if (!Buffer.from(snapshot).equals(Buffer.concat(parts))) {
            throw new Error('a snapshot in parts differs from the snapshot in one piece');
          }
          dispose(store);
          store = undefined;
          const restoring = api.Restoring.begin(config);
          for (let i = 0; i < snapshot.length; i += 13) restoring.feed(snapshot.subarray(i, i + 13));
          store = api.Restoring.finish(restoring);
        } else {
          dispose(store);
          store = undefined;
          store = api.Store.restore(config, snapshot);
        }
      } else {
        const inputs = step.input.kind === 'timeout' ? [] : [step.input];
        outputs = door.handle(store, inputs, step.now);
      }
      actual.push({ outputs, deadline: canonDeadline(store.nextDeadline()) });
    }
    return { actual, error: undefined };
  } catch (e) {
    return { actual, error: errorText(e), trapped: !(e instanceof WireError) && !(e !== null && typeof e === 'object' && 'payload' in e) };
  } finally {
    dispose(store);
  }
}

// ---------------------------------------------------------------- comparison

function show(v) {
  if (typeof v === 'string' && /^([0-9a-f]{2})+$/.test(v) && v.length > 0) {
    const b = Buffer.from(v, 'hex');
    let text;
    try { text = utf8Strict.decode(b); } catch { text = undefined; }
    return text !== undefined && /^[\x20-\x7e\r\n\t]*$/.test(text) && text.length > 0
      ? `${JSON.stringify(v)} (${JSON.stringify(text)})` : JSON.stringify(v);
  }
  return JSON.stringify(v);
}

/** The first difference between two comparable values, or null. */
function diff(expected, actual, path) {
  if (Array.isArray(expected) || Array.isArray(actual)) {
    if (!Array.isArray(expected) || !Array.isArray(actual)) {
      return `${path}: expected ${show(expected)}, got ${show(actual)}`;
    }
    const n = Math.min(expected.length, actual.length);
    for (let i = 0; i < n; i++) {
      const d = diff(expected[i], actual[i], `${path}[${i}]`);
      if (d) return d;
    }
    if (expected.length !== actual.length) {
      const extra = expected.length > actual.length
        ? `missing ${show(expected[n])}` : `extra ${show(actual[n])}`;
      return `${path}: expected ${expected.length} items, got ${actual.length} (${extra})`;
    }
    return null;
  }
  if (expected !== null && actual !== null && typeof expected === 'object' && typeof actual === 'object') {
    const ek = Object.keys(expected);
    const ak = Object.keys(actual);
    if (ek.join(',') !== ak.join(',')) {
      return `${path}: expected ${ek.join('/')} ${show(expected)}, got ${ak.join('/')} ${show(actual)}`;
    }
    for (const k of ek) {
      const d = diff(expected[k], actual[k], path ? `${path}.${k}` : k);
      if (d) return d;
    }
    return null;
  }
  return Object.is(expected, actual) ? null : `${path}: expected ${show(expected)}, got ${show(actual)}`;
}

function stepLabel(vector, i) {
  const s = vector.steps[i];
  return `step ${i} (${s.input.kind} @${s.now})`;
}

/** The first difference of step i, or null. */
function diffStep(vector, i, expected, actual) {
  const d = diff(expected.outputs, actual.outputs, 'outputs')
    ?? diff(expected.deadline, actual.deadline, 'next_deadline');
  return d ? `${stepLabel(vector, i)}: ${d}` : null;
}

/** The first difference of a whole run, or null. */
function diffRun(vector, expectedSteps, run) {
  for (let i = 0; i < expectedSteps.length; i++) {
    if (i >= run.actual.length) return `${stepLabel(vector, i)}: ${run.error ?? 'not run'}`;
    const d = diffStep(vector, i, expectedSteps[i], run.actual[i]);
    if (d) return d;
  }
  return run.error ? `after the last step: ${run.error}` : null;
}

// ---------------------------------------------------------------- tamper self-check

/** Paths to every leaf of a comparable output that can carry a changed byte. */
function leaves(v, path, into) {
  if (Array.isArray(v)) {
    v.forEach((x, i) => leaves(x, [...path, i], into));
  } else if (v !== null && typeof v === 'object') {
    for (const k of Object.keys(v)) leaves(v[k], [...path, k], into);
  } else if ((typeof v === 'string' && v.length > 0) || typeof v === 'number' || typeof v === 'boolean') {
    into.push(path);
  }
  return into;
}

const HEX_FIELDS = new Set(['payload', 'correlation_data', 'journal']);

/** Changes one byte (or value) of the leaf at `path` of `root`, in place; describes it. */
function tamperLeaf(root, path, pick) {
  let parent = root;
  for (const k of path.slice(0, -1)) parent = parent[k];
  const key = path[path.length - 1];
  const v = parent[key];
  const where = path.map((k) => (typeof k === 'number' ? `[${k}]` : `.${k}`)).join('').replace(/^\./, '');
  if (typeof v === 'number') { parent[key] = v ^ 1; return `${where} ${v} -> ${parent[key]}`; }
  if (typeof v === 'boolean') { parent[key] = !v; return `${where} ${v} -> ${parent[key]}`; }
  if (HEX_FIELDS.has(key)) {
    const b = Buffer.from(v, 'hex');
    const at = pick % b.length;
    b[at] ^= 0x01;
    parent[key] = b.toString('hex');
    return `${where} byte ${at}`;
  }
  const b = Buffer.from(v, 'utf8');
  const at = pick % b.length;
  b[at] = b[at] < 0x80 ? b[at] ^ 0x01 : 0x3f; // stays valid UTF-8 when ASCII
  parent[key] = b.toString('utf8');
  return `${where} byte ${at}`;
}

/** The vector's expected steps with one byte changed, and what was changed. */
function tampered(vector, index) {
  const steps = vector.steps.map((s) => ({ outputs: structuredClone(s.outputs), deadline: s.deadline }));
  const withOutputs = steps.map((s, i) => i).filter((i) => steps[i].outputs.length > 0);
  if (withOutputs.length === 0) {
    const i = steps.length - 1;
    const before = steps[i].deadline;
    steps[i].deadline = before === null ? '0' : String(BigInt(before) + 1n);
    return { steps, step: i, what: `next_deadline ${before} -> ${steps[i].deadline}` };
  }
  const i = withOutputs[index % withOutputs.length];
  const outputs = steps[i].outputs;
  const j = index % outputs.length;
  const paths = leaves(outputs[j], [], []);
  const path = paths[(index * 5) % paths.length];
  const what = `outputs[${j}].${tamperLeaf(outputs[j], path, index)}`;
  return { steps, step: i, what };
}

// ---------------------------------------------------------------- panic check

const PANIC_MESSAGE = 'deliberate fault: SET __fault/trap';
const PANIC_NOW = 1700000000000n;
const REQUEST_TOPIC = 'statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke';
const RESPONSE_TOPIC = 'clients/c1/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response';

/** A RESP3 array of bulk strings. */
function resp(...args) {
  return `*${args.length}\r\n${args.map((a) => `$${strBytes(a).length}\r\n${a}\r\n`).join('')}`;
}

/** A full, valid request envelope from client c1, as the vectors send them. */
function request(n, ...args) {
  const correlationData = new Uint8Array(16);
  correlationData[15] = n;
  return {
    kind: 'publish',
    message: {
      topic: REQUEST_TOPIC,
      payload: strBytes(resp(...args)),
      qos: 1,
      responseTopic: RESPONSE_TOPIC,
      correlationData,
      messageExpiryInterval: 10,
      contentType: CONTENT_TYPE,
      payloadFormatIndicator: 0,
      userProperties: [
        { name: '__ts', value: `00${PANIC_NOW}:0000${n}:c1` },
        { name: '__protVer', value: '1.0' },
        { name: '__srcId', value: 'c1' },
      ],
      clientId: undefined,
      receivedAt: undefined,
      username: undefined,
      attributes: [],
      via: undefined,
    },
  };
}

/** Sends one request through `handle-wire`; its reply, checked to be a 200 on our envelope. */
function expectReply(store, req, label) {
  const batch = encodeBatch([req]);
  const { outputs } = decodeOutputs(store.handleWire(batch, PANIC_NOW), batch);
  if (outputs.length !== 1 || !outputs[0].publish || outputs[0].publish.kind !== 'response') {
    throw new Error(`${label}: expected one reply, got ${JSON.stringify(outputs)}`);
  }
  const p = outputs[0].publish;
  const stat = p.user_properties.find(([name]) => name === '__stat');
  if (p.topic !== RESPONSE_TOPIC || p.correlation_data !== toHex(req.message.correlationData) || !stat || stat[1] !== '200') {
    throw new Error(`${label}: not a 200 reply to this request: ${JSON.stringify(p)}`);
  }
  return Buffer.from(p.payload, 'hex').toString('latin1');
}

/**
 * A SET of a value of 64 KiB or more is journaled by reference to its batch
 * (output tag 6, the record spliced from the batch here): the record this
 * codec rebuilds must be, byte for byte, the one the typed door returns
 * for the same request on another store, and must replay into a third
 * store that then answers the value back. Returns an error text or null.
 */
function largeValueCheck(api) {
  const config = typedConfig({ nodeId: 'StateStore', serverClientId: 'statestore', persist: 'all', quota: {}, persistKeys: [], scanPage: { maxKeys: 1000, maxBytes: 256 * 1024 } }, SEED_WIRE);
  const value = 'v'.repeat(70000);
  const set = request(1, 'SET', 'big', value);
  const stores = [];
  try {
    const wired = new api.Store(config);
    stores.push(wired);
    const batch = encodeBatch([set]);
    const raw = handleWireChecked(wired, batch);
    if (raw.length >= value.length) return `the SET's output list is ${raw.length} bytes: the value was copied into it`;
    const { outputs } = decodeOutputs(raw, batch);
    const typed = new api.Store(config);
    stores.push(typed);
    const want = typedDoor.handle(typed, [set], PANIC_NOW);
    if (JSON.stringify(outputs) !== JSON.stringify(want)) return `wire outputs ${JSON.stringify(outputs).slice(0, 200)} differ from typed ${JSON.stringify(want).slice(0, 200)}`;
    const record = outputs.find((o) => o.journal !== undefined);
    if (!record) return 'no journal record';
    const replayed = new api.Store(config);
    stores.push(replayed);
    replayed.replay([Uint8Array.from(Buffer.from(record.journal, 'hex'))]);
    const got = expectReply(replayed, request(2, 'GET', 'big'), 'GET big after replay');
    if (got !== `$${value.length}\r\n${value}\r\n`) return `GET big after replay: ${got.length} bytes, not the value`;
    return null;
  } catch (e) {
    return errorText(e);
  } finally {
    stores.forEach(dispose);
  }
}

function handleWireChecked(store, batch) {
  const raw = store.handleWire(batch, PANIC_NOW);
  if (!(raw instanceof Uint8Array)) throw new Error(`handle-wire returned ${typeof raw}, not bytes`);
  return raw;
}

/**
 * The child side (--panic-child): one line per step on stdout; exit code 0
 * only if the load worked and SET __fault/trap trapped. What the guest prints
 * goes to this process's stderr, through the shim.
 */
async function panicChild(js) {
  let store;
  try {
    const api = await loadComponent(js);
    const f = checkFormats(api, js);
    if (f.refused) throw new Error(`refused: ${f.refused}`);
    store = new api.Store(typedConfig({ nodeId: 'StateStore', serverClientId: 'statestore', persist: 'none', quota: {}, persistKeys: [], scanPage: { maxKeys: 1000, maxBytes: 256 * 1024 } }, SEED_WIRE));

    const miss = expectReply(store, request(1, 'GET', 'k'), 'GET k');
    if (miss !== '$-1\r\n') throw new Error(`GET k on a fresh store: ${JSON.stringify(miss)}, not "$-1\\r\\n"`);
    console.log(`GET k on a fresh store: 200 ${JSON.stringify(miss)}`);
    const build = expectReply(store, request(2, 'GET', '__fault/build'), 'GET __fault/build');
    if (build !== '$15\r\nfault-injection\r\n') {
      throw new Error(`GET __fault/build: ${JSON.stringify(build)}: not a build with the fault-injection feature`);
    }
    console.log(`GET __fault/build: 200 ${JSON.stringify(build)}`);
  } catch (e) {
    console.log(`FAIL before the fault: ${errorText(e)}`);
    return 1;
  }

  try {
    const result = store.handleWire(encodeBatch([request(3, 'SET', '__fault/trap', 'x')]), PANIC_NOW);
    console.log(`FAIL SET __fault/trap x did not trap: it returned ${result instanceof Uint8Array ? `${result.length} bytes` : typeof result}`);
    return 1;
  } catch (e) {
    if (!(e instanceof WebAssembly.RuntimeError)) {
      console.log(`FAIL SET __fault/trap x threw, but not a trap: ${errorText(e)}`);
      return 1;
    }
    console.log(`SET __fault/trap x trapped: ${errorText(e)}`);
    return 0;
  }
}

/** The parent side (--panic-check): runs the child, checks its exit and its stderr. */
function panicCheck(js) {
  console.log(`panic check: ${js}`);
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--panic-child', js], {
    encoding: 'utf8',
    timeout: 120_000,
  });
  const lines = (text) => (text ?? '').split('\n').map((l) => l.trimEnd()).filter((l) => l.length > 0);
  for (const line of lines(child.stdout)) console.log(`panic check: ${line}`);
  for (const line of lines(child.stderr).slice(0, 20)) console.log(`panic check: stderr: ${line}`);
  let why;
  if (child.error) {
    why = `the child process: ${child.error.message}`;
  } else if (child.status !== 0) {
    why = child.signal ? `the child was killed by ${child.signal}` : `the child exited ${child.status}`;
  } else if (!(child.stderr ?? '').includes(PANIC_MESSAGE)) {
    why = `the call trapped, but ${JSON.stringify(PANIC_MESSAGE)} is not on stderr`;
  }
  if (why) {
    console.log(`panic check: FAILED: ${why}`);
    return false;
  }
  console.log('panic check: message printed');
  return true;
}

// ---------------------------------------------------------------- main

async function main() {
  if (panicChildJs !== undefined) process.exit(await panicChild(panicChildJs));
  const panicOk = panicCheckJs === undefined || panicCheck(panicCheckJs);
  if (vectorsDir === undefined) process.exit(panicOk ? 0 : 1);

  let api = await loadComponent();

  const f = checkFormats(api, componentJs);
  if (f.refused) {
    console.error(`refused: ${f.refused}`);
    process.exit(2);
  }
  console.log(`component ${componentJs}: batch versions [${f.batchVersions}], outputs ${f.outputsVersion}, snapshot ${f.snapshotVersion}, record ${f.recordVersion}`);

  const files = readdirSync(vectorsDir).filter((n) => n.endsWith('.json')).sort();
  let passed = 0;
  let failed = 0;
  const large = largeValueCheck(api);
  if (large === null) {
    passed += 1;
    console.log('large value: journaled by reference to its batch, spliced, replayed: ok');
  } else {
    failed += 1;
    console.log(`FAIL large value: ${large}`);
  }
  let tamperTotal = 0;
  let tamperDetected = 0;

  for (const [index, file] of files.entries()) {
    let vector;
    try {
      vector = parseVector(join(vectorsDir, file));
    } catch (e) {
      console.log(`FAIL ${file}: bad vector: ${e.message}`);
      failed += 2;
      tamperTotal += 1;
      console.log(`TAMPER MISSED ${file}: the vector does not parse`);
      continue;
    }

    const runs = [];
    for (const door of [typedDoor, wireDoor]) {
      const run = runDoor(api, vector, door);
      runs.push(run);
      const d = diffRun(vector, vector.steps, run);
      if (d) {
        failed += 1;
        console.log(`FAIL ${vector.name} [${door.name}]: ${d}`);
      } else {
        passed += 1;
      }
      if (run.trapped) api = await loadComponent(); // a trapped instance is not to be trusted
    }

    // Tamper: the changed expectation must differ from what each door produced at that step.
    tamperTotal += 1;
    const t = tampered(vector, index);
    const checked = runs.filter((run) => run.actual.length > t.step);
    const missed = checked.filter((run) => diffStep(vector, t.step, t.steps[t.step], run.actual[t.step]) === null);
    if (checked.length > 0 && missed.length === 0) {
      tamperDetected += 1;
    } else {
      const why = checked.length === 0 ? 'no door reached that step' : 'the comparison saw no difference';
      console.log(`TAMPER MISSED ${vector.name}: step ${t.step} ${t.what}: ${why}`);
    }
  }

  console.log(`tampered: ${tamperDetected} of ${tamperTotal} detected`);
  console.log(`${passed} passed, ${failed} failed`);
  const ok = failed === 0 && passed > 0 && tamperDetected === tamperTotal;
  process.exit(ok && panicOk ? 0 : 1);
}

main().catch((e) => {
  console.error(`replay.mjs: ${e && e.stack ? e.stack : e}`);
  process.exit(2);
});
