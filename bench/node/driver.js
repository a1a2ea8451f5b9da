// qlobber-fsq 14 (and its matcher, qlobber) as a benchmark child: node driver.js ROLE PARAMS_JSON
// Speaks the harness protocol of bench/child.py: READY, COUNT n, RESULT {json}; STOP on stdin.
// Times are process.hrtime.bigint(): CLOCK_MONOTONIC, the clock Python's time.monotonic_ns reads.
'use strict';

const fs = require('fs');
const { QlobberFSQ } = require('qlobber-fsq');
const { QlobberDedup } = require('qlobber');

const ID_WIDTH = 8;
const TS_WIDTH = 20;
const role = process.argv[2];
const p = JSON.parse(process.argv[3]);
const now = () => process.hrtime.bigint();

function emit(line) { process.stdout.write(line + '\n'); }
function result(obj) {
  emit('RESULT ' + JSON.stringify(obj, (k, v) => (typeof v === 'bigint' ? v.toString() : v)));
}
function payload(i, size) {
  const head = String(i).padStart(ID_WIDTH, '0');
  return Buffer.from(head + 'x'.repeat(Math.max(0, size - head.length)), 'latin1');
}
function ping(i, size) {
  const head = String(i).padStart(ID_WIDTH, '0') + now().toString().padStart(TS_WIDTH, '0');
  return Buffer.from(head + 'x'.repeat(Math.max(0, size - head.length)), 'latin1');
}
function open() {
  const fsq = new QlobberFSQ({ fsq_dir: p.dir });
  fsq.on('error', (err) => { console.error(err); process.exit(2); });
  return fsq;
}
function finish(fsq, obj) {
  fsq.stop_watching(() => { result(obj); process.exit(0); });
}

// publish n messages keeping `window` publishes in flight (Node's natural asynchronous style)
function publishAll(fsq, opts, done) {
  const n = p.n, window = p.window || 64;
  let next = 0, finished = 0;
  const t0 = now();
  const one = () => {
    const i = next++;
    fsq.publish('bench.topic', payload(i, p.size), opts, (err) => {
      if (err) { console.error(err); process.exit(2); }
      finished += 1;
      if (next < n) one();
      else if (finished === n) done(t0, now());
    });
  };
  for (let k = 0; k < Math.min(window, n); k += 1) one();
  return t0;
}

function consume(single) {
  const fsq = open();
  const ids = [];
  let first = 0n, last = 0n, reported = -1, stopped = false;
  const expect = p.expect;
  const end = () => {
    if (stopped) return;
    stopped = true;
    finish(fsq, { ids, first_ns: first, last_ns: last });
  };
  const handler = (data, info, done) => {
    const t = now();
    if (!ids.length) first = t;
    last = t;
    ids.push(parseInt(data.toString('latin1', 0, ID_WIDTH), 10));
    if (single) done(); else if (done) done();
    if (expect && ids.length >= expect) end();
  };
  fsq.on('start', () => {
    fsq.subscribe('bench.topic', handler, () => emit('READY'));
  });
  setInterval(() => { if (ids.length !== reported) { reported = ids.length; emit('COUNT ' + reported); } }, 20);
  process.stdin.on('data', (d) => { if (d.toString().includes('STOP')) end(); });
  process.stdin.on('end', end);
}

const roles = {
  pub() {
    const fsq = open();
    fsq.on('start', () => {
      publishAll(fsq, { single: !!p.single }, (t0, t1) => finish(fsq, { t0_ns: t0, t1_ns: t1 }));
    });
  },
  sub() { consume(false); },
  worker() { consume(true); },
  echo() {
    const fsq = open();
    fsq.on('start', () => {
      fsq.subscribe('bench.ping', (data, info, done) => {
        const recv = now().toString().padStart(TS_WIDTH, '0');
        fsq.publish('bench.pong', Buffer.concat([Buffer.from(recv, 'latin1'), data]), { single: !!p.single });
        if (done) done();
      }, () => emit('READY'));
    });
    process.stdin.on('data', () => fsq.stop_watching(() => process.exit(0)));
    process.stdin.on('end', () => fsq.stop_watching(() => process.exit(0)));
  },
  ping() {
    const fsq = open();
    const rtt = [], oneway = [];
    let i = 0;
    const send = () => fsq.publish('bench.ping', ping(i, p.size), { single: !!p.single });
    fsq.on('start', () => {
      fsq.subscribe('bench.pong', (data, info, done) => {
        const t = now();
        const recv = BigInt(data.toString('latin1', 0, TS_WIDTH));
        const sent = BigInt(data.toString('latin1', TS_WIDTH + ID_WIDTH, TS_WIDTH + ID_WIDTH + TS_WIDTH));
        rtt.push(t - sent);
        oneway.push(recv - sent);
        if (done) done();
        i += 1;
        if (i >= p.n) finish(fsq, { rtt_ns: rtt, oneway_ns: oneway });
        else send();
      }, send);
    });
  },
  // one process: subscribed, publishing n messages with `window` in flight (50); end to end
  inprocess() {
    const fsq = open();
    const ids = [];
    const single = !!p.single;
    let t0 = 0n, last = 0n, published = 0n, ended = false;
    const check = () => {
      if (!ended && published && ids.length >= p.n) {
        ended = true;
        finish(fsq, { ids, t0_ns: t0, last_ns: last, published_ns: published });
      }
    };
    fsq.on('start', () => {
      fsq.subscribe('bench.topic', (data, info, done) => {
        last = now();
        ids.push(parseInt(data.toString('latin1', 0, ID_WIDTH), 10));
        if (done) done();
        check();
      }, () => {
        t0 = publishAll(fsq, { single }, (_a, b) => { published = b; check(); });
      });
    });
  },
  // one process: the ping and the echo subscribed side by side; round trip, one at a time
  inprocess_ping() {
    const fsq = open();
    const rtt = [];
    let i = 0;
    const send = () => fsq.publish('bench.ping', ping(i, p.size));
    fsq.on('start', () => {
      fsq.subscribe('bench.ping', (data, info, done) => {
        fsq.publish('bench.pong', data);
        if (done) done();
      }, () => {
        fsq.subscribe('bench.pong', (data, info, done) => {
          const t = now();
          rtt.push(t - BigInt(data.toString('latin1', ID_WIDTH, ID_WIDTH + TS_WIDTH)));
          if (done) done();
          i += 1;
          if (i >= p.n) finish(fsq, { rtt_ns: rtt });
          else send();
        }, send);
      });
    });
  },
  match() {
    const data = JSON.parse(fs.readFileSync(p.file, 'utf8'));
    const q = new QlobberDedup({ separator: '.', wildcard_one: '*', wildcard_some: '#' });
    const a0 = now();
    data.bindings.forEach((b, k) => q.add(b, k));
    const a1 = now();
    let matches = 0;
    const t0 = now();
    for (const t of data.topics) matches += q.match(t).size;
    const t1 = now();
    result({ seconds: Number(t1 - t0) / 1e9, add_seconds: Number(a1 - a0) / 1e9, matches });
  },
};

roles[role]();
